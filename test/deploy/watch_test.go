package deploy

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/promql/parser"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	"github.com/kadmit/kadmit/test/deploy/chart"
	"github.com/kadmit/kadmit/test/deploy/internal/audit"
)

const watchUser = "system:serviceaccount:" + chart.Namespace + ":kadmit-watch"

// watchOn is watch.enabled merged with more watch values.
func watchOn(more map[string]any) map[string]any {
	w := map[string]any{"enabled": true}
	for k, v := range more {
		w[k] = v
	}
	return map[string]any{"watch": w}
}

// isWatchObject: rendered for kadmit watch (its labels say so).
func isWatchObject(o *unstructured.Unstructured) bool {
	return o.GetLabels()["app.kubernetes.io/component"] == "watch"
}

// TestWatchRender: off by default (no object of the watch), on it renders
// the Deployment of the contract's `kadmit watch` with its own
// ServiceAccount, RBAC, PDB and metrics Service, whose selectors and the
// serving ones never cross.
func TestWatchRender(t *testing.T) {
	off := render(t, chart.ReleaseName, chart.Namespace, nil)
	for _, o := range append(off.Objects, off.Hooks...) {
		if isWatchObject(o) || strings.Contains(o.GetName(), "watch") {
			t.Errorf("watch off by default, yet %s/%s is rendered", o.GetKind(), o.GetName())
		}
	}
	if strings.Contains(off.Manifest, "kadmit-watch") {
		t.Error("default manifest mentions kadmit-watch")
	}

	r := render(t, chart.ReleaseName, chart.Namespace, watchOn(nil))
	var dep appsv1.Deployment
	toTyped(t, mustFind(t, r, "Deployment", "kadmit-watch"), &dep)
	if *dep.Spec.Replicas != 2 {
		t.Errorf("watch replicas %d, want 2", *dep.Spec.Replicas)
	}
	spec := dep.Spec.Template.Spec
	if spec.ServiceAccountName != "kadmit-watch" {
		t.Errorf("serviceAccountName %q", spec.ServiceAccountName)
	}
	c := spec.Containers[0]
	want := []string{"watch", "--namespace=kadmit-system", "--lease-name=kadmit-watch", "--lease-duration=15s",
		"--renew-deadline=10s", "--retry-period=2s", "--metrics-addr=:8080", "--handshake-interval=20s",
		"--debounce=500ms", "--max-webhooks=500", "--log-format=json", "--log-level=info"}
	if !slices.Equal(c.Args, want) {
		t.Errorf("watch args\n got %q\nwant %q", c.Args, want)
	}
	for _, p := range []struct {
		probe *corev1.Probe
		path  string
	}{{c.ReadinessProbe, "/readyz"}, {c.LivenessProbe, "/healthz"}, {c.StartupProbe, "/healthz"}} {
		if p.probe == nil || p.probe.HTTPGet.Path != p.path || p.probe.HTTPGet.Port.String() != "metrics" || p.probe.HTTPGet.Scheme != "" {
			t.Errorf("probe %+v, want plain HTTP %s on port metrics", p.probe, p.path)
		}
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() || c.Resources.Limits.Cpu().IsZero() {
		t.Errorf("resources %+v", c.Resources)
	}
	sc := c.SecurityContext
	if sc == nil || !*sc.ReadOnlyRootFilesystem || *sc.AllowPrivilegeEscalation || !*sc.RunAsNonRoot ||
		!slices.Contains(sc.Capabilities.Drop, "ALL") || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("watch container securityContext not restricted: %+v", sc)
	}
	var serving appsv1.Deployment
	toTyped(t, mustFind(t, r, "Deployment", "kadmit"), &serving)
	if !slices.Equal(serving.Spec.Template.Spec.Containers[0].Args, mustServeArgs(t)) {
		t.Error("watch.enabled changed the serving Deployment's args")
	}
	if *spec.SecurityContext.RunAsUser != *serving.Spec.Template.Spec.SecurityContext.RunAsUser {
		t.Error("watch pod securityContext differs from the serving pods'")
	}

	// Selectors: the webhook Service, the serving PDB and the serving
	// Deployment never select watch pods (KD301 would flag it); the watch's
	// metrics Service and PDB select only them.
	watchPods := labels.Set(dep.Spec.Template.Labels)
	servingPods := labels.Set(serving.Spec.Template.Labels)
	sel := func(kind, name string, path ...string) labels.Selector {
		m, _, _ := unstructured.NestedStringMap(mustFind(t, r, kind, name).Object, path...)
		return labels.SelectorFromSet(m)
	}
	for _, s := range []struct {
		kind, name string
		path       []string
		watch      bool
	}{
		{"Service", "kadmit", []string{"spec", "selector"}, false},
		{"Service", "kadmit-metrics", []string{"spec", "selector"}, false},
		{"PodDisruptionBudget", "kadmit", []string{"spec", "selector", "matchLabels"}, false},
		{"Deployment", "kadmit", []string{"spec", "selector", "matchLabels"}, false},
		{"Service", "kadmit-watch-metrics", []string{"spec", "selector"}, true},
		{"PodDisruptionBudget", "kadmit-watch", []string{"spec", "selector", "matchLabels"}, true},
		{"Deployment", "kadmit-watch", []string{"spec", "selector", "matchLabels"}, true},
	} {
		x := sel(s.kind, s.name, s.path...)
		if x.Matches(watchPods) != s.watch || x.Matches(servingPods) == s.watch {
			t.Errorf("%s/%s selects watch pods: %v, serving pods: %v; want only the %s pods", s.kind, s.name,
				x.Matches(watchPods), x.Matches(servingPods), map[bool]string{true: "watch", false: "serving"}[s.watch])
		}
	}
	mustFind(t, r, "ServiceAccount", "kadmit-watch")
	mustFind(t, r, "NetworkPolicy", "kadmit-watch")
	if r.Find("ClusterRole", "kadmit-system:kadmit-watch-probe") != nil {
		t.Error("probe create RBAC rendered without watch.probe.grantCreate")
	}

	// One replica: no PDB (it would block every drain).
	one := render(t, chart.ReleaseName, chart.Namespace, watchOn(map[string]any{"replicas": 1}))
	if one.Find("PodDisruptionBudget", "kadmit-watch") != nil {
		t.Error("watch.replicas=1 still renders a PodDisruptionBudget")
	}

	// --probe: the flags, and create RBAC only when asked for.
	pr := render(t, chart.ReleaseName, chart.Namespace, watchOn(map[string]any{"probe": map[string]any{"enabled": true, "grantCreate": true}}))
	var pdep appsv1.Deployment
	toTyped(t, mustFind(t, pr, "Deployment", "kadmit-watch"), &pdep)
	for _, a := range []string{"--probe", "--probe-interval=5m", "--probe-qps=0.2"} {
		if !slices.Contains(pdep.Spec.Template.Spec.Containers[0].Args, a) {
			t.Errorf("probe on: args %q lack %s", pdep.Spec.Template.Spec.Containers[0].Args, a)
		}
	}
	mustFind(t, pr, "ClusterRole", "kadmit-system:kadmit-watch-probe")

	// Monitoring: a ServiceMonitor for the watch, the kadmit-watch group
	// only with the watch.
	mon := map[string]any{"serviceMonitor": map[string]any{"enabled": true}, "prometheusRule": map[string]any{"enabled": true}}
	m := render(t, chart.ReleaseName, chart.Namespace, map[string]any{"metrics": mon, "watch": map[string]any{"enabled": true}})
	mustFind(t, m, "ServiceMonitor", "kadmit-watch")
	if groupNames(t, m) != "kadmit,kadmit-watch" {
		t.Errorf("rule groups %s with the watch", groupNames(t, m))
	}
	mOff := render(t, chart.ReleaseName, chart.Namespace, map[string]any{"metrics": mon})
	if groupNames(t, mOff) != "kadmit" || mOff.Find("ServiceMonitor", "kadmit-watch") != nil {
		t.Errorf("watch off: rule groups %s, watch ServiceMonitor rendered %v", groupNames(t, mOff), mOff.Find("ServiceMonitor", "kadmit-watch") != nil)
	}

	// Lint with the watch and every option on.
	msgs, err := chart.Lint(map[string]any{"metrics": mon, "watch": map[string]any{"enabled": true,
		"probe":       map[string]any{"enabled": true, "grantCreate": true},
		"certManager": map[string]any{"readCertificates": true, "secretNamespaces": []any{"cert-manager"}}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, msg := range msgs {
		if chart.Severity(msg) != "INFO" {
			t.Errorf("lint: %s", msg.Error())
		}
	}
}

func mustServeArgs(t *testing.T) []string {
	t.Helper()
	var d appsv1.Deployment
	toTyped(t, mustFind(t, render(t, chart.ReleaseName, chart.Namespace, nil), "Deployment", "kadmit"), &d)
	return d.Spec.Template.Spec.Containers[0].Args
}

func groupNames(t *testing.T, r *chart.Rendered) string {
	t.Helper()
	groups, _, _ := unstructured.NestedSlice(mustFind(t, r, "PrometheusRule", "kadmit").Object, "spec", "groups")
	var names []string
	for _, g := range groups {
		names = append(names, g.(map[string]any)["name"].(string))
	}
	return strings.Join(names, ",")
}

// watchWriteOK is every non-read grant kadmit watch may have: its Events
// in "default" (Events of cluster-scoped configurations land there), and
// its own Lease.
func watchWriteOK(g audit.Grant) bool {
	switch {
	case g.Group == "" && g.Resource == "events" && g.Namespace == "default" && (g.Verb == "create" || g.Verb == "patch"):
		return true
	case g.Group == "coordination.k8s.io" && g.Resource == "leases" && g.Namespace == chart.Namespace &&
		(g.Verb == "create" || (g.Verb == "update" && g.Name == "kadmit-watch")):
		return true
	}
	return false
}

var readVerbs = []string{"get", "list", "watch"}

// TestWatchClusterRoleReadOnly: whatever the watch values, the watch's
// ServiceAccount gets read verbs, its Events and its Lease, nothing else;
// Secrets never cluster-wide. Only watch.probe.grantCreate adds create, on
// exactly the probe resources. Adding any other verb to the chart fails here.
func TestWatchClusterRoleReadOnly(t *testing.T) {
	for name, more := range map[string]map[string]any{
		"defaults":         nil,
		"probe, no grant":  {"probe": map[string]any{"enabled": true}},
		"cert-manager":     {"certManager": map[string]any{"readCertificates": true, "secretNamespaces": []any{"cert-manager", "lws-system"}}},
		"probe with grant": {"probe": map[string]any{"enabled": true, "grantCreate": true}},
	} {
		r := render(t, chart.ReleaseName, chart.Namespace, watchOn(more))
		grants, err := audit.BoundGrants(watchUser, r.Objects...)
		if err != nil {
			t.Fatal(err)
		}
		if len(grants) == 0 {
			t.Fatalf("%s: nothing granted to %s", name, watchUser)
		}
		probe := dig(more, "probe", "grantCreate") == true
		probeRes := map[string]bool{}
		if probe {
			for _, pr := range []string{"/pods", "/configmaps", "/secrets", "/serviceaccounts", "/services", "/nodes", "apps/deployments",
				"apps/replicasets", "apps/statefulsets", "apps/daemonsets", "batch/jobs", "coordination.k8s.io/leases"} {
				probeRes[pr] = false
			}
		}
		for _, g := range grants {
			switch {
			case slices.Contains(readVerbs, g.Verb):
				if g.Resource == "secrets" && g.Namespace == "" {
					t.Errorf("%s: %s: Secrets readable cluster-wide", name, g)
				}
			case watchWriteOK(g):
			case probe && g.Verb == "create" && g.Role == "ClusterRole/kadmit-system:kadmit-watch-probe":
				if _, ok := probeRes[g.Group+"/"+g.Resource]; !ok {
					t.Errorf("%s: probe create on %s, not a probe resource", name, g)
				}
				probeRes[g.Group+"/"+g.Resource] = true
			default:
				t.Errorf("%s: the watch is granted %s: not read-only, not its Events or Lease", name, g)
			}
		}
		for res, seen := range probeRes {
			if !seen {
				t.Errorf("%s: no probe create on %s", name, res)
			}
		}
		if problems := audit.CheckBindings(r.Objects, map[string]string{"ClusterRole/kadmit-system:kadmit-metrics-reader": "bound by users to their scraper"}); len(problems) > 0 {
			t.Errorf("%s: %s", name, strings.Join(problems, "; "))
		}
	}
	// The informer resources of internal/watch/access.go are all granted
	// list and watch: a resource added there without the chart following
	// fails here (and, on a real API server, TestWatchRBACOnRealAPIServer).
	r := render(t, chart.ReleaseName, chart.Namespace, watchOn(nil))
	grants, err := audit.BoundGrants(watchUser, r.Objects...)
	if err != nil {
		t.Fatal(err)
	}
	for _, res := range watchInformerResources(t) {
		for _, v := range []string{"list", "watch"} {
			c := audit.Call{Group: res[0], Resource: res[1], Verb: v, Allowed: true}
			if !slices.ContainsFunc(grants, func(g audit.Grant) bool { return g.Covers(c) }) {
				t.Errorf("watch informs on %s but the chart does not grant it", c)
			}
		}
	}
}

func dig(m map[string]any, keys ...string) any {
	var v any = m
	for _, k := range keys {
		mm, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = mm[k]
	}
	return v
}

// watchInformerResources reads internal/watch/access.go's informerResources
// ({"group", "resource"} pairs).
func watchInformerResources(t *testing.T) [][2]string {
	t.Helper()
	root, err := chart.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "internal", "watch", "access.go"))
	if err != nil {
		t.Fatal(err)
	}
	src := string(b)
	i := strings.Index(src, "var informerResources")
	if i < 0 {
		t.Fatal("internal/watch/access.go: no informerResources")
	}
	src = src[i : i+strings.Index(src[i:], "\n}\n")]
	var out [][2]string
	for _, m := range regexp.MustCompile(`\{"([^"]*)", "([^"]+)"\}`).FindAllStringSubmatch(src, -1) {
		out = append(out, [2]string{m[1], m[2]})
	}
	if len(out) < 10 {
		t.Fatalf("read %d informer resources from access.go", len(out))
	}
	return out
}

// contractMetrics are the metric families of WATCH-CONTRACT.md (issue 15),
// as internal/watch/metrics.go registers them.
var contractMetrics = []string{
	"kadmit_watch_webhook_info", "kadmit_watch_findings", "kadmit_watch_ready_endpoints",
	"kadmit_watch_serving_cert_expiry_timestamp_seconds", "kadmit_watch_ca_bundle_expiry_timestamp_seconds",
	"kadmit_watch_handshake_duration_seconds", "kadmit_watch_handshake_failures_total",
	"kadmit_watch_probe_duration_seconds", "kadmit_watch_probe_failures_total",
	"kadmit_watch_evaluations_total", "kadmit_watch_last_evaluation_timestamp_seconds", "kadmit_watch_leader",
	"kadmit_watch_untracked_webhooks", "kadmit_watch_policy_findings",
}

// contractAlerts are the kadmit-watch group's alerts, exactly.
var contractAlerts = []string{
	"KadmitWebhookCertificateExpiringSoon", "KadmitWebhookCABundleExpiringSoon", "KadmitFailWebhookNoEndpoints",
	"KadmitFailWebhookOneEndpoint", "KadmitWebhookSelectorCollision", "KadmitWebhookSelfInterception",
	"KadmitWebhookTLSBroken", "KadmitWebhookProbeFailing", "KadmitWatchDown",
	"KadmitWebhookFieldManagerFight", "KadmitWebhookTimeoutBudget", "KadmitWebhookNetworkPolicyBlocks",
	"KadmitWebhookNoDrainOnTermination",
}

type rulesFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Alert       string            `json:"alert"`
			Expr        string            `json:"expr"`
			For         string            `json:"for"`
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
		} `json:"rules"`
	} `json:"groups"`
}

// grafanaVars replaces the dashboard's Grafana variables by values PromQL
// parses, as Grafana would before querying.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$namespace", ".*")

// TestWatchRulesAndDashboard: every expression of the generated rules files
// and of the dashboard parses as PromQL (Prometheus's own parser); the
// kadmit-watch group holds exactly the contract's alerts, each with a
// severity, summary and description, and every kadmit_watch_* name that
// the alerts and the dashboard query is a contract metric internal/watch
// registers (histograms by their _bucket series).
func TestWatchRulesAndDashboard(t *testing.T) {
	files, err := chart.Generated()
	if err != nil {
		t.Fatal(err)
	}
	p := parser.NewParser(parser.Options{})
	var exprs []string
	var alerts []string
	for _, f := range []string{"deploy/prometheus/kadmit-rules.yaml", "deploy/prometheus/kadmit-watch-rules.yaml"} {
		var rf rulesFile
		if err := yaml.Unmarshal(files[f], &rf); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, g := range rf.Groups {
			if (g.Name == chart.WatchRuleGroup) != strings.Contains(f, "watch") {
				t.Errorf("%s holds group %s", f, g.Name)
			}
			for _, r := range g.Rules {
				if _, err := p.ParseExpr(r.Expr); err != nil {
					t.Errorf("%s: alert %s: %v", f, r.Alert, err)
				}
				if g.Name != chart.WatchRuleGroup {
					continue
				}
				alerts = append(alerts, r.Alert)
				exprs = append(exprs, r.Expr)
				if s := r.Labels["severity"]; s != "warning" && s != "critical" {
					t.Errorf("%s: severity %q", r.Alert, s)
				}
				if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
					t.Errorf("%s: summary or description missing", r.Alert)
				}
			}
		}
	}
	if !slices.Equal(sortedCopy(alerts), sortedCopy(contractAlerts)) {
		t.Errorf("kadmit-watch alerts %v, want the contract's %v", alerts, contractAlerts)
	}
	var dash struct {
		Panels []struct {
			Type, Title string
			Targets     []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(files["deploy/dashboards/kadmit.json"], &dash); err != nil {
		t.Fatal(err)
	}
	row := false
	for _, pn := range dash.Panels {
		if pn.Type == "row" && pn.Title == "Webhook health (kadmit watch)" {
			row = true
		}
		for _, tg := range pn.Targets {
			e := grafanaVars.Replace(tg.Expr)
			if _, err := p.ParseExpr(e); err != nil {
				t.Errorf("dashboard panel %q: %v", pn.Title, err)
			}
			exprs = append(exprs, e)
		}
	}
	if !row {
		t.Error("dashboard has no row \"Webhook health (kadmit watch)\"")
	}
	root, err := chart.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile(filepath.Join(root, "internal", "watch", "metrics.go"))
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	for _, e := range exprs {
		ast, err := p.ParseExpr(e)
		if err != nil {
			continue
		}
		parser.Inspect(ast, func(n parser.Node, _ []parser.Node) error {
			if vs, ok := n.(*parser.VectorSelector); ok && strings.HasPrefix(vs.Name, "kadmit_watch_") {
				used[vs.Name] = true
			}
			return nil
		})
	}
	if len(used) < 8 {
		t.Errorf("only %d kadmit_watch_* names queried: %v", len(used), used)
	}
	for m := range used {
		family := strings.TrimSuffix(m, "_bucket")
		if !slices.Contains(contractMetrics, family) {
			t.Errorf("%s is queried but is no contract metric", m)
		}
		if !strings.Contains(string(src), `Name: "`+family+`"`) {
			t.Errorf("%s is queried but internal/watch/metrics.go does not register %s", m, family)
		}
	}
}

func sortedCopy(s []string) []string {
	out := slices.Clone(s)
	sort.Strings(out)
	return out
}
