package doctor

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// bhook is one webhook of a KD608 test: its own configuration, a URL
// client config (never dialed: the tests' Dial refuses).
type bhook struct {
	kind     string
	cfg      string
	timeout  int32
	ifNeeded bool
	nsSel    *metav1.LabelSelector
	rules    []admissionregistrationv1.RuleWithOperations
}

func budgetSnapshot(hs ...bhook) *Snapshot {
	s := &Snapshot{Namespaces: map[string]map[string]string{"default": nil, "kube-system": nil, "kube-node-lease": nil}, NamespacesKnown: true, Backends: map[string]*Backend{}}
	none := admissionregistrationv1.SideEffectClassNone
	ignore := admissionregistrationv1.Ignore
	for i, h := range hs {
		u := fmt.Sprintf("https://127.0.0.1:%d/", 30000+i)
		to := h.timeout
		cc := admissionregistrationv1.WebhookClientConfig{URL: &u}
		name := h.cfg + ".example.com"
		if h.kind == KindMutating {
			var rp *admissionregistrationv1.ReinvocationPolicyType
			if h.ifNeeded {
				p := admissionregistrationv1.IfNeededReinvocationPolicy
				rp = &p
			}
			s.Webhooks = append(s.Webhooks, FromMutating(&admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: h.cfg},
				Webhooks: []admissionregistrationv1.MutatingWebhook{{Name: name, ClientConfig: cc, Rules: h.rules, TimeoutSeconds: &to, ReinvocationPolicy: rp,
					SideEffects: &none, FailurePolicy: &ignore, AdmissionReviewVersions: []string{"v1"}, NamespaceSelector: h.nsSel}}})...)
		} else {
			s.Webhooks = append(s.Webhooks, FromValidating(&admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: h.cfg},
				Webhooks: []admissionregistrationv1.ValidatingWebhook{{Name: name, ClientConfig: cc, Rules: h.rules, TimeoutSeconds: &to,
					SideEffects: &none, FailurePolicy: &ignore, AdmissionReviewVersions: []string{"v1"}, NamespaceSelector: h.nsSel}}})...)
		}
	}
	return s
}

func diagnoseBudget(t *testing.T, snap *Snapshot, names ...string) *Report {
	t.Helper()
	rep, err := Diagnose(context.Background(), nil, snap, Options{Names: names,
		Dial: func(context.Context, string, string) (net.Conn, error) { return nil, ErrDialNotAllowed }})
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

var podRules = []admissionregistrationv1.RuleWithOperations{rule([]string{""}, []string{"v1"}, []string{"pods"}, "CREATE", "UPDATE")}

// A pod pile-up as field reports show it: Istio's sidecar injector, a
// Kyverno-like mutating webhook with reinvocationPolicy IfNeeded, Vault's
// agent injector at the 30s maximum, then Gatekeeper (3s) and a Kyverno-like
// validating webhook in parallel. 10 + 2x10 + 30 + max(3, 10) = 70s > 60s.
func TestTimeoutBudgetPodPileUp(t *testing.T) {
	snap := budgetSnapshot(
		bhook{kind: KindMutating, cfg: "istio-sidecar-injector", timeout: 10, rules: podRules},
		bhook{kind: KindMutating, cfg: "kyverno-resource-mutating", timeout: 10, ifNeeded: true, rules: podRules},
		bhook{kind: KindMutating, cfg: "vault-agent-injector", timeout: 30, rules: podRules},
		bhook{kind: KindValidating, cfg: "gatekeeper-validating", timeout: 3, rules: podRules},
		bhook{kind: KindValidating, cfg: "kyverno-resource-validating", timeout: 10, rules: podRules},
		// Alone on its resource: no budget to speak of.
		bhook{kind: KindValidating, cfg: "lonely", timeout: 30, rules: []admissionregistrationv1.RuleWithOperations{rule([]string{"example.com"}, []string{"v1"}, []string{"widgets"}, "*")}},
	)
	rep := diagnoseBudget(t, snap)
	for _, cfg := range []string{"istio-sidecar-injector", "kyverno-resource-mutating", "vault-agent-injector", "gatekeeper-validating", "kyverno-resource-validating"} {
		wr := rep.Webhook(cfg, cfg+".example.com")
		fs := wr.ByID(IDTimeoutBudget)
		if len(fs) != 1 {
			t.Fatalf("%s: %d KD608, want 1: %+v", cfg, len(fs), wr.Findings)
		}
		f := fs[0]
		for _, want := range []string{"CREATE pods (v1)", "UPDATE pods (v1)", "up to 70s for 5 webhooks", "--request-timeout", "reinvocationPolicy IfNeeded: 2x10s",
			"vault-agent-injector.example.com of vault-agent-injector (30s)", "only the slowest, 10s, counts"} {
			if !strings.Contains(f.What, want) {
				t.Errorf("%s: What lacks %q: %s", cfg, want, f.What)
			}
		}
		if f.Severity != SeverityWarning || !strings.Contains(f.Why, "mutating/dispatcher.go") || !strings.Contains(f.Why, "Ignore too") {
			t.Errorf("%s: %+v", cfg, f)
		}
	}
	// The fixes: vault (mutating, 30s) down by the 10s excess; Gatekeeper
	// is not the slowest validating webhook, so lowering it cannot help.
	vault := rep.Webhook("vault-agent-injector", "vault-agent-injector.example.com").ByID(IDTimeoutBudget)[0]
	if !strings.Contains(vault.Fix, `"path":"/webhooks/0/timeoutSeconds","value":20`) || !strings.Contains(vault.Fix, "worst case to 60s") {
		t.Errorf("vault fix: %s", vault.Fix)
	}
	gk := rep.Webhook("gatekeeper-validating", "gatekeeper-validating.example.com").ByID(IDTimeoutBudget)[0]
	if !strings.Contains(gk.Fix, "does not help") || !strings.Contains(gk.Fix, "kubectl patch mutatingwebhookconfiguration vault-agent-injector") {
		t.Errorf("gatekeeper fix: %s", gk.Fix)
	}
	kyv := rep.Webhook("kyverno-resource-mutating", "kyverno-resource-mutating.example.com").ByID(IDTimeoutBudget)[0]
	if !strings.Contains(kyv.Fix, `"value":5`) { // 10s excess over 2 calls
		t.Errorf("IfNeeded fix: %s", kyv.Fix)
	}
	if rep.Webhook("lonely", "lonely.example.com").Has(IDTimeoutBudget) {
		t.Error("a webhook alone on its resource got KD608")
	}
}

// Three webhooks of the default 10s on pods (30s) are within the API
// server's 60s: no finding (the no-false-alarm side).
func TestTimeoutBudgetWithinBound(t *testing.T) {
	snap := budgetSnapshot(
		bhook{kind: KindMutating, cfg: "a", timeout: 10, rules: podRules},
		bhook{kind: KindMutating, cfg: "b", timeout: 10, ifNeeded: true, rules: podRules},
		bhook{kind: KindValidating, cfg: "c", timeout: 10, rules: podRules},
		bhook{kind: KindValidating, cfg: "d", timeout: 10, rules: podRules},
	)
	for _, w := range diagnoseBudget(t, snap).Webhooks {
		if w.Has(IDTimeoutBudget) {
			t.Errorf("%s: %+v", w.Webhook, w.ByID(IDTimeoutBudget))
		}
	}
}

// Lease renewals: 10s + 5s on leases exceed the kubelet's heartbeat and
// leader election's 10s; the same two webhooks on configmaps (15s) do not
// matter.
func TestTimeoutBudgetHeartbeat(t *testing.T) {
	leases := []admissionregistrationv1.RuleWithOperations{rule([]string{"coordination.k8s.io"}, []string{"v1"}, []string{"leases"}, "UPDATE")}
	cms := []admissionregistrationv1.RuleWithOperations{rule([]string{""}, []string{"v1"}, []string{"configmaps"}, "UPDATE")}
	snap := budgetSnapshot(
		bhook{kind: KindMutating, cfg: "lease-mutator", timeout: 10, rules: leases},
		bhook{kind: KindValidating, cfg: "lease-validator", timeout: 5, rules: leases},
		bhook{kind: KindMutating, cfg: "cm-mutator", timeout: 10, rules: cms},
		bhook{kind: KindValidating, cfg: "cm-validator", timeout: 5, rules: cms},
	)
	rep := diagnoseBudget(t, snap)
	f := rep.Webhook("lease-validator", "lease-validator.example.com").ByID(IDTimeoutBudget)
	if len(f) != 1 || !strings.Contains(f[0].What, "UPDATE leases (coordination.k8s.io/v1)") || !strings.Contains(f[0].What, "up to 15s") ||
		!strings.Contains(f[0].What, "heartbeat") || !strings.Contains(f[0].Why, "NotReady") {
		t.Fatalf("lease KD608: %+v", f)
	}
	if rep.Webhook("cm-mutator", "cm-mutator.example.com").Has(IDTimeoutBudget) {
		t.Error("15s on configmaps is within the API server's 60s")
	}
}

// namespaceSelectors: two webhooks whose selectors never pick the same
// namespace never add up; once one namespace carries both labels they do,
// and the finding names it.
func TestTimeoutBudgetNamespaceSelectors(t *testing.T) {
	team := func(v string) *metav1.LabelSelector {
		return &metav1.LabelSelector{MatchLabels: map[string]string{"team-" + v: "true"}}
	}
	hooks := []bhook{
		{kind: KindMutating, cfg: "team-a-injector", timeout: 30, ifNeeded: true, nsSel: team("a"), rules: podRules},
		{kind: KindMutating, cfg: "team-b-injector", timeout: 30, ifNeeded: true, nsSel: team("b"), rules: podRules},
	}
	snap := budgetSnapshot(hooks...)
	snap.Namespaces["a"] = map[string]string{"team-a": "true"}
	snap.Namespaces["b"] = map[string]string{"team-b": "true"}
	for _, w := range diagnoseBudget(t, snap).Webhooks {
		if w.Has(IDTimeoutBudget) {
			t.Errorf("disjoint namespaceSelectors: %+v", w.ByID(IDTimeoutBudget))
		}
	}
	snap = budgetSnapshot(hooks...)
	snap.Namespaces["shared"] = map[string]string{"team-a": "true", "team-b": "true"}
	f := diagnoseBudget(t, snap).Webhook("team-a-injector", "team-a-injector.example.com").ByID(IDTimeoutBudget)
	if len(f) != 1 || !strings.Contains(f[0].What, "in namespace shared") || !strings.Contains(f[0].What, "up to 120s") {
		t.Fatalf("shared namespace: %+v", f)
	}
	// Namespaces unreadable: counted, and said so.
	snap.NamespacesKnown = false
	f = diagnoseBudget(t, snap).Webhook("team-a-injector", "team-a-injector.example.com").ByID(IDTimeoutBudget)
	if len(f) != 1 || !strings.Contains(f[0].What, "namespaces could not be listed") {
		t.Fatalf("unknown namespaces: %+v", f)
	}
}

// The budget is computed over every webhook even when the report is
// restricted to one configuration; wildcard rules ("*" groups and
// resources) meet concrete ones, and the requests of one set of webhooks
// come as one finding.
func TestTimeoutBudgetAllWebhooksAndWildcards(t *testing.T) {
	star := []admissionregistrationv1.RuleWithOperations{rule([]string{"*"}, []string{"*"}, []string{"*"}, "*")}
	snap := budgetSnapshot(
		bhook{kind: KindMutating, cfg: "everything-mutating", timeout: 30, ifNeeded: true, rules: star},
		bhook{kind: KindValidating, cfg: "everything-validating", timeout: 15, rules: star},
		bhook{kind: KindValidating, cfg: "widgets", timeout: 30, rules: []admissionregistrationv1.RuleWithOperations{rule([]string{"example.com"}, []string{"v1"}, []string{"widgets"}, "CREATE")}},
	)
	rep := diagnoseBudget(t, snap, "widgets")
	if len(rep.Webhooks) != 1 {
		t.Fatalf("report restricted to widgets: %d webhooks", len(rep.Webhooks))
	}
	f := rep.Webhooks[0].ByID(IDTimeoutBudget)
	if len(f) != 1 || !strings.Contains(f[0].What, "CREATE widgets (example.com/v1)") || !strings.Contains(f[0].What, "everything-mutating.example.com") || !strings.Contains(f[0].What, "up to 90s for 3") {
		t.Fatalf("widgets: %+v", f)
	}
	// The two wildcard webhooks alone: every well-known resource, one
	// finding listing a bounded number of requests.
	all := diagnoseBudget(t, snap)
	fs := all.Webhook("everything-mutating", "everything-mutating.example.com").ByID(IDTimeoutBudget)
	if len(fs) != 3 {
		t.Fatalf("want 3 sets (heartbeats, widgets, the rest), the largest excess first: %+v", fs)
	}
	if !strings.Contains(fs[0].What, "UPDATE nodes (v1)") || !strings.Contains(fs[0].What, "UPDATE leases (coordination.k8s.io/v1)") || !strings.Contains(fs[0].Why, "also above the API server's") {
		t.Errorf("heartbeats: %+v", fs[0])
	}
	if !strings.Contains(fs[2].What, "CREATE pods (v1)") || !strings.Contains(fs[2].What, "more") || !strings.Contains(fs[2].What, "up to 75s") {
		t.Errorf("wildcards: %s", fs[2].What)
	}
}

// Bounds: the requests examined per run (MaxBudgetRequests, here a small
// limit) with a KD003 note on the webhooks left out; the findings per
// webhook (maxBudgetFindings); and 500 configurations of 10 webhooks are
// computed once per run, quickly.
func TestTimeoutBudgetBounds(t *testing.T) {
	var hs []bhook
	for i := range 8 {
		rs := []admissionregistrationv1.RuleWithOperations{rule([]string{fmt.Sprintf("g%d.example.com", i)}, []string{"v1"}, []string{"widgets"}, "*")}
		hs = append(hs, bhook{kind: KindMutating, cfg: fmt.Sprintf("m%d", i), timeout: 30, rules: rs}, bhook{kind: KindMutating, cfg: fmt.Sprintf("n%d", i), timeout: 30, rules: rs})
	}
	hs = append(hs, bhook{kind: KindValidating, cfg: "all", timeout: 30, rules: []admissionregistrationv1.RuleWithOperations{rule([]string{"*"}, []string{"*"}, []string{"*"}, "*")}})
	snap := budgetSnapshot(hs...)
	// 14 well-known resources x 3 operations come first, then 3
	// operations per widget group: 60 reach 6 of the 8 groups.
	bi := computeBudget(snap.Webhooks, snap, 60)
	if bi.examined != 60 || len(bi.truncated) != 4 {
		t.Errorf("examined %d requests, %d webhooks truncated; want 60 and 4 (groups 6 and 7)", bi.examined, len(bi.truncated))
	}
	r := newRun(nil, snap, Options{})
	r.budget, r.o.Now = bi, time.Now
	r.budgetOnce.Do(func() {})
	all := snap.Webhooks[len(snap.Webhooks)-1]
	fs := r.checkTimeoutBudget(all)
	n := 0
	for _, f := range fs {
		if f.ID == IDTimeoutBudget {
			n++
		}
	}
	if n != maxBudgetFindings || !strings.Contains(fs[maxBudgetFindings-1].What, "more set(s)") {
		t.Errorf("%d KD608 on the wildcard webhook, want %d with a note: %+v", n, maxBudgetFindings, fs)
	}
	var note bool
	for _, w := range snap.Webhooks {
		for _, f := range r.checkTimeoutBudget(w) {
			note = note || (f.ID == IDNotChecked && strings.Contains(f.What, "first 60 requests"))
		}
	}
	if !note {
		t.Error("no KD003 note on a webhook whose requests were left out")
	}

	snap = scaleSnapshot()
	r = newRun(nil, snap, Options{})
	start := time.Now()
	first := r.timeoutBudget()
	for _, w := range snap.Webhooks {
		r.checkTimeoutBudget(w)
	}
	took := time.Since(start)
	if r.timeoutBudget() != first {
		t.Error("the budget was computed twice in one run")
	}
	kd608 := 0
	for _, hc := range first.byHook {
		kd608 += hc.n
	}
	t.Logf("500 configurations x 10 webhooks, 203 namespaces: %d requests, %d (webhook, set) pairs over a bound; budget and 5000 checks in %s", first.examined, kd608, took)
	if kd608 == 0 {
		t.Error("the 250 wildcard mutating webhooks exceed every bound together, yet no set was found")
	}
	// Wall time on a loaded CI machine; BenchmarkTimeoutBudget measures.
	if took > 30*time.Second {
		t.Errorf("took %s", took)
	}
	for _, w := range snap.Webhooks {
		if hc := first.byHook[w]; hc != nil && len(hc.top) > maxBudgetFindings {
			t.Fatalf("%d cases kept for %s", len(hc.top), w.Name)
		}
	}
}

// scaleSnapshot is 500 configurations x 10 webhooks, each configuration on
// its own group, 5% mutating on everything (together far above every
// bound, so each of the others adds a set), all with a namespaceSelector
// (so every set is narrowed over the 203 namespaces).
func scaleSnapshot() *Snapshot {
	notKubeSystem := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: metadataNameLabel, Operator: metav1.LabelSelectorOpNotIn, Values: []string{"kube-system"}}}}
	var hs []bhook
	for i := range 500 {
		for j := range 10 {
			rs := []admissionregistrationv1.RuleWithOperations{rule([]string{fmt.Sprintf("g%d.example.com", i)}, []string{"v1", "v1beta1"}, []string{fmt.Sprintf("r%d", j), fmt.Sprintf("r%d/status", j)}, "CREATE", "UPDATE")}
			kind := KindValidating
			if (i*10+j)%20 == 0 {
				rs = []admissionregistrationv1.RuleWithOperations{rule([]string{"*"}, []string{"*"}, []string{"*"}, "CREATE", "UPDATE")}
				kind = KindMutating
			}
			hs = append(hs, bhook{kind: kind, cfg: fmt.Sprintf("c%d-%d", i, j), timeout: 10, rules: rs, nsSel: notKubeSystem})
		}
	}
	snap := budgetSnapshot(hs...)
	for i := range 200 {
		snap.Namespaces[fmt.Sprintf("ns-%d", i)] = map[string]string{"team": strconv.Itoa(i % 7)}
	}
	return snap
}

// BenchmarkTimeoutBudget: one run's KD608 index over scaleSnapshot.
func BenchmarkTimeoutBudget(b *testing.B) {
	snap := scaleSnapshot()
	b.ReportAllocs()
	for b.Loop() {
		computeBudget(snap.Webhooks, snap, MaxBudgetRequests)
	}
}
