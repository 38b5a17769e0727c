package diagcluster

// Fault backends: each failure class gets a healthy webhook of its own, in a
// namespace of its own (labelled out of kadmit's webhooks): a Secret with a
// serving certificate from the backend's CA, a Deployment of two webhook
// server pods pinned to node1 (so the NoFalseAlarms drains of node2 leave
// them alone and they count as healthy webhooks there too; a class that
// needs node2 gets its backend after those drains), a Service, a
// PodDisruptionBudget and a ValidatingWebhookConfiguration (Fail, ConfigMap
// creations in its own namespace only: nothing the suite does).

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/kadmit/kadmit/test/cluster"
	"github.com/kadmit/kadmit/test/poll"
)

// backendReplicas: two, so that a healthy backend has no single-endpoint
// finding (KD604).
const backendReplicas = 2

// backendFieldManager writes the backends' objects.
const backendFieldManager = "diagcluster"

// backend is one class's webhook and what stands behind it.
type backend struct {
	c       *cluster.Cluster
	key     string
	ns      string // diag-<key>
	name    string // wf-<key>: Deployment, Service, Secret prefix, configuration
	webhook string
	ca      *testCA
	node    map[string]string // the pods' nodeSelector
}

func newBackend(c *cluster.Cluster, t *testing.T, key string, node string) *backend {
	b := &backend{c: c, key: key, ns: "diag-" + key, name: "wf-" + key, ca: newTestCA(t), node: map[string]string{"kubernetes.io/hostname": node}}
	b.webhook = b.name + ".diag.kadmit.test"
	return b
}

func (b *backend) labels() map[string]string { return map[string]string{"app": b.name} }

// host is the name the API server verifies the certificate against.
func (b *backend) host() string { return b.name + "." + b.ns + ".svc" }

func (b *backend) secretName(variant string) string {
	if variant == "" {
		return b.name + "-tls"
	}
	return b.name + "-tls-" + variant
}

// create makes the namespace and every object of the healthy backend.
func (b *backend) create(ctx context.Context, t *testing.T) error {
	cs := b.c.Client
	if err := ensureNamespace(ctx, b.c, b.ns, ignored); err != nil {
		return err
	}
	create := metav1.CreateOptions{FieldManager: backendFieldManager}
	if _, err := cs.CoreV1().Secrets(b.ns).Create(ctx, b.ca.secret(t, b.ns, b.secretName(""), b.host(), time.Now(), healthyValidity), create); err != nil {
		return fmt.Errorf("%s Secret: %w", b.name, err)
	}
	if _, err := cs.AppsV1().Deployments(b.ns).Create(ctx, webhookDeployment(b.ns, b.name, b.labels(), backendReplicas, b.secretName(""), b.node), create); err != nil {
		return fmt.Errorf("%s Deployment: %w", b.name, err)
	}
	if _, err := cs.CoreV1().Services(b.ns).Create(ctx, webhookService(b.ns, b.name, b.labels()), create); err != nil {
		return fmt.Errorf("%s Service: %w", b.name, err)
	}
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: b.name, Namespace: b.ns},
		Spec:       policyv1.PodDisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromInt32(1)), Selector: &metav1.LabelSelector{MatchLabels: b.labels()}},
	}
	if _, err := cs.PolicyV1().PodDisruptionBudgets(b.ns).Create(ctx, pdb, create); err != nil {
		return fmt.Errorf("%s PodDisruptionBudget: %w", b.name, err)
	}
	if _, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, b.config(), create); err != nil {
		return fmt.Errorf("%s configuration: %w", b.name, err)
	}
	return nil
}

var (
	configMapCreate = admissionregistrationv1.RuleWithOperations{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
		Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}}}
	podCreate = admissionregistrationv1.RuleWithOperations{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
		Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}}}
	tokenReviewCreate = admissionregistrationv1.RuleWithOperations{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
		Rule: admissionregistrationv1.Rule{APIGroups: []string{"authentication.k8s.io"}, APIVersions: []string{"v1"}, Resources: []string{"tokenreviews"}}}
)

// inNamespace is a namespaceSelector of namespace ns alone.
func inNamespace(ns string) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}}
}

// clientConfig calls the backend's Service on path with caBundle.
func (b *backend) clientConfig(path string, caBundle []byte) admissionregistrationv1.WebhookClientConfig {
	return admissionregistrationv1.WebhookClientConfig{CABundle: caBundle,
		Service: &admissionregistrationv1.ServiceReference{Namespace: b.ns, Name: b.name, Port: ptr.To[int32](443), Path: ptr.To(path)}}
}

// config is the backend's healthy ValidatingWebhookConfiguration.
func (b *backend) config() *admissionregistrationv1.ValidatingWebhookConfiguration {
	return &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: b.name},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:                    b.webhook,
			ClientConfig:            b.clientConfig("/validate", b.ca.pem),
			Rules:                   []admissionregistrationv1.RuleWithOperations{configMapCreate},
			NamespaceSelector:       inNamespace(b.ns),
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
			TimeoutSeconds:          ptr.To[int32](5),
		}},
	}
}

// updateConfig applies edit to the backend's webhook (one Get and Update,
// retried on a conflict).
func (b *backend) updateConfig(ctx context.Context, edit func(w *admissionregistrationv1.ValidatingWebhook)) error {
	api := b.c.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	return poll.Until(ctx, 20*time.Second, func(ctx context.Context) error {
		cur, err := api.Get(ctx, b.name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if len(cur.Webhooks) != 1 {
			return poll.Stop(fmt.Errorf("%s has %d webhooks", b.name, len(cur.Webhooks)))
		}
		edit(&cur.Webhooks[0])
		_, err = api.Update(ctx, cur, metav1.UpdateOptions{FieldManager: backendFieldManager})
		return err
	})
}

// scale sets the Deployment's replicas.
func (b *backend) scale(ctx context.Context, replicas int32) error {
	patch := fmt.Appendf(nil, `{"spec":{"replicas":%d}}`, replicas)
	_, err := b.c.Client.AppsV1().Deployments(b.ns).Patch(ctx, b.name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: backendFieldManager})
	return err
}

// readyEndpoints returns the pod names of the Service's ready endpoints.
func readyEndpoints(ctx context.Context, c *cluster.Cluster, ns, svc string) ([]string, error) {
	slices, err := c.Client.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svc})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, s := range slices.Items {
		for _, ep := range s.Endpoints {
			if ptr.Deref(ep.Conditions.Ready, false) && ep.TargetRef != nil {
				out = append(out, ep.TargetRef.Name)
			}
		}
	}
	return out, nil
}

// updateTemplate changes the Deployment's pod template with edit (one Get
// and Update, retried on a conflict).
func (b *backend) updateTemplate(ctx context.Context, edit func(*corev1.PodSpec)) error {
	err := poll.Until(ctx, 20*time.Second, func(ctx context.Context) error {
		d, err := b.c.Client.AppsV1().Deployments(b.ns).Get(ctx, b.name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		edit(&d.Spec.Template.Spec)
		_, err = b.c.Client.AppsV1().Deployments(b.ns).Update(ctx, d, metav1.UpdateOptions{FieldManager: backendFieldManager})
		return err
	})
	if err != nil {
		return fmt.Errorf("update Deployment %s/%s: %w", b.ns, b.name, err)
	}
	return nil
}

// rollout changes the Deployment's pod template with edit and returns when
// the first pod of the new template is a ready endpoint of the Service
// (the moment the API server may be routed to it), at most 90 s.
func (b *backend) rollout(ctx context.Context, edit func(*corev1.PodSpec)) (time.Time, error) {
	before, err := readyEndpoints(ctx, b.c, b.ns, b.name)
	if err != nil {
		return time.Time{}, err
	}
	pods, err := b.c.Client.CoreV1().Pods(b.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return time.Time{}, err
	}
	old := map[string]bool{}
	for _, p := range pods.Items {
		old[p.Name] = true
	}
	for _, n := range before {
		old[n] = true
	}
	if err := b.updateTemplate(ctx, edit); err != nil {
		return time.Time{}, err
	}
	var live time.Time
	err = poll.Until(ctx, 90*time.Second, func(ctx context.Context) error {
		ready, err := readyEndpoints(ctx, b.c, b.ns, b.name)
		if err != nil {
			return err
		}
		for _, n := range ready {
			if !old[n] {
				live = time.Now()
				return nil
			}
		}
		return fmt.Errorf("ready endpoints %v: none of the new template yet", ready)
	})
	return live, err
}

// webhookArgs edits the server's arguments.
func webhookArgs(edit func([]string) []string) func(*corev1.PodSpec) {
	return func(s *corev1.PodSpec) { s.Containers[0].Args = edit(s.Containers[0].Args) }
}

// setArg replaces the argument starting with prefix (e.g. "--port=") or
// adds it.
func setArg(args []string, arg, prefix string) []string {
	out := slices.DeleteFunc(slices.Clone(args), func(a string) bool { return len(a) >= len(prefix) && a[:len(prefix)] == prefix })
	return append(out, arg)
}

func dropArg(args []string, arg string) []string {
	return slices.DeleteFunc(slices.Clone(args), func(a string) bool { return a == arg })
}

// mountSecret makes the pods serve Secret name.
func mountSecret(name string) func(*corev1.PodSpec) {
	return func(s *corev1.PodSpec) { s.Volumes[0].Secret.SecretName = name }
}

// waitNoReadyEndpoint returns when the Service has no ready endpoint.
func (b *backend) waitNoReadyEndpoint(ctx context.Context) (time.Time, error) {
	var at time.Time
	err := poll.Until(ctx, 60*time.Second, func(ctx context.Context) error {
		ready, err := readyEndpoints(ctx, b.c, b.ns, b.name)
		if err != nil {
			return err
		}
		if len(ready) > 0 {
			return fmt.Errorf("ready endpoints %v", ready)
		}
		at = time.Now()
		return nil
	})
	return at, err
}

// addSecret creates a variant Secret (another name, expired).
func (b *backend) addSecret(ctx context.Context, s *corev1.Secret) error {
	_, err := b.c.Client.CoreV1().Secrets(b.ns).Create(ctx, s, metav1.CreateOptions{FieldManager: backendFieldManager})
	return err
}

// caBundleIs reports whether every webhook of the backend's configuration
// has caBundle want.
func (b *backend) caBundleIs(ctx context.Context, want []byte) (bool, error) {
	cur, err := b.c.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, b.name, metav1.GetOptions{})
	if err != nil {
		return false, err
	}
	for _, w := range cur.Webhooks {
		if !bytes.Equal(w.ClientConfig.CABundle, want) {
			return false, nil
		}
	}
	return true, nil
}

// waitBackendsReady waits until every backend's Deployment is rolled out
// (nil entries: backends not made yet).
func waitBackendsReady(ctx context.Context, c *cluster.Cluster, bs []*backend) error {
	var errs []error
	for _, b := range bs {
		if b == nil {
			continue
		}
		if err := waitRolledOut(ctx, c, b.ns, b.name, 3*time.Minute); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
