package deploy

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/kadmit/kadmit/test/deploy/chart"
	"github.com/kadmit/kadmit/test/deploy/internal/audit"
)

// clusterPolicies enables every policy that reads cluster state.
var clusterPolicies = map[string]any{"config": map[string]any{
	"apiVersion": "kadmit.io/v1alpha1", "kind": "Configuration",
	"policies": map[string]any{
		"jobQueue":     map[string]any{"enabled": true},
		"elasticQuota": map[string]any{"enabled": true},
		"colocation": map[string]any{"enabled": true, "profiles": []any{map[string]any{
			"name": "batch", "namespaceSelector": map[string]any{"matchLabels": map[string]any{"tier": "batch"}},
			"labels": map[string]any{"colocation": "true"},
		}}},
	},
}}

// TestLint runs what `helm lint` runs, for the default values and the
// other supported shapes, and allows nothing above INFO.
func TestLint(t *testing.T) {
	for name, vals := range map[string]map[string]any{
		"defaults":         nil,
		"files mode":       {"tls": map[string]any{"mode": "files"}},
		"cluster policies": clusterPolicies,
		"monitoring":       {"metrics": map[string]any{"serviceMonitor": map[string]any{"enabled": true}, "prometheusRule": map[string]any{"enabled": true}, "dashboard": map[string]any{"enabled": true}}},
	} {
		msgs, err := chart.Lint(vals)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			if chart.Severity(m) != "INFO" {
				t.Errorf("%s: %s", name, m.Error())
			} else {
				t.Logf("%s: %s", name, m.Error())
			}
		}
	}
}

// TestGeneratedFilesUpToDate fails when deploy/manifests, deploy/prometheus
// or deploy/dashboards differ from what `make manifests` writes.
func TestGeneratedFilesUpToDate(t *testing.T) {
	root, err := chart.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	files, err := chart.Generated()
	if err != nil {
		t.Fatal(err)
	}
	for p, want := range files {
		got, err := os.ReadFile(filepath.Join(root, p))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s is out of date with the chart (err %v): run `make manifests`", p, err)
		}
	}
}

func render(t *testing.T, release, ns string, vals map[string]any) *chart.Rendered {
	t.Helper()
	r, err := chart.Render(release, ns, vals)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func mustFind(t *testing.T, r *chart.Rendered, kind, name string) *unstructured.Unstructured {
	t.Helper()
	o := r.Find(kind, name)
	if o == nil {
		t.Fatalf("no %s/%s rendered; have %v", kind, name, r.Kinds())
	}
	return o
}

// TestDefaultInstall checks the HA and safety defaults of the issue on the
// rendered objects.
func TestDefaultInstall(t *testing.T) {
	r := render(t, chart.ReleaseName, chart.Namespace, nil)

	nsObj := mustFind(t, r, "Namespace", chart.Namespace)
	for k, v := range map[string]string{"kadmit.io/ignore": "true", "pod-security.kubernetes.io/enforce": "restricted"} {
		if nsObj.GetLabels()[k] != v {
			t.Errorf("namespace label %s = %q, want %q", k, nsObj.GetLabels()[k], v)
		}
	}

	var dep appsv1.Deployment
	toTyped(t, mustFind(t, r, "Deployment", "kadmit"), &dep)
	spec := dep.Spec.Template.Spec
	c := spec.Containers[0]
	if *dep.Spec.Replicas != 3 {
		t.Errorf("replicas %d, want 3", *dep.Spec.Replicas)
	}
	if ru := dep.Spec.Strategy.RollingUpdate; ru == nil || ru.MaxUnavailable.IntValue() != 0 {
		t.Errorf("rolling update must never lower the ready count: %+v", ru)
	}
	for _, want := range []string{"serve", "--tls=self-managed", "--register", "--webhook-config-name=kadmit", "--namespace=kadmit-system", "--service-name=kadmit", "--secret-name=kadmit-tls", "--shutdown-grace=30s",
		"--log-allowed-burst=10", "--log-allowed-sample=100", "--log-slow-review=100ms", "--gc-heap-floor=64Mi"} {
		if !slices.Contains(c.Args, want) {
			t.Errorf("args %q lack %s", c.Args, want)
		}
	}
	// No Lease: the replicas coordinate through the Secret's resourceVersion.
	for _, gone := range []string{"--lease-name", "--lease-duration", "--renew-deadline", "--retry-period", "--settle-delay", "--identity"} {
		if slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, gone) }) {
			t.Errorf("args %q carry the removed %s", c.Args, gone)
		}
	}
	env := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			env[e.Name] = e.ValueFrom.FieldRef.FieldPath
		}
	}
	if len(env) != 1 || env["POD_NAMESPACE"] != "metadata.namespace" {
		t.Errorf("downward API env %v", env)
	}
	if p := c.ReadinessProbe; p == nil || p.HTTPGet.Path != "/readyz" {
		t.Errorf("readinessProbe %+v, want /readyz", p)
	}
	if p := c.LivenessProbe; p == nil || p.HTTPGet.Path != "/healthz" {
		t.Errorf("livenessProbe %+v, want /healthz", p)
	}
	if c.StartupProbe == nil {
		t.Error("no startupProbe")
	}
	// SIGTERM comes after preStop; the grace period must cover preStop,
	// kadmit's own drain (--shutdown-grace) and a margin.
	pre := c.Lifecycle.PreStop.Sleep.Seconds
	if got := *spec.TerminationGracePeriodSeconds; got < pre+30 {
		t.Errorf("terminationGracePeriodSeconds %d < preStop %d + shutdown grace 30", got, pre)
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("resources %+v", c.Resources)
	}
	sc := c.SecurityContext
	if sc == nil || !*sc.ReadOnlyRootFilesystem || *sc.AllowPrivilegeEscalation || !*sc.RunAsNonRoot ||
		!slices.Contains(sc.Capabilities.Drop, "ALL") || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("container securityContext not restricted: %+v", sc)
	}
	if len(spec.TopologySpreadConstraints) == 0 || spec.TopologySpreadConstraints[0].TopologyKey != "kubernetes.io/hostname" {
		t.Errorf("topology spread %+v", spec.TopologySpreadConstraints)
	}

	var pdb policyv1.PodDisruptionBudget
	toTyped(t, mustFind(t, r, "PodDisruptionBudget", "kadmit"), &pdb)
	if pdb.Spec.MaxUnavailable.IntValue() != 1 {
		t.Errorf("PDB maxUnavailable %v", pdb.Spec.MaxUnavailable)
	}

	// The LeaderWorkerSet lesson: the webhook Service selects on name AND
	// instance, and exactly the Deployment's pods.
	var svc corev1.Service
	toTyped(t, mustFind(t, r, "Service", "kadmit"), &svc)
	if !mapsEqual(svc.Spec.Selector, map[string]string{"app.kubernetes.io/name": "kadmit", "app.kubernetes.io/instance": "kadmit"}) {
		t.Errorf("Service selector %v", svc.Spec.Selector)
	}
	if !mapsEqual(svc.Spec.Selector, dep.Spec.Selector.MatchLabels) {
		t.Errorf("Service selector %v differs from the Deployment's %v", svc.Spec.Selector, dep.Spec.Selector.MatchLabels)
	}
	mustFind(t, r, "Service", "kadmit-metrics")

	// The uninstall hook's pod must not be selected by the Service or the
	// Deployment (nor waited for by itself).
	job := mustFind(t, r, "Job", "kadmit-uninstall")
	jl, _, _ := unstructured.NestedStringMap(job.Object, "spec", "template", "metadata", "labels")
	if labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(jl)) {
		t.Errorf("the Service selects the uninstall Job's pod %v", jl)
	}
	if a := job.GetAnnotations()["helm.sh/hook"]; a != "pre-delete" {
		t.Errorf("uninstall Job hook %q", a)
	}
	for _, o := range r.Objects {
		if o.GetKind() == "Job" {
			t.Error("the uninstall Job must be a hook, not part of the manifest (plain manifests would run it at install)")
		}
	}
}

// TestTwoReleasesOneNamespace: no object name collides and neither
// release's Service selects the other's pods.
func TestTwoReleasesOneNamespace(t *testing.T) {
	shared := map[string]any{"namespace": map[string]any{"create": false, "name": "shared"}}
	a := render(t, "alpha", "shared", shared)
	b := render(t, "beta", "shared", shared)
	key := func(o *unstructured.Unstructured) string {
		return o.GetKind() + "/" + o.GetNamespace() + "/" + o.GetName()
	}
	seen := map[string]bool{}
	for _, o := range append(a.Objects, a.Hooks...) {
		seen[key(o)] = true
	}
	for _, o := range append(b.Objects, b.Hooks...) {
		if seen[key(o)] {
			t.Errorf("both releases render %s", key(o))
		}
	}
	podLabels := func(r *chart.Rendered, name string) labels.Set {
		var d appsv1.Deployment
		toTyped(t, mustFind(t, r, "Deployment", name), &d)
		return d.Spec.Template.Labels
	}
	svcSel := func(r *chart.Rendered, name string) labels.Selector {
		var s corev1.Service
		toTyped(t, mustFind(t, r, "Service", name), &s)
		return labels.SelectorFromSet(s.Spec.Selector)
	}
	if svcSel(a, "alpha-kadmit").Matches(podLabels(b, "beta-kadmit")) || svcSel(b, "beta-kadmit").Matches(podLabels(a, "alpha-kadmit")) {
		t.Error("one release's Service selects the other's pods")
	}
	if a.Find("Namespace", "shared") != nil {
		t.Error("namespace.create=false still renders the Namespace")
	}
	// Each release registers, grants and uninstalls webhook configurations
	// of its own name (TestTwoReleasesCoexist runs them).
	for _, rel := range []struct {
		r    *chart.Rendered
		full string
	}{{a, "alpha-kadmit"}, {b, "beta-kadmit"}} {
		var d appsv1.Deployment
		toTyped(t, mustFind(t, rel.r, "Deployment", rel.full), &d)
		if !slices.Contains(d.Spec.Template.Spec.Containers[0].Args, "--webhook-config-name="+rel.full) {
			t.Errorf("%s: serve args %q", rel.full, d.Spec.Template.Spec.Containers[0].Args)
		}
		cr := mustFind(t, rel.r, "ClusterRole", "shared:"+rel.full)
		// The webhook-configuration rule (secure metrics' TokenReview and
		// SubjectAccessReview rules come first and have no names).
		rules, _, _ := unstructured.NestedSlice(cr.Object, "rules")
		found := false
		for _, r := range rules {
			res, _, _ := unstructured.NestedStringSlice(r.(map[string]any), "resources")
			if !slices.Contains(res, "mutatingwebhookconfigurations") {
				continue
			}
			found = true
			if names, _, _ := unstructured.NestedStringSlice(r.(map[string]any), "resourceNames"); !slices.Equal(names, []string{rel.full}) {
				t.Errorf("%s: ClusterRole resourceNames %v for the webhook configurations", rel.full, names)
			}
		}
		if !found {
			t.Errorf("%s: ClusterRole has no rule for the webhook configurations: %v", rel.full, rules)
		}
	}
	if got := render(t, "alpha", "shared", map[string]any{"webhookConfigurationName": "platform-webhooks"}); !strings.Contains(
		fmt.Sprint(mustFind(t, got, "Deployment", "alpha-kadmit").Object), "--webhook-config-name=platform-webhooks") {
		t.Error("webhookConfigurationName not passed to serve")
	}
}

// grantsOf returns what the chart's bindings grant the Deployment's
// ServiceAccount: bindings → roles, so a role nobody binds adds nothing and
// a binding to a role outside the chart fails the test.
func grantsOf(t *testing.T, r *chart.Rendered) []string {
	t.Helper()
	if problems := audit.CheckBindings(append(append([]*unstructured.Unstructured{}, r.Objects...), r.Hooks...), unboundRoles(r)); len(problems) > 0 {
		t.Fatalf("chart RBAC:\n%s", strings.Join(problems, "\n"))
	}
	var dep appsv1.Deployment
	toTyped(t, mustFind(t, r, "Deployment", "kadmit"), &dep)
	user := "system:serviceaccount:" + dep.Namespace + ":" + dep.Spec.Template.Spec.ServiceAccountName
	gs, err := audit.BoundGrants(user, r.Objects...)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, g := range gs {
		out = append(out, strings.TrimSuffix(g.String(), " ("+g.Role+")"))
	}
	slices.Sort(out)
	return out
}

// unboundRoles names the roles the chart renders for users to bind: the
// metrics-reader ClusterRole, which a scraper's ServiceAccount is given
// (templates/rbac.yaml, templates/monitoring.yaml).
func unboundRoles(r *chart.Rendered) map[string]string {
	out := map[string]string{}
	for _, o := range r.Objects {
		if o.GetKind() == "ClusterRole" && strings.HasSuffix(o.GetName(), "-metrics-reader") {
			out["ClusterRole/"+o.GetName()] = "for users to bind to their metrics scraper"
		}
		if o.GetKind() == "Role" && strings.HasSuffix(o.GetName(), "-policies-writers") {
			out["Role/"+o.GetName()] = "for users to bind to the policies ConfigMap's writers (policies.writers)"
		}
	}
	return out
}

// TestRBACBindings: in every supported shape, each RoleBinding and
// ClusterRoleBinding the chart renders (hooks included) references a role
// the chart renders and binds only ServiceAccounts the chart renders, and
// every role is bound but the documented metrics-reader.
func TestRBACBindings(t *testing.T) {
	for name, vals := range map[string]map[string]any{
		"defaults":         nil,
		"files mode":       {"tls": map[string]any{"mode": "files"}},
		"no register":      {"register": false},
		"plain metrics":    {"metrics": map[string]any{"secure": false}},
		"cluster policies": clusterPolicies,
		"policy ConfigMap": {"policies": map[string]any{"configMap": "my-policies"}},
	} {
		for _, rel := range []struct{ release, ns string }{{"kadmit", chart.Namespace}, {"alpha", "shared"}} {
			r := render(t, rel.release, rel.ns, vals)
			all := append(append([]*unstructured.Unstructured{}, r.Objects...), r.Hooks...)
			bindings := 0
			for _, o := range all {
				if k := o.GetKind(); k == "RoleBinding" || k == "ClusterRoleBinding" {
					bindings++
				}
			}
			if bindings == 0 {
				t.Errorf("%s, release %s: no bindings rendered", name, rel.release)
			}
			for _, p := range audit.CheckBindings(all, unboundRoles(r)) {
				t.Errorf("%s, release %s: %s", name, rel.release, p)
			}
		}
	}
}

// TestRBACFollowsValues: permissions appear only with the settings that
// need them (register, TLS mode, cluster-reading policies).
func TestRBACFollowsValues(t *testing.T) {
	def := grantsOf(t, render(t, "kadmit", chart.Namespace, nil))
	for _, g := range def {
		if strings.Contains(g, "pods") || strings.Contains(g, "namespaces") || strings.Contains(g, "localqueues") || strings.Contains(g, "elasticquotas") {
			t.Errorf("default install grants %s", g)
		}
	}

	noReg := grantsOf(t, render(t, "kadmit", chart.Namespace, map[string]any{"register": false}))
	for _, g := range noReg {
		if strings.Contains(g, "webhookconfigurations") && !strings.HasPrefix(g, "list ") && !strings.HasPrefix(g, "watch ") {
			t.Errorf("register=false grants %s", g)
		}
	}

	// Secure metrics (the default) add TokenReview and SubjectAccessReview;
	// the rest of this test looks at the other settings without them.
	secure := grantsOf(t, render(t, "kadmit", chart.Namespace, map[string]any{"tls": map[string]any{"mode": "files"}, "register": false}))
	if want := []string{"create authentication.k8s.io/tokenreviews", "create authorization.k8s.io/subjectaccessreviews"}; !slices.Equal(secure, want) {
		t.Errorf("files mode without registration, secure metrics, grants %v, want %v", secure, want)
	}
	plainMetrics := map[string]any{"secure": false}

	files := grantsOf(t, render(t, "kadmit", chart.Namespace, map[string]any{"tls": map[string]any{"mode": "files"}, "metrics": plainMetrics}))
	// files mode: no Secret or Lease, but the registrar watches, writes
	// and repairs its configurations in every mode, probes the Service's
	// endpoints before the first registration, and writes an Event when
	// another field manager keeps undoing its caBundle.
	want := []string{
		"create admissionregistration.k8s.io/mutatingwebhookconfigurations name=kadmit",
		"create admissionregistration.k8s.io/validatingwebhookconfigurations name=kadmit",
		"create core/events",
		"delete admissionregistration.k8s.io/mutatingwebhookconfigurations name=kadmit",
		"delete admissionregistration.k8s.io/validatingwebhookconfigurations name=kadmit",
		"get core/services name=kadmit",
		"list admissionregistration.k8s.io/mutatingwebhookconfigurations name=kadmit",
		"list admissionregistration.k8s.io/validatingwebhookconfigurations name=kadmit",
		"list discovery.k8s.io/endpointslices",
		"patch admissionregistration.k8s.io/mutatingwebhookconfigurations name=kadmit",
		"patch admissionregistration.k8s.io/validatingwebhookconfigurations name=kadmit",
		"patch core/events",
		"watch admissionregistration.k8s.io/mutatingwebhookconfigurations name=kadmit",
		"watch admissionregistration.k8s.io/validatingwebhookconfigurations name=kadmit",
	}
	if !slices.Equal(files, want) {
		t.Errorf("files mode grants\n%s\nwant\n%s", strings.Join(files, "\n"), strings.Join(want, "\n"))
	}
	filesNoReg := grantsOf(t, render(t, "kadmit", chart.Namespace, map[string]any{"tls": map[string]any{"mode": "files"}, "register": false, "metrics": plainMetrics}))
	if len(filesNoReg) != 0 {
		t.Errorf("files mode without registration grants %v", filesNoReg)
	}

	cp := render(t, "kadmit", chart.Namespace, clusterPolicies)
	reads := mustFind(t, cp, "ClusterRole", "kadmit-system:kadmit-cluster-reads")
	gs, err := audit.Grants(reads)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, g := range gs {
		got = append(got, strings.TrimSuffix(g.String(), " ("+g.Role+")"))
	}
	slices.Sort(got)
	wantReads := []string{
		"list core/namespaces", "list core/pods", "list kueue.x-k8s.io/localqueues", "list scheduling.sigs.k8s.io/elasticquotas",
		"watch core/namespaces", "watch core/pods", "watch kueue.x-k8s.io/localqueues", "watch scheduling.sigs.k8s.io/elasticquotas",
	}
	if !slices.Equal(got, wantReads) {
		t.Errorf("cluster reads %v, want %v", got, wantReads)
	}
	// colocation without a namespaceSelector reads no namespaces
	only := map[string]any{"config": map[string]any{"apiVersion": "kadmit.io/v1alpha1", "kind": "Configuration", "policies": map[string]any{
		"colocation": map[string]any{"enabled": true, "profiles": []any{map[string]any{"name": "x", "labels": map[string]any{"a": "b"}}}}}}}
	if cr := render(t, "kadmit", chart.Namespace, only).Find("ClusterRole", "kadmit-system:kadmit-cluster-reads"); cr != nil {
		t.Errorf("colocation without namespaceSelector grants cluster reads: %v", cr.Object["rules"])
	}
	var dep appsv1.Deployment
	toTyped(t, mustFind(t, cp, "Deployment", "kadmit"), &dep)
	if !slices.Contains(dep.Spec.Template.Spec.Containers[0].Args, "--config=/etc/kadmit/config/config.yaml") {
		t.Errorf("config set but no --config: %q", dep.Spec.Template.Spec.Containers[0].Args)
	}
	mustFind(t, cp, "ConfigMap", "kadmit-config")
}

// TestNetworkPolicy: ingress to the webhook port only from the configured
// API server sources, to the metrics port only from the monitoring
// namespace; off with networkPolicy.enabled=false.
func TestNetworkPolicy(t *testing.T) {
	np := mustFind(t, render(t, "kadmit", chart.Namespace, map[string]any{"networkPolicy": map[string]any{
		"webhook": map[string]any{"apiServerCIDRs": []any{"10.0.0.10/32"}},
	}}), "NetworkPolicy", "kadmit")
	ingress, _, _ := unstructured.NestedSlice(np.Object, "spec", "ingress")
	if len(ingress) != 2 {
		t.Fatalf("ingress rules: %v", ingress)
	}
	webhook, metrics := ingress[0].(map[string]any), ingress[1].(map[string]any)
	port := func(rule map[string]any) any { return rule["ports"].([]any)[0].(map[string]any)["port"] }
	if port(webhook) != "https" || port(metrics) != "metrics" {
		t.Fatalf("ports: %v %v", port(webhook), port(metrics))
	}
	cidr, _, _ := unstructured.NestedString(webhook["from"].([]any)[0].(map[string]any), "ipBlock", "cidr")
	if cidr != "10.0.0.10/32" {
		t.Errorf("webhook source %v", webhook["from"])
	}
	ns, _, _ := unstructured.NestedString(metrics["from"].([]any)[0].(map[string]any), "namespaceSelector", "matchLabels", "kubernetes.io/metadata.name")
	if ns != "monitoring" {
		t.Errorf("metrics source %v", metrics["from"])
	}
	if render(t, "kadmit", chart.Namespace, map[string]any{"networkPolicy": map[string]any{"enabled": false}}).Find("NetworkPolicy", "kadmit") != nil {
		t.Error("networkPolicy.enabled=false still renders a NetworkPolicy")
	}
}
