package serve

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/client-go/rest"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/builtin"
	"github.com/kadmit/kadmit/internal/celpolicy"
	"github.com/kadmit/kadmit/internal/metrics"
)

// withMetrics gives r real reload metrics on a fresh registry.
func withMetrics(t *testing.T, r *reloader) *prometheus.Registry {
	t.Helper()
	reg := prometheus.NewRegistry()
	var err error
	if r.metrics, err = metrics.NewConfigReloads(reg); err != nil {
		t.Fatal(err)
	}
	if r.declaredMetric, err = metrics.NewDeclaredPolicies(reg); err != nil {
		t.Fatal(err)
	}
	return reg
}

func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// A policies ConfigMap that does not compile at start does not stop serve:
// the built-in policies are served (and registered), the declaredPolicies
// condition says why the declared ones are not, and the first edit that
// compiles serves them and clears the condition.
func TestStartWithBrokenPoliciesServesBuiltins(t *testing.T) {
	r, declared := testReloader(t)
	reg := withMetrics(t, r)
	r.wantDocs, r.haveDocs = celpolicy.ConfigMapDocuments(policyCM(map[string]string{"a.yaml": maxReplicasVAP("a", "(")})), true
	hooks, err := r.start(r.ctx, nil)
	if err != nil {
		t.Fatalf("start with a broken declared set: %v", err)
	}
	var names []string
	for _, h := range hooks {
		names = append(names, h.Policy)
	}
	for _, want := range []string{"pod-name", "lifespan", "kadmit-policies"} {
		if !slices.Contains(names, want) {
			t.Errorf("started hooks %v lack the built-in %s", names, want)
		}
	}
	for _, n := range names {
		if strings.HasPrefix(n, "vap-") {
			t.Errorf("declared hook %s served from a set that does not compile", n)
		}
	}
	err = r.declaredReady()
	if err == nil || !strings.Contains(err.Error(), "data[a.yaml]") || !strings.Contains(err.Error(), "compil") {
		t.Fatalf("declaredPolicies condition = %v, want the compile error naming the key", err)
	}
	if g := gauge(t, reg, "kadmit_declared_policies_unserved"); g != 1 {
		t.Fatalf("kadmit_declared_policies_unserved = %v, want 1", g)
	}
	// The informer's first event carries the same data: nothing to retry.
	r.serve = func([]*admission.Webhook) { t.Error("an unchanged ConfigMap was rebuilt") }
	r.policyConfigMap(policyCM(map[string]string{"a.yaml": maxReplicasVAP("a", "(")}))
	if n := testutil.CollectAndCount(reg, "kadmit_config_reloads_total"); n != 0 {
		t.Fatalf("%d reload series after an unchanged ConfigMap", n)
	}

	r2, declared2 := testReloader(t)
	r.serve, r.register = r2.serve, r2.register
	r.policyConfigMap(policyCM(map[string]string{"a.yaml": maxReplicasVAP("a", "5")}))
	if got := declared2(); !slices.Equal(got, []string{"vap-a"}) {
		t.Fatalf("after a repairing edit: declared %v", got)
	}
	if err := r.declaredReady(); err != nil {
		t.Fatalf("declaredPolicies after the repair: %v", err)
	}
	if g := gauge(t, reg, "kadmit_declared_policies_unserved"); g != 0 {
		t.Fatalf("kadmit_declared_policies_unserved = %v after the repair, want 0", g)
	}
	_ = declared
}

// /readyz repeats at most maxReadyzReason bytes of the load error.
func TestDeclaredReadyBounded(t *testing.T) {
	r, _ := testReloader(t)
	r.setUnserved(errors.New(strings.Repeat("x", 100_000)))
	err := r.declaredReady()
	if err == nil || len(err.Error()) > maxReadyzReason+200 || !strings.Contains(err.Error(), "bytes cut]") {
		t.Fatalf("declaredPolicies reason of %d bytes", len(err.Error()))
	}
}

// A ConfigMap that cannot be read at start (missing) degrades the same way.
func TestStartWithUnreadablePoliciesConfigMap(t *testing.T) {
	r, _ := testReloader(t)
	if _, err := r.start(r.ctx, os.ErrNotExist); err != nil {
		t.Fatal(err)
	}
	if err := r.declaredReady(); err == nil {
		t.Fatal("declaredPolicies holds without a ConfigMap")
	}
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

// A valid configuration edit refused because a --policies file does not
// compile is applied when the file is repaired (before: never, until the
// configuration changed again); a policies ConfigMap edit refused for the
// same cause is applied at the same time.
func TestRefusedEditRetriedWhenItsCauseChanges(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "f.yaml")
	writeFile(t, file, maxReplicasVAP("f", "3"))
	r, declared := testReloader(t)
	reg := withMetrics(t, r)
	r.opts.PolicyPaths = []string{dir}
	if _, err := r.start(r.ctx, nil); err != nil {
		t.Fatal(err)
	}
	r.apply("declared policies") // serve the started set through r.serve
	if got := declared(); !slices.Equal(got, []string{"vap-f"}) {
		t.Fatalf("started with %v", got)
	}

	writeFile(t, file, maxReplicasVAP("f", "("))
	r.rebuild() // the file watch: refused, the running set stays
	noPodName, err := builtin.Config.Parse([]byte("apiVersion: kadmit.io/v1alpha1\nkind: Configuration\npolicies:\n  podName: {enabled: false}\n"))
	if err != nil {
		t.Fatal(err)
	}
	r.reload(noPodName)
	r.policyConfigMap(policyCM(map[string]string{"a.yaml": maxReplicasVAP("a", "5")}))
	if r.cfg == noPodName || len(r.policyDocs) != 0 {
		t.Fatalf("edits applied with a --policies file that does not compile")
	}
	if got := reloads(t, reg, "false"); got != 3 {
		t.Fatalf("failed reloads = %v, want 3 (file, configuration, ConfigMap)", got)
	}
	writeFile(t, file, maxReplicasVAP("f", "4"))
	r.rebuild()
	if r.cfg != noPodName {
		t.Fatal("the refused configuration edit was not applied when the file it waited on was repaired")
	}
	if got := declared(); !slices.Equal(got, []string{"vap-f", "vap-a"}) {
		t.Fatalf("declared %v after the repair, want the file's and the ConfigMap's", got)
	}
	if len(r.policyDocs) != 1 {
		t.Fatalf("running ConfigMap documents %d, want 1", len(r.policyDocs))
	}
	if got := reloads(t, reg, "true"); got != 2 {
		t.Fatalf("applied reloads = %v, want 2 (start, repair)", got)
	}
}

// A configuration that fails on its own does not hold back a declared
// change: that is applied with the running configuration, and the
// configuration stays wanted.
func TestBrokenConfigurationDoesNotHoldBackPolicies(t *testing.T) {
	r, declared := testReloader(t)
	withMetrics(t, r)
	if _, err := r.start(r.ctx, nil); err != nil {
		t.Fatal(err)
	}
	// A configuration whose hooks cannot build: a cluster cache that
	// cannot start (no kubeconfig here).
	quota, err := builtin.Config.Parse([]byte("apiVersion: kadmit.io/v1alpha1\nkind: Configuration\npolicies:\n  elasticQuota: {enabled: true}\n"))
	if err != nil {
		t.Fatal(err)
	}
	r.kube = func() (*rest.Config, error) { return nil, errors.New("no cluster in this test") }
	r.reload(quota)
	if r.cfg == quota {
		t.Fatal("a configuration that does not build was applied")
	}
	r.policyConfigMap(policyCM(map[string]string{"a.yaml": maxReplicasVAP("a", "5")}))
	if got := declared(); !slices.Equal(got, []string{"vap-a"}) {
		t.Fatalf("declared %v: a failing configuration held back a valid policies edit", got)
	}
	if r.wantCfg != quota || r.cfg == quota {
		t.Fatal("the failing configuration is no longer wanted, or was applied")
	}
}

func reloads(t *testing.T, reg *prometheus.Registry, success string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "kadmit_config_reloads_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "success" && l.GetValue() == success {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
