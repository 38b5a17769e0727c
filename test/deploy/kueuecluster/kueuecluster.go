// Package kueuecluster runs Kueue (sigs.k8s.io/kueue v0.17.0) on the real
// two-node cluster (package cluster) with its own Helm chart and measures
// its admission webhooks under load through the disruptions that involve
// their certificates: a fresh install, a rollout restart, deleting the
// leader pod and a forced CA rotation. Two builds of the same manager run
// it: Kueue's own cmd/kueue, whose certificates come from
// open-policy-agent/cert-controller as upstream ships it, and a main of
// ours wiring the same webhooks and controllers through
// github.com/kadmit/kadmit/pkg/webhookcerts. Both come from hack/kueue.sh
// (make kueue), which writes them with the chart to Dir().
//
// Everything here reuses the cluster's helpers (package cluster, its image
// package, realcluster's Helm configuration and timeline); what is Kueue's
// own is the image (the static manager at /manager, the path the chart's
// Deployment runs), the chart's values, the queues, and a load of Job
// creations instead of pods.
package kueuecluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/kube"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/kadmit/kadmit/test/cluster"
	"github.com/kadmit/kadmit/test/cluster/image"
	"github.com/kadmit/kadmit/test/deploy/realcluster"
	"github.com/kadmit/kadmit/test/poll"
)

// Version is the Kueue release hack/kueue.sh builds.
const Version = "v0.17.0"

// EnvDir names the variable that points at hack/kueue.sh's output directory
// (default DefaultDir()); EnvReport the file the comparison table is also
// written to.
const (
	EnvDir    = "KADMIT_KUEUE_DIR"
	EnvReport = "KADMIT_KUEUE_REPORT"
)

// Names the chart gives Kueue's objects with release name ReleaseName in
// Namespace; they are also the defaults of Kueue's configuration
// (apis/config/v1beta2/defaults.go: internalCertManagement's
// webhookServiceName and webhookSecretName, the namespace), so the chart's
// objects and the manager's certificate management agree without values.
const (
	ReleaseName    = "kueue"
	Namespace      = "kueue-system"
	DeploymentName = "kueue-controller-manager"
	ServiceAccount = "kueue-controller-manager"
	ServiceName    = "kueue-webhook-service"
	SecretName     = "kueue-webhook-server-cert"
	MutatingName   = "kueue-mutating-webhook-configuration"
	ValidatingName = "kueue-validating-webhook-configuration"
	// LeaseName is the leader-election Lease of the chart's configuration
	// (leaderElection.resourceName); its holderIdentity is
	// "<pod name>_<uuid>".
	LeaseName = "c1f6bfd2.kueue.x-k8s.io"
	// WebhookPort is the container port the webhook server listens on
	// (webhook.port, the Service's targetPort).
	WebhookPort = 9443
	// ServerName is the name the API server verifies the webhook's
	// certificate for (cert-controller's DNSName).
	ServerName = ServiceName + "." + Namespace + ".svc"
	// Selector selects the manager's pods.
	Selector = "app.kubernetes.io/name=kueue,app.kubernetes.io/instance=" + ReleaseName
)

// The queues the load submits to: a ResourceFlavor, a ClusterQueue for
// every namespace, and a LocalQueue in LoadNamespace.
const (
	LoadNamespace  = "team-a"
	FlavorName     = "default-flavor"
	ClusterQueue   = "cluster-queue"
	LocalQueue     = "user-queue"
	QueueNameLabel = "kueue.x-k8s.io/queue-name"
)

// RotateAnnotation on the webhook Secret asks webhookcerts for a rotation;
// value "ca" rotates the CA (and the leaf with it).
const RotateAnnotation = "webhookcerts.kadmit.io/rotate"

// ImageRepository is the repository of both variants' images; the tag is
// the variant's name.
const ImageRepository = "kadmit.test/kueue-manager"

// DefaultDir is where hack/kueue.sh builds: ~/.cache/kadmit/kueue/<Version>.
func DefaultDir() string {
	home, err := os.UserHomeDir()
	if err != nil {
		home = "/root"
	}
	return filepath.Join(home, ".cache", "kadmit", "kueue", Version)
}

// Dir is $KADMIT_KUEUE_DIR, else DefaultDir().
func Dir() string {
	if d := os.Getenv(EnvDir); d != "" {
		return d
	}
	return DefaultDir()
}

// ChartDir is the chart hack/kueue.sh copies from the release (charts/kueue).
func ChartDir(dir string) string { return filepath.Join(dir, "chart") }

// ErrMissing matches an error saying that what hack/kueue.sh builds is not
// there (the test skips on it unless KADMIT_E2E_REQUIRED=1).
var ErrMissing = errors.New("kueue binaries missing (make kueue)")

// Variant is one build of Kueue's manager.
type Variant struct {
	// Name is the table's and the subtest's name, and the image tag.
	Name string
	// Binary is the file name in Dir().
	Binary string
	// Library is true for the webhookcerts build.
	Library bool
}

// The two variants, in the table's order.
var (
	Upstream     = Variant{Name: "cert-controller", Binary: "manager-upstream"}
	WebhookCerts = Variant{Name: "webhookcerts", Binary: "manager-webhookcerts", Library: true}
	Variants     = []Variant{Upstream, WebhookCerts}
)

// Ref is the variant's image reference.
func (v Variant) Ref() string { return ImageRepository + ":" + v.Name }

// Check returns an error matching ErrMissing unless dir holds the variant's
// static binary and the chart.
func (v Variant) Check(dir string) error {
	bin := filepath.Join(dir, v.Binary)
	if _, err := os.Stat(bin); err != nil {
		return fmt.Errorf("%w: %v", ErrMissing, err)
	}
	if _, err := os.Stat(filepath.Join(ChartDir(dir), "Chart.yaml")); err != nil {
		return fmt.Errorf("%w: %v", ErrMissing, err)
	}
	if err := image.CheckStatic(bin); err != nil {
		return fmt.Errorf("%s: %w (the image has no libc: build with CGO_ENABLED=0)", v.Binary, err)
	}
	return nil
}

// Image writes workDir/<name>.tar: one layer with distroless static's
// users (image.BaseFiles) and the manager at /manager, the command of the
// chart's Deployment, run as 65532:65532 as Kueue's release image is (the
// chart's pod says runAsNonRoot without a user, so the image's USER must
// be numeric and not 0).
func (v Variant) Image(dir, workDir string) (archive string, err error) {
	archive = filepath.Join(workDir, v.Name+".tar")
	files := append(image.BaseFiles(), image.File{Path: "/manager", Mode: 0o755, Source: filepath.Join(dir, v.Binary)})
	if err := image.Write(archive, v.Ref(), files, image.Config{Entrypoint: []string{"/manager"}, User: image.NonRoot}); err != nil {
		return "", err
	}
	return archive, nil
}

// Values are the chart values this environment needs, everything else
// being the chart's defaults (internal certificate management on,
// cert-manager off, the webhooks' failurePolicy Fail):
//
//   - the manager's image: the variant's, imported into the nodes,
//     pullPolicy Never (there is no registry);
//   - replicas 2 (the chart's default is 1): every replica serves the
//     webhooks, one holds the leader Lease, so deleting the leader is a
//     real high-availability scenario, not an outage by construction;
//   - resources: requests of 100m CPU and 128Mi per replica instead of 500m
//     and 512Mi, limits 1 CPU and 512Mi: two replicas on a 2-core machine
//     that also runs the control plane, two kubelets and the load.
//
// Nothing is needed for DNS (there is none here): the manager reaches the
// API server through KUBERNETES_SERVICE_HOST, the API server reaches the
// webhook and the visibility APIService through their Services (it
// resolves Services itself), and nothing in Kueue resolves a name. Pod
// Security: the chart's pod is compliant with "restricted" (non-root,
// seccomp RuntimeDefault, no capabilities, read-only root), and
// EnsureNamespace enforces that level on Namespace.
func (v Variant) Values() map[string]any {
	return map[string]any{
		"controllerManager": map[string]any{
			"replicas": 2,
			"manager": map[string]any{
				"image": map[string]any{"repository": ImageRepository, "tag": v.Name, "pullPolicy": "Never"},
				"resources": map[string]any{
					"requests": map[string]any{"cpu": "100m", "memory": "128Mi"},
					"limits":   map[string]any{"cpu": "1", "memory": "512Mi"},
				},
			},
		},
	}
}

// EnsureNamespaces creates Namespace (Pod Security "restricted" enforced)
// and LoadNamespace (realcluster.EnsureNamespace, no labels: Kueue's Job
// webhooks have no namespaceSelector with the chart's default
// configuration, so they match it).
func EnsureNamespaces(ctx context.Context, c *cluster.Cluster) error {
	_, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name:   Namespace,
		Labels: map[string]string{"pod-security.kubernetes.io/enforce": "restricted"},
	}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("kueuecluster: namespace %s: %w", Namespace, err)
	}
	return realcluster.EnsureNamespace(ctx, c, LoadNamespace)
}

// Install runs `helm install kueue <dir>/chart -n kueue-system` with the
// Helm SDK and v.Values(), and returns as soon as Helm has created the
// objects (it waits for nothing, as `helm install` without --wait): the
// caller measures what follows.
func Install(ctx context.Context, c *cluster.Cluster, dir string, v Variant) error {
	ch, err := loader.LoadDir(ChartDir(dir))
	if err != nil {
		return fmt.Errorf("kueuecluster: load chart: %w", err)
	}
	cfg, err := realcluster.HelmConfig(c, Namespace)
	if err != nil {
		return err
	}
	inst := action.NewInstall(cfg)
	inst.ReleaseName = ReleaseName
	inst.Namespace = Namespace
	inst.WaitStrategy = kube.HookOnlyStrategy
	inst.Timeout = 2 * time.Minute
	if _, err := inst.RunWithContext(ctx, ch, v.Values()); err != nil {
		return fmt.Errorf("kueuecluster: helm install %s: %w", ReleaseName, err)
	}
	return nil
}

// Deployment returns the manager's Deployment.
func Deployment(ctx context.Context, c *cluster.Cluster) (*appsv1.Deployment, error) {
	return c.Client.AppsV1().Deployments(Namespace).Get(ctx, DeploymentName, metav1.GetOptions{})
}

// Available reports whether d's Available condition is True.
func Available(d *appsv1.Deployment) bool {
	for _, cond := range d.Status.Conditions {
		if cond.Type == appsv1.DeploymentAvailable {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// RolledOut returns nil when the Deployment has observed its generation
// and runs exactly its replicas, all updated, Ready and available, and no
// pod of it is terminating.
func RolledOut(ctx context.Context, c *cluster.Cluster) error {
	d, err := Deployment(ctx, c)
	if err != nil {
		return err
	}
	want := int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	s := d.Status
	if s.ObservedGeneration < d.Generation {
		return fmt.Errorf("generation %d not observed (%d)", d.Generation, s.ObservedGeneration)
	}
	if s.UpdatedReplicas != want || s.ReadyReplicas != want || s.AvailableReplicas != want || s.Replicas != want {
		return fmt.Errorf("want %d replicas updated, ready and available: %d replicas, %d updated, %d ready, %d available", want, s.Replicas, s.UpdatedReplicas, s.ReadyReplicas, s.AvailableReplicas)
	}
	pods, err := c.Client.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{LabelSelector: Selector})
	if err != nil {
		return err
	}
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil {
			return fmt.Errorf("pod %s terminating", p.Name)
		}
	}
	return nil
}

// Pods returns the manager's pods that are not terminating.
func Pods(ctx context.Context, c *cluster.Cluster) ([]corev1.Pod, error) {
	return realcluster.LivePods(ctx, c, Namespace, Selector)
}

var (
	flavorGVR = schema.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta2", Resource: "resourceflavors"}
	cqGVR     = schema.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta2", Resource: "clusterqueues"}
	lqGVR     = schema.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta2", Resource: "localqueues"}
)

// CreateQueues creates the ResourceFlavor FlavorName, the ClusterQueue
// ClusterQueue (every namespace, 4 CPUs and 4Gi of the flavor) and the
// LocalQueue LocalQueue in LoadNamespace, with the chart's CRDs (v1beta2,
// their storage version). Kueue's webhooks admit them (failurePolicy Fail),
// so each is retried until it is created or ctx ends.
func CreateQueues(ctx context.Context, c *cluster.Cluster) error {
	dc, err := dynamic.NewForConfig(c.Config)
	if err != nil {
		return err
	}
	objs := []struct {
		gvr schema.GroupVersionResource
		ns  string
		obj map[string]any
	}{
		{flavorGVR, "", map[string]any{
			"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
			"metadata": map[string]any{"name": FlavorName},
		}},
		{cqGVR, "", map[string]any{
			"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
			"metadata": map[string]any{"name": ClusterQueue},
			"spec": map[string]any{
				"namespaceSelector": map[string]any{},
				"resourceGroups": []any{map[string]any{
					"coveredResources": []any{"cpu", "memory"},
					"flavors": []any{map[string]any{
						"name": FlavorName,
						"resources": []any{
							map[string]any{"name": "cpu", "nominalQuota": "4"},
							map[string]any{"name": "memory", "nominalQuota": "4Gi"},
						},
					}},
				}},
			},
		}},
		{lqGVR, LoadNamespace, map[string]any{
			"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
			"metadata": map[string]any{"name": LocalQueue, "namespace": LoadNamespace},
			"spec":     map[string]any{"clusterQueue": ClusterQueue},
		}},
	}
	for _, o := range objs {
		u := &unstructured.Unstructured{Object: o.obj}
		var ri dynamic.ResourceInterface = dc.Resource(o.gvr)
		if o.ns != "" {
			ri = dc.Resource(o.gvr).Namespace(o.ns)
		}
		if err := poll.Until(ctx, 0, func(ctx context.Context) error {
			_, err := ri.Create(ctx, u.DeepCopy(), metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				return nil
			}
			return err
		}); err != nil {
			return fmt.Errorf("kueuecluster: create %s %s: %w", u.GetKind(), u.GetName(), err)
		}
	}
	return nil
}

// LibraryRBACName names the ClusterRole, Role and their bindings
// GrantLibraryRBAC makes.
const LibraryRBACName = "kueue-webhookcerts"

// GrantLibraryRBAC grants the manager's ServiceAccount what the library
// needs beyond the chart's RBAC, which is cert-controller's (get, list,
// watch and update on the webhook configurations and CRDs, nothing on
// Services or EndpointSlices): patch (server-side apply of caBundle) on
// MutatingWebhookConfigurations, ValidatingWebhookConfigurations and
// CustomResourceDefinitions, and in Namespace get on Services and list on
// EndpointSlices (the gate before an old CA leaves). It is the RBAC part
// of the change docs/library.md describes for Kueue, applied beside the
// chart for the library variant only.
func GrantLibraryRBAC(ctx context.Context, c *cluster.Cluster) error {
	subjects := []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: Namespace, Name: ServiceAccount}}
	rbac := c.Client.RbacV1()
	create := func(err error) error {
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("kueuecluster: the library's RBAC: %w", err)
		}
		return nil
	}
	_, err := rbac.ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: LibraryRBACName},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{"admissionregistration.k8s.io"}, Resources: []string{"mutatingwebhookconfigurations", "validatingwebhookconfigurations"}, Verbs: []string{"patch"}},
			{APIGroups: []string{"apiextensions.k8s.io"}, Resources: []string{"customresourcedefinitions"}, Verbs: []string{"patch"}},
		},
	}, metav1.CreateOptions{})
	if err := create(err); err != nil {
		return err
	}
	_, err = rbac.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: LibraryRBACName},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: LibraryRBACName},
		Subjects:   subjects,
	}, metav1.CreateOptions{})
	if err := create(err); err != nil {
		return err
	}
	_, err = rbac.Roles(Namespace).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: LibraryRBACName, Namespace: Namespace},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"services"}, Verbs: []string{"get"}},
			{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list"}},
		},
	}, metav1.CreateOptions{})
	if err := create(err); err != nil {
		return err
	}
	_, err = rbac.RoleBindings(Namespace).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: LibraryRBACName, Namespace: Namespace},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: LibraryRBACName},
		Subjects:   subjects,
	}, metav1.CreateOptions{})
	return create(err)
}

// Routed returns nil once a TCP connection to the webhook Service's
// ClusterIP on port 443 is accepted from the control plane's network
// namespace, where the API server dials it: kube-proxy there has programmed
// a ready endpoint. Until then the API server's calls are refused by
// kube-proxy's reject rule for a Service without endpoints, whatever the
// webhook's certificates. The Deployment turns Available about a second
// before that (kube-proxy's sync), which is not the certificate library's
// to close: it is why kadmit's own registrar waits for a verified, routed
// endpoint before it registers.
func Routed(ctx context.Context, c *cluster.Cluster) error {
	svc, err := c.Client.CoreV1().Services(Namespace).Get(ctx, ServiceName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("kueuecluster: get Service %s: %w", ServiceName, err)
	}
	d := net.Dialer{Timeout: 500 * time.Millisecond}
	conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(svc.Spec.ClusterIP, "443"))
	if err != nil {
		return fmt.Errorf("kueuecluster: Service %s not routed yet: %w", ServiceName, err)
	}
	return conn.Close()
}
