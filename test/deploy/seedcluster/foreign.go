// Package seedcluster reproduces the seed failures (the field reports kadmit
// was started from) on a real cluster (package cluster: kubelets, kube-proxy,
// containerd), with "another controller's webhook" (image.Foreign) set up
// the way those controllers ship, and proves kadmit's chart immune to them.
//
// This file holds the fixtures: a certificate authority for the foreign
// webhooks, and a foreign controller (Secret, Deployment, Service) laid out
// as a kubebuilder project's manifests lay it out: pods labelled
// control-plane: controller-manager, a container port named webhook-server,
// readiness on /readyz, a Service whose targetPort is that name.
package seedcluster

import (
	"context"
	"fmt"
	"strconv"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/kadmit/kadmit/test/cluster/image"
	"github.com/kadmit/kadmit/test/deploy/realcluster"
	"github.com/kadmit/kadmit/test/poll"
)

// WebhookPortName is the container port name the foreign Services target:
// kubebuilder's default. A pod without a port of that name gets no traffic
// from such a Service (the endpoint-slice controller resolves a named
// targetPort per pod), which is why a colliding workload must carry it too
// to be routed to.
const WebhookPortName = "webhook-server"

// Foreign is another controller's webhook: a Deployment of image.ForeignRef
// serving a certificate for Service's DNS name, and that Service.
type Foreign struct {
	// Name is the controller ("kueue", "lws", "kruise"): the Deployment is
	// <Name>-controller-manager, the Secret <Name>-webhook-server-cert, and
	// the webhook's --name (the annotation it puts on pods it mutates).
	Name      string
	Namespace string
	// Service is the webhook Service's name, default <Name>-webhook-service;
	// the serving certificate is for <Service>.<Namespace>.svc.
	Service string
	// PodLabels label the pods and are the Deployment's selector;
	// ServiceSelector is the webhook Service's (default PodLabels). The
	// seed-001 mistake is a ServiceSelector holding only control-plane:
	// controller-manager.
	PodLabels       map[string]string
	ServiceSelector map[string]string
	Replicas        int32
	// NotReadyFor keeps the webhook closed and /readyz failing this long
	// after the container starts (seed 000).
	NotReadyFor time.Duration
	// NoService skips the Service (a workload that only collides with
	// another's selector).
	NoService bool
}

// DeploymentName is the Deployment's name.
func (f Foreign) DeploymentName() string { return f.Name + "-controller-manager" }

// ServiceName is the webhook Service's name.
func (f Foreign) ServiceName() string {
	if f.Service != "" {
		return f.Service
	}
	return f.Name + "-webhook-service"
}

// Host is the name the API server verifies the certificate against.
func (f Foreign) Host() string { return f.ServiceName() + "." + f.Namespace + ".svc" }

// Apply creates the Secret (a certificate from ca for Host()), the
// Deployment and, unless NoService, the Service. The pods meet Pod Security
// "restricted", which kadmit's namespace enforces.
func (f Foreign) Apply(ctx context.Context, client kubernetes.Interface, ca *realcluster.CA) error {
	crt, key, err := ca.Serving(f.Host())
	if err != nil {
		return err
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: f.Name + "-webhook-server-cert", Namespace: f.Namespace},
		Type:       corev1.SecretTypeTLS,
		Data:       map[string][]byte{corev1.TLSCertKey: crt, corev1.TLSPrivateKeyKey: key},
	}
	if _, err := client.CoreV1().Secrets(f.Namespace).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("seedcluster: %s Secret: %w", f.Name, err)
	}
	args := []string{"--cert-dir=/tmp/k8s-webhook-server/serving-certs", "--port=9443", "--health-port=8081", "--name=" + f.Name}
	if f.NotReadyFor > 0 {
		args = append(args, "--not-ready-for="+f.NotReadyFor.String())
	}
	replicas := f.Replicas
	if replicas == 0 {
		replicas = 1
	}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: f.DeploymentName(), Namespace: f.Namespace, Labels: f.PodLabels},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: f.PodLabels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: f.PodLabels},
				Spec: corev1.PodSpec{
					// A short grace: the fixture has nothing to drain.
					TerminationGracePeriodSeconds: ptr.To[int64](2),
					SecurityContext: &corev1.PodSecurityContext{
						RunAsNonRoot:   ptr.To(true),
						RunAsUser:      ptr.To[int64](65532),
						SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
					},
					Containers: []corev1.Container{{
						Name:            "manager",
						Image:           image.ForeignRef,
						ImagePullPolicy: corev1.PullNever,
						Args:            args,
						Ports: []corev1.ContainerPort{
							{Name: WebhookPortName, ContainerPort: 9443, Protocol: corev1.ProtocolTCP},
							{Name: "health", ContainerPort: 8081, Protocol: corev1.ProtocolTCP},
						},
						ReadinessProbe: &corev1.Probe{
							ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/readyz", Port: intstr.FromString("health")}},
							// Period 1 s so Ready follows the webhook
							// port within a second (seed 000 times it);
							// three failures, not one, so a probe slowed
							// by a busy 2-core machine (an API server
							// restart) does not drop the endpoint.
							PeriodSeconds: 1, TimeoutSeconds: 2, FailureThreshold: 3,
						},
						LivenessProbe: &corev1.Probe{
							ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("health")}},
							PeriodSeconds: 5,
						},
						SecurityContext: &corev1.SecurityContext{
							AllowPrivilegeEscalation: ptr.To(false),
							Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
						},
						VolumeMounts: []corev1.VolumeMount{{Name: "cert", MountPath: "/tmp/k8s-webhook-server/serving-certs", ReadOnly: true}},
					}},
					Volumes: []corev1.Volume{{Name: "cert", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: secret.Name}}}},
				},
			},
		},
	}
	if _, err := client.AppsV1().Deployments(f.Namespace).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("seedcluster: %s Deployment: %w", f.Name, err)
	}
	if f.NoService {
		return nil
	}
	sel := f.ServiceSelector
	if sel == nil {
		sel = f.PodLabels
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: f.ServiceName(), Namespace: f.Namespace},
		Spec: corev1.ServiceSpec{
			Selector: sel,
			Ports:    []corev1.ServicePort{{Name: "https", Port: 443, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromString(WebhookPortName)}},
		},
	}
	if _, err := client.CoreV1().Services(f.Namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("seedcluster: %s Service: %w", f.Name, err)
	}
	return nil
}

// Scale sets the Deployment's replicas.
func (f Foreign) Scale(ctx context.Context, client kubernetes.Interface, replicas int32) error {
	patch := []byte(`{"spec":{"replicas":` + strconv.Itoa(int(replicas)) + `}}`)
	_, err := client.AppsV1().Deployments(f.Namespace).Patch(ctx, f.DeploymentName(), "application/merge-patch+json", patch, metav1.PatchOptions{})
	if err != nil {
		return fmt.Errorf("seedcluster: scale %s to %d: %w", f.DeploymentName(), replicas, err)
	}
	return nil
}

// EnsureNamespace creates namespace name with labels unless it exists, and
// waits (at most 30 s) for its default ServiceAccount: until the
// serviceaccount controller makes it, the ServiceAccount admission plugin
// rejects every pod there, which would hide what a test looks for.
func EnsureNamespace(ctx context.Context, client kubernetes.Interface, name string, labels map[string]string) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	if _, err := client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("seedcluster: namespace %s: %w", name, err)
	}
	err := poll.Until(ctx, 30*time.Second, func(ctx context.Context) error {
		_, err := client.CoreV1().ServiceAccounts(name).Get(ctx, "default", metav1.GetOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("seedcluster: namespace %s: default ServiceAccount: %w", name, err)
	}
	return nil
}
