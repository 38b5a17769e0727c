package realcluster

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"helm.sh/helm/v4/pkg/action"
	chartv2 "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/kube"
	releasev1 "helm.sh/helm/v4/pkg/release/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"

	"github.com/kadmit/kadmit/test/cluster"
	"github.com/kadmit/kadmit/test/deploy/chart"
	"github.com/kadmit/kadmit/test/deploy/kadmitimage"

	"github.com/kadmit/kadmit/test/poll"
)

// Defaults of InstallOptions, as docs/install.md's first recipe has them
// (`helm install kadmit deploy/helm/kadmit`): the release record in
// "default", kadmit's objects in the kadmit-system namespace the chart
// creates.
const (
	ReleaseName   = chart.ReleaseName
	HelmNamespace = "default"
	Namespace     = chart.Namespace
)

// Values returns the values this environment requires, merged under
// overrides (a nested map; overrides win key by key). Only what a cluster
// without a registry needs differs from values.yaml:
//
//   - image.repository kadmit.test/kadmit and image.tag tag: the image
//     Image (or ImageTag) built and imported into the nodes; the chart's
//     ghcr.io reference cannot be pulled here.
//   - image.pullPolicy Never: there is no registry to pull from; the kubelet
//     must use the imported image, and fails the pod (ErrImageNeverPull)
//     rather than hanging when it is missing.
//
// Nothing else is needed: without cluster DNS kadmit reaches the API server
// through KUBERNETES_SERVICE_HOST, and the API server calls the webhook by
// the Service's ClusterIP (it resolves Services itself), so replicas,
// probes, preStop, PDB, topology spread and TLS keep their defaults.
func Values(tag string, overrides map[string]any) map[string]any {
	base := map[string]any{
		"image": map[string]any{
			"repository": kadmitimage.Repository,
			"tag":        tag,
			"pullPolicy": "Never",
		},
	}
	return mergeValues(base, overrides)
}

// mergeValues returns a copy of base with over merged into it, nested maps
// key by key.
func mergeValues(base, over map[string]any) map[string]any {
	out := maps.Clone(base)
	if out == nil {
		out = map[string]any{}
	}
	for k, v := range over {
		bm, bok := out[k].(map[string]any)
		om, ook := v.(map[string]any)
		if bok && ook {
			out[k] = mergeValues(bm, om)
			continue
		}
		out[k] = v
	}
	return out
}

// InstallOptions configure Install; the zero value is the default install.
type InstallOptions struct {
	// Name of the release (default ReleaseName) and HelmNamespace where
	// its record lives (default HelmNamespace).
	Name          string
	HelmNamespace string
	// Tag of kadmit's image (default Tag); it must be imported already.
	Tag string
	// Values are merged over Values(Tag, nil): set only what the test is
	// about (watch.enabled, tls.mode ...).
	Values map[string]any
	// Timeout bounds the install and the wait for Ready; default 3 minutes.
	Timeout time.Duration
}

// Release is an installed release of deploy/helm/kadmit.
type Release struct {
	Cluster *cluster.Cluster
	// Name and HelmNamespace of the release; Namespace is where kadmit's
	// objects are (values namespace.name); FullName is the chart's object
	// prefix (the Deployment's, Service's and webhook configurations'
	// name with default values).
	Name, HelmNamespace, Namespace, FullName string
	// Values are the values of the last install or upgrade, as passed to
	// Helm (environment defaults included).
	Values map[string]any
	// Revision is Helm's revision of the last install or upgrade.
	Revision int

	cfg         *action.Configuration
	chart       *chartv2.Chart
	uninstalled bool
}

// Uninstalled reports whether Uninstall has run helm uninstall (whether or
// not its wait succeeded).
func (r *Release) Uninstalled() bool { return r.uninstalled }

// HelmConfig returns a Helm action configuration for the cluster, as the
// helm CLI builds it from --kubeconfig and -n: a RESTClientGetter over the
// cluster's admin kubeconfig, releases stored as Secrets in namespace.
// Helm's own log goes nowhere (its errors are returned).
func HelmConfig(c *cluster.Cluster, namespace string) (*action.Configuration, error) {
	flags := genericclioptions.NewConfigFlags(false)
	flags.KubeConfig = &c.Kubeconfig
	flags.Namespace = &namespace
	cfg := action.NewConfiguration()
	cfg.SetLogger(slog.DiscardHandler)
	if err := cfg.Init(flags, namespace, "secret"); err != nil {
		return nil, fmt.Errorf("realcluster: helm configuration: %w", err)
	}
	return cfg, nil
}

// Install runs `helm install` of deploy/helm/kadmit with the Helm SDK, then
// waits until the release is Ready (WaitReady). The returned Release is
// valid even when the wait fails, so the caller can look and uninstall.
func Install(ctx context.Context, c *cluster.Cluster, opts InstallOptions) (*Release, error) {
	if opts.Name == "" {
		opts.Name = ReleaseName
	}
	if opts.HelmNamespace == "" {
		opts.HelmNamespace = HelmNamespace
	}
	if opts.Tag == "" {
		opts.Tag = Tag
	}
	if opts.Timeout == 0 {
		opts.Timeout = 3 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	dir, err := chart.Dir()
	if err != nil {
		return nil, err
	}
	ch, err := loader.LoadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("realcluster: load %s: %w", dir, err)
	}
	cfg, err := HelmConfig(c, opts.HelmNamespace)
	if err != nil {
		return nil, err
	}
	values := Values(opts.Tag, opts.Values)
	inst := action.NewInstall(cfg)
	inst.ReleaseName = opts.Name
	inst.Namespace = opts.HelmNamespace
	// Helm waits for hooks only (the pre-delete Job at uninstall); readiness
	// is WaitReady's, which also waits for the webhook configurations Helm
	// does not know about.
	inst.WaitStrategy = kube.HookOnlyStrategy
	inst.Timeout = opts.Timeout
	rel, err := inst.RunWithContext(ctx, ch, values)
	if err != nil {
		return nil, fmt.Errorf("realcluster: helm install %s: %w", opts.Name, err)
	}
	r := &Release{Cluster: c, Name: opts.Name, HelmNamespace: opts.HelmNamespace, Values: values, cfg: cfg, chart: ch}
	if err := r.record(rel); err != nil {
		return nil, err
	}
	return r, r.WaitReady(ctx)
}

// record reads the namespace and full name from the rendered Deployment.
func (r *Release) record(rel any) error {
	hr, ok := rel.(*releasev1.Release)
	if !ok {
		return fmt.Errorf("realcluster: helm returned %T", rel)
	}
	r.Revision = hr.Version
	objs, err := chart.Decode(hr.Manifest)
	if err != nil {
		return err
	}
	for _, o := range objs {
		if o.GetKind() == "Deployment" && o.GetLabels()["app.kubernetes.io/component"] == "" {
			r.Namespace, r.FullName = o.GetNamespace(), o.GetName()
			return nil
		}
	}
	return fmt.Errorf("realcluster: release %s renders no kadmit Deployment", r.Name)
}

// Upgrade runs `helm upgrade` with values merged over Values(tag, nil)
// (the tag is taken from values' image.tag, else Tag; Helm's default
// value handling: values not given return to the chart's), then waits
// until the release is Ready again. timeout 0 means 3 minutes.
func (r *Release) Upgrade(ctx context.Context, values map[string]any, timeout time.Duration) error {
	if timeout == 0 {
		timeout = 3 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tag := Tag
	if im, ok := values["image"].(map[string]any); ok {
		if t, ok := im["tag"].(string); ok && t != "" {
			tag = t
		}
	}
	vals := Values(tag, values)
	up := action.NewUpgrade(r.cfg)
	up.Namespace = r.HelmNamespace
	up.WaitStrategy = kube.HookOnlyStrategy
	up.Timeout = timeout
	rel, err := up.RunWithContext(ctx, r.Name, r.chart, vals)
	if err != nil {
		return fmt.Errorf("realcluster: helm upgrade %s: %w", r.Name, err)
	}
	r.Values = vals
	if err := r.record(rel); err != nil {
		return err
	}
	return r.WaitReady(ctx)
}

// Uninstall runs `helm uninstall` (with its pre-delete hook, `kadmit
// uninstall`, which Helm waits for) and waits until kadmit's pods are gone.
// timeout 0 means 3 minutes.
func (r *Release) Uninstall(ctx context.Context, timeout time.Duration) error {
	if timeout == 0 {
		timeout = 3 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	un := action.NewUninstall(r.cfg)
	un.WaitStrategy = kube.HookOnlyStrategy
	un.Timeout = timeout
	_, err := un.Run(r.Name)
	r.uninstalled = true
	if err != nil {
		return fmt.Errorf("realcluster: helm uninstall %s: %w", r.Name, err)
	}
	return poll.Until(ctx, 0, func(context.Context) error {
		pods, err := r.Cluster.Client.CoreV1().Pods(r.Namespace).List(ctx, metav1.ListOptions{LabelSelector: r.Selector()})
		if err != nil {
			return err
		}
		if n := len(pods.Items); n > 0 {
			return fmt.Errorf("%d pods of %s left", n, r.FullName)
		}
		return nil
	})
}

// Selector is the label selector of the release's serving pods.
func (r *Release) Selector() string {
	return "app.kubernetes.io/name=kadmit,app.kubernetes.io/instance=" + r.Name
}

// Deployment returns the release's serving Deployment.
func (r *Release) Deployment(ctx context.Context) (*appsv1.Deployment, error) {
	return r.Cluster.Client.AppsV1().Deployments(r.Namespace).Get(ctx, r.FullName, metav1.GetOptions{})
}

// Pods returns the release's serving pods that are not terminating.
func (r *Release) Pods(ctx context.Context) ([]corev1.Pod, error) {
	return LivePods(ctx, r.Cluster, r.Namespace, r.Selector())
}

// LivePods returns the pods in namespace matching selector that are not
// terminating.
func LivePods(ctx context.Context, c *cluster.Cluster, namespace, selector string) ([]corev1.Pod, error) {
	list, err := c.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, err
	}
	var out []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	return out, nil
}

// WaitReady waits until the serving Deployment has rolled out completely
// (observed, every replica updated, Ready by its readiness probe and
// available, no old replica left) and both webhook configurations exist
// with a caBundle on every webhook, pointing at the release's Service. With
// watch.enabled it also waits for the watch's Deployment. On timeout the
// error says what was missing.
func (r *Release) WaitReady(ctx context.Context) error {
	deps := []string{r.FullName}
	if w, ok := r.Values["watch"].(map[string]any); ok && w["enabled"] == true {
		deps = append(deps, r.FullName+"-watch")
	}
	return poll.Until(ctx, 0, func(context.Context) error {
		for _, name := range deps {
			d, err := r.Cluster.Client.AppsV1().Deployments(r.Namespace).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if err := rolledOut(d); err != nil {
				return fmt.Errorf("deployment %s: %w", name, err)
			}
		}
		return r.Registered(ctx)
	})
}

func rolledOut(d *appsv1.Deployment) error {
	want := int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	s := d.Status
	if s.ObservedGeneration < d.Generation {
		return fmt.Errorf("generation %d not observed (%d)", d.Generation, s.ObservedGeneration)
	}
	if s.UpdatedReplicas != want || s.ReadyReplicas != want || s.AvailableReplicas != want || s.Replicas != want || s.UnavailableReplicas != 0 {
		return fmt.Errorf("want %d replicas updated, ready and available: %d replicas, %d updated, %d ready, %d available", want, s.Replicas, s.UpdatedReplicas, s.ReadyReplicas, s.AvailableReplicas)
	}
	return nil
}

// Registered returns nil when the release's MutatingWebhookConfiguration
// and ValidatingWebhookConfiguration (named FullName) exist and every
// webhook in them has a caBundle and calls the release's Service.
func (r *Release) Registered(ctx context.Context) error {
	reg := r.Cluster.Client.AdmissionregistrationV1()
	check := func(kind, name string, cc func(i int) (*string, *string, []byte), n int) error {
		if n == 0 {
			return fmt.Errorf("%s %s has no webhook", kind, name)
		}
		for i := range n {
			ns, svc, ca := cc(i)
			if len(ca) == 0 {
				return fmt.Errorf("%s %s: webhook %d has no caBundle", kind, name, i)
			}
			if ns == nil || svc == nil || *ns != r.Namespace || *svc != r.FullName {
				return fmt.Errorf("%s %s: webhook %d does not call service %s/%s", kind, name, i, r.Namespace, r.FullName)
			}
		}
		return nil
	}
	m, err := reg.MutatingWebhookConfigurations().Get(ctx, r.FullName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if err := check("MutatingWebhookConfiguration", m.Name, func(i int) (*string, *string, []byte) {
		cc := m.Webhooks[i].ClientConfig
		if cc.Service == nil {
			return nil, nil, cc.CABundle
		}
		return &cc.Service.Namespace, &cc.Service.Name, cc.CABundle
	}, len(m.Webhooks)); err != nil {
		return err
	}
	v, err := reg.ValidatingWebhookConfigurations().Get(ctx, r.FullName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	return check("ValidatingWebhookConfiguration", v.Name, func(i int) (*string, *string, []byte) {
		cc := v.Webhooks[i].ClientConfig
		if cc.Service == nil {
			return nil, nil, cc.CABundle
		}
		return &cc.Service.Namespace, &cc.Service.Name, cc.CABundle
	}, len(v.Webhooks))
}

// Leftovers lists what of the release is still in the cluster: webhook
// configurations of its name, Secrets in its namespace (the TLS Secret and
// Helm's release records), the namespace itself when the release made it, and RBAC objects (ClusterRoles and their
// bindings cluster-wide, Roles and RoleBindings in its namespace) labelled
// app.kubernetes.io/instance=<release> or named after the release (its
// full name, or starting with it and a dash or colon, or "<namespace>:"
// and it). Each is listed as "Kind namespace/name" ("Kind name" when
// cluster-scoped); those in ignore (e.g. a Secret the test made itself)
// are left out. An empty list means nothing is left.
func (r *Release) Leftovers(ctx context.Context, ignore ...string) ([]string, error) {
	cs := r.Cluster.Client
	var out []string
	add := func(kind, ns, name string) {
		if ns != "" {
			name = ns + "/" + name
		}
		if !slices.Contains(ignore, kind+" "+name) {
			out = append(out, kind+" "+name)
		}
	}
	ours := func(name string, labels map[string]string) bool {
		name = strings.TrimPrefix(name, r.Namespace+":")
		return labels["app.kubernetes.io/instance"] == r.Name || name == r.FullName ||
			strings.HasPrefix(name, r.FullName+"-") || strings.HasPrefix(name, r.FullName+":")
	}
	if _, err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, r.FullName, metav1.GetOptions{}); err == nil {
		add("MutatingWebhookConfiguration", "", r.FullName)
	} else if !apierrors.IsNotFound(err) {
		return nil, err
	}
	if _, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, r.FullName, metav1.GetOptions{}); err == nil {
		add("ValidatingWebhookConfiguration", "", r.FullName)
	} else if !apierrors.IsNotFound(err) {
		return nil, err
	}
	for _, ns := range []string{r.Namespace, r.HelmNamespace} {
		secrets, err := cs.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, err
		}
		for _, s := range secrets.Items {
			// Helm's release records are named sh.helm.release.v1.<release>.v<n>.
			if ours(s.Name, s.Labels) || strings.HasPrefix(s.Name, "sh.helm.release.v1."+r.Name+".") {
				add("Secret", ns, s.Name)
			}
		}
	}
	// The namespace, when the release made it (namespace.create): until it
	// is gone, a new install into it fails ("unable to create new content
	// in namespace ... because it is being terminated").
	if ns, err := cs.CoreV1().Namespaces().Get(ctx, r.Namespace, metav1.GetOptions{}); err == nil {
		if ns.Labels["app.kubernetes.io/instance"] == r.Name {
			add("Namespace", "", ns.Name+" ("+string(ns.Status.Phase)+")")
		}
	} else if !apierrors.IsNotFound(err) {
		return nil, err
	}
	crs, err := cs.RbacV1().ClusterRoles().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for _, o := range crs.Items {
		if ours(o.Name, o.Labels) {
			add("ClusterRole", "", o.Name)
		}
	}
	crbs, err := cs.RbacV1().ClusterRoleBindings().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for _, o := range crbs.Items {
		if ours(o.Name, o.Labels) {
			add("ClusterRoleBinding", "", o.Name)
		}
	}
	roles, err := cs.RbacV1().Roles(r.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for _, o := range roles.Items {
		if ours(o.Name, o.Labels) {
			add("Role", r.Namespace, o.Name)
		}
	}
	rbs, err := cs.RbacV1().RoleBindings(r.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for _, o := range rbs.Items {
		if ours(o.Name, o.Labels) {
			add("RoleBinding", r.Namespace, o.Name)
		}
	}
	return out, nil
}
