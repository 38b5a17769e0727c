package main

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/kadmit/kadmit/test/cluster/image"
	"github.com/kadmit/kadmit/test/deploy/realcluster"
)

// foreignController is another project's webhook as the field installs
// it: a Deployment of image.ForeignRef serving a certificate for its
// Service's DNS name, the Service, and a MutatingWebhookConfiguration for
// pod CREATEs with failurePolicy Fail.
type foreignController struct {
	Namespace string
	Name      string // Deployment name; the Secret is <Name>-cert
	Service   string
	Webhook   string // the webhook's name in the configuration
	// Labels go on the pods; Selector is the Service's selector (the seed
	// 001 collision: both are just control-plane: controller-manager).
	Labels, Selector map[string]string
	// WebhookNamespaces are the namespaces the webhook intercepts (by
	// kubernetes.io/metadata.name), so the demo never blocks the rest of
	// the cluster; none: no webhook configuration is registered.
	WebhookNamespaces []string
}

// install creates the controller's Secret, Deployment (one replica) and
// Service; register adds the webhook configuration, as the controllers of
// the seeds do once they run.
func (f foreignController) install(ctx context.Context, d *demo, authority *realcluster.CA) error {
	cs := d.c.Client
	certPEM, keyPEM, err := authority.Serving(f.Service+"."+f.Namespace+".svc", f.Service+"."+f.Namespace+".svc.cluster.local")
	if err != nil {
		return err
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: f.Name + "-cert", Namespace: f.Namespace},
		Type:       corev1.SecretTypeTLS,
		Data:       map[string][]byte{"tls.crt": certPEM, "tls.key": keyPEM},
	}
	if _, err := cs.CoreV1().Secrets(f.Namespace).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("secret %s/%s: %w", f.Namespace, secret.Name, err)
	}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: f.Name, Namespace: f.Namespace, Labels: f.Labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: f.Labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: f.Labels},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: ptr.To[int64](2),
					Containers: []corev1.Container{{
						Name: "manager", Image: image.ForeignRef, ImagePullPolicy: corev1.PullNever,
						Args:  []string{"--cert-dir", "/certs", "--port", "9443", "--health-port", "8081", "--name", f.Name},
						Ports: []corev1.ContainerPort{{Name: "webhook-server", ContainerPort: 9443}},
						ReadinessProbe: &corev1.Probe{
							ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/readyz", Port: intstr.FromInt32(8081)}},
							PeriodSeconds: 1,
						},
						VolumeMounts: []corev1.VolumeMount{{Name: "cert", MountPath: "/certs", ReadOnly: true}},
					}},
					Volumes: []corev1.Volume{{Name: "cert", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: secret.Name}}}},
				},
			},
		},
	}
	if _, err := cs.AppsV1().Deployments(f.Namespace).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("deployment %s/%s: %w", f.Namespace, f.Name, err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: f.Service, Namespace: f.Namespace},
		Spec: corev1.ServiceSpec{
			Selector: f.Selector,
			Ports:    []corev1.ServicePort{{Port: 443, TargetPort: intstr.FromString("webhook-server")}},
		},
	}
	if _, err := cs.CoreV1().Services(f.Namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("service %s/%s: %w", f.Namespace, f.Service, err)
	}
	return nil
}

// register creates the webhook configuration (none without
// WebhookNamespaces).
func (f foreignController) register(ctx context.Context, d *demo, authority *realcluster.CA) error {
	if len(f.WebhookNamespaces) == 0 {
		return nil
	}
	cfg := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: f.Name},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name: f.Webhook,
			ClientConfig: admissionregistrationv1.WebhookClientConfig{
				Service:  &admissionregistrationv1.ServiceReference{Namespace: f.Namespace, Name: f.Service, Path: ptr.To("/mutate-v1-pod")},
				CABundle: authority.PEM,
			},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
			}},
			NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
				Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpIn, Values: f.WebhookNamespaces,
			}}},
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
			TimeoutSeconds:          ptr.To[int32](10),
		}},
	}
	if _, err := d.c.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, cfg, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("mutatingwebhookconfiguration %s: %w", f.Name, err)
	}
	return nil
}

// waitReady waits until the controller's Deployment has its replica Ready.
func (f foreignController) waitReady(ctx context.Context, d *demo) error {
	return waitFor(ctx, 60*time.Second, func() (bool, error) {
		dep, err := d.c.Client.AppsV1().Deployments(f.Namespace).Get(ctx, f.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return dep.Status.ReadyReplicas == 1, fmt.Errorf("%s/%s: %d/1 Ready", f.Namespace, f.Name, dep.Status.ReadyReplicas)
	})
}

func (d *demo) namespace(ctx context.Context, name string) error {
	_, err := d.c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("namespace %s: %w", name, err)
	}
	return nil
}

// runCmd runs a program and returns its combined output.
func runCmd(ctx context.Context, name string, args ...string) (string, error) {
	var b bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = &b, &b
	err := cmd.Run()
	return b.String(), err
}
