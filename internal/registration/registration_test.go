package registration

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/jsonedit"
)

func rule(resource string, ops ...admissionregistrationv1.OperationType) admissionregistrationv1.RuleWithOperations {
	return admissionregistrationv1.RuleWithOperations{
		Operations: ops,
		Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{resource}},
	}
}

// testHooks mirrors the built-in policies' hooks.
func testHooks() []admission.Hook {
	v := admission.ValidatorFunc(func(context.Context, *admission.Request) admission.Verdict { return admission.Allow() })
	m := admission.MutatorFunc(func(context.Context, *admission.Request) ([]jsonedit.Op, admission.Verdict) {
		return nil, admission.Allow()
	})
	return []admission.Hook{
		{Policy: "pod-name", Path: "/validate-pod", Type: admission.Validating, Rules: []admissionregistrationv1.RuleWithOperations{rule("pods", admissionregistrationv1.Create)},
			FailurePolicy: admissionregistrationv1.Fail, Validator: v},
		{Policy: "lifespan", Path: "/mutate-pod", Type: admission.Mutating, Rules: []admissionregistrationv1.RuleWithOperations{rule("pods", admissionregistrationv1.Create)},
			Mutator: m}, // no failurePolicy: Fail
		{Policy: "node-overcommit", Path: "/mutate-node-status", Type: admission.Mutating,
			Rules:         []admissionregistrationv1.RuleWithOperations{rule("nodes", admissionregistrationv1.Create), rule("nodes/status", admissionregistrationv1.Update)},
			FailurePolicy: admissionregistrationv1.Ignore, Mutator: m},
		{Policy: "node-overcommit", Path: "/validate-node", Type: admission.Validating,
			Rules:         []admissionregistrationv1.RuleWithOperations{rule("nodes", admissionregistrationv1.Create, admissionregistrationv1.Update)},
			FailurePolicy: admissionregistrationv1.Ignore, Validator: v},
	}
}

type common struct {
	name              string
	cc                admissionregistrationv1.WebhookClientConfig
	rules             []admissionregistrationv1.RuleWithOperations
	failurePolicy     *admissionregistrationv1.FailurePolicyType
	matchPolicy       *admissionregistrationv1.MatchPolicyType
	namespaceSelector *metav1.LabelSelector
	objectSelector    *metav1.LabelSelector
	sideEffects       *admissionregistrationv1.SideEffectClass
	timeoutSeconds    *int32
	reviewVersions    []string
	matchConditions   []admissionregistrationv1.MatchCondition
}

func webhooks(mwc *admissionregistrationv1.MutatingWebhookConfiguration, vwc *admissionregistrationv1.ValidatingWebhookConfiguration) (mut, val []common) {
	for _, w := range mwc.Webhooks {
		mut = append(mut, common{w.Name, w.ClientConfig, w.Rules, w.FailurePolicy, w.MatchPolicy, w.NamespaceSelector, w.ObjectSelector, w.SideEffects, w.TimeoutSeconds, w.AdmissionReviewVersions, w.MatchConditions})
	}
	for _, w := range vwc.Webhooks {
		val = append(val, common{w.Name, w.ClientConfig, w.Rules, w.FailurePolicy, w.MatchPolicy, w.NamespaceSelector, w.ObjectSelector, w.SideEffects, w.TimeoutSeconds, w.AdmissionReviewVersions, w.MatchConditions})
	}
	return mut, val
}

func TestBuildURL(t *testing.T) {
	hooks := testHooks()
	ca := []byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
	mwc, vwc, err := Build(hooks, Options{URL: "https://127.0.0.1:9443/", CABundle: ca, ExcludeNamespaces: []string{"kadmit-system", "kube-system", ""}})
	if err != nil {
		t.Fatal(err)
	}
	for _, meta := range []struct {
		tm metav1.TypeMeta
		om metav1.ObjectMeta
		k  string
	}{{mwc.TypeMeta, mwc.ObjectMeta, "MutatingWebhookConfiguration"}, {vwc.TypeMeta, vwc.ObjectMeta, "ValidatingWebhookConfiguration"}} {
		if meta.tm.APIVersion != "admissionregistration.k8s.io/v1" || meta.tm.Kind != meta.k || meta.om.Name != "kadmit" ||
			meta.om.Labels["app.kubernetes.io/managed-by"] != "kadmit" {
			t.Errorf("%s: %+v %+v", meta.k, meta.tm, meta.om)
		}
	}
	mut, val := webhooks(mwc, vwc)
	byName := map[string]common{}
	var names []string
	for _, w := range append(append([]common(nil), mut...), val...) {
		byName[w.name] = w
		names = append(names, w.name)
	}
	if want := []string{"lifespan.kadmit.io", "node-overcommit.kadmit.io", "pod-name.kadmit.io", "node-overcommit.kadmit.io"}; !slices.Equal(names, want) {
		t.Fatalf("webhook names %v, want %v", names, want)
	}
	wantSel := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
		{Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"kube-system", "kadmit-system"}},
		{Key: "kadmit.io/ignore", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"true"}},
	}}
	hookFor := map[string]admission.Hook{}
	for _, h := range hooks {
		hookFor[string(h.Type)+h.Path] = h
	}
	check := func(typ admission.Type, path string, w common) {
		t.Helper()
		h := hookFor[string(typ)+path]
		if w.cc.URL == nil || *w.cc.URL != "https://127.0.0.1:9443"+path || w.cc.Service != nil || string(w.cc.CABundle) != string(ca) {
			t.Errorf("%s: clientConfig %+v", w.name, w.cc)
		}
		// The hook's rules, with the API server's default scope spelled out.
		all := admissionregistrationv1.AllScopes
		var wantRules []admissionregistrationv1.RuleWithOperations
		for _, r := range h.Rules {
			r.Scope = &all
			wantRules = append(wantRules, r)
		}
		if !reflect.DeepEqual(w.rules, wantRules) {
			t.Errorf("%s: rules %+v, want %+v", w.name, w.rules, wantRules)
		}
		wantFP := h.FailurePolicy
		if wantFP == "" {
			wantFP = admissionregistrationv1.Fail
		}
		if w.failurePolicy == nil || *w.failurePolicy != wantFP {
			t.Errorf("%s: failurePolicy %v, want %s", w.name, w.failurePolicy, wantFP)
		}
		if w.matchPolicy == nil || *w.matchPolicy != admissionregistrationv1.Equivalent {
			t.Errorf("%s: matchPolicy %v", w.name, w.matchPolicy)
		}
		if w.sideEffects == nil || *w.sideEffects != admissionregistrationv1.SideEffectClassNone {
			t.Errorf("%s: sideEffects %v", w.name, w.sideEffects)
		}
		if w.timeoutSeconds == nil || *w.timeoutSeconds != 5 {
			t.Errorf("%s: timeoutSeconds %v", w.name, w.timeoutSeconds)
		}
		if !slices.Equal(w.reviewVersions, []string{"v1", "v1beta1"}) {
			t.Errorf("%s: admissionReviewVersions %v", w.name, w.reviewVersions)
		}
		if !reflect.DeepEqual(w.namespaceSelector, wantSel) {
			t.Errorf("%s: namespaceSelector %+v", w.name, w.namespaceSelector)
		}
		if w.objectSelector == nil || !reflect.DeepEqual(*w.objectSelector, metav1.LabelSelector{}) {
			t.Errorf("%s: objectSelector %+v", w.name, w.objectSelector)
		}
		pods := path == "/validate-pod" || path == "/mutate-pod"
		switch {
		case pods && (len(w.matchConditions) != 1 || w.matchConditions[0].Name != "skip-mirror-pods" || w.matchConditions[0].Expression != mirrorPodCondition):
			t.Errorf("%s: matchConditions %+v", w.name, w.matchConditions)
		case !pods && len(w.matchConditions) != 0:
			t.Errorf("%s: matchConditions on a non-pod webhook: %+v", w.name, w.matchConditions)
		}
	}
	check(admission.Mutating, "/mutate-pod", mut[0])
	check(admission.Mutating, "/mutate-node-status", mut[1])
	check(admission.Validating, "/validate-pod", val[0])
	check(admission.Validating, "/validate-node", val[1])
	for _, w := range mwc.Webhooks {
		if w.ReinvocationPolicy == nil || *w.ReinvocationPolicy != admissionregistrationv1.IfNeededReinvocationPolicy {
			t.Errorf("%s: reinvocationPolicy %v", w.Name, w.ReinvocationPolicy)
		}
	}
	// Validating webhooks have no reinvocationPolicy: the encoded object must not carry one.
	b, err := json.Marshal(vwc)
	if err != nil {
		t.Fatal(err)
	}
	var generic map[string]any
	if err := json.Unmarshal(b, &generic); err != nil {
		t.Fatal(err)
	}
	for _, w := range generic["webhooks"].([]any) {
		if _, ok := w.(map[string]any)["reinvocationPolicy"]; ok {
			t.Errorf("validating webhook carries reinvocationPolicy: %v", w)
		}
	}
	// Webhooks do not share pointers: editing one leaves the others alone.
	*mwc.Webhooks[0].FailurePolicy = admissionregistrationv1.Ignore
	*mwc.Webhooks[0].TimeoutSeconds = 1
	if *mwc.Webhooks[1].FailurePolicy != admissionregistrationv1.Ignore || *vwc.Webhooks[0].FailurePolicy != admissionregistrationv1.Fail || *vwc.Webhooks[0].TimeoutSeconds != 5 {
		t.Error("webhooks share failurePolicy or timeoutSeconds pointers")
	}
}

func TestBuildService(t *testing.T) {
	mwc, vwc, err := Build(testHooks(), Options{Name: "custom", ServiceNamespace: "kadmit-system", ServiceName: "kadmit", TimeoutSeconds: 3, ExcludeNamespaces: []string{"kadmit-system"}})
	if err != nil {
		t.Fatal(err)
	}
	if mwc.Name != "custom" || vwc.Name != "custom" {
		t.Fatalf("names %q %q", mwc.Name, vwc.Name)
	}
	mut, val := webhooks(mwc, vwc)
	paths := []string{"/mutate-pod", "/mutate-node-status", "/validate-pod", "/validate-node"}
	for i, w := range append(mut, val...) {
		s := w.cc.Service
		if w.cc.URL != nil || s == nil || s.Namespace != "kadmit-system" || s.Name != "kadmit" || s.Port == nil || *s.Port != 443 || s.Path == nil || *s.Path != paths[i] {
			t.Errorf("%s: clientConfig %+v service %+v", w.name, w.cc, s)
		}
		if *w.timeoutSeconds != 3 {
			t.Errorf("%s: timeoutSeconds %d", w.name, *w.timeoutSeconds)
		}
	}
	mwc, _, err = Build(testHooks(), Options{ServiceNamespace: "ns", ServiceName: "svc", ServicePort: 9443})
	if err != nil {
		t.Fatal(err)
	}
	if p := mwc.Webhooks[0].ClientConfig.Service.Port; *p != 9443 {
		t.Fatalf("port %d", *p)
	}
	if *mwc.Webhooks[0].ClientConfig.Service.Path != "/mutate-pod" || *mwc.Webhooks[1].ClientConfig.Service.Path != "/mutate-node-status" {
		t.Fatal("service paths share one pointer")
	}
}

func TestBuildOnlyOneType(t *testing.T) {
	hooks := testHooks()
	mwc, vwc, err := Build(hooks[:1], Options{URL: "https://127.0.0.1:1"})
	if err != nil || mwc != nil || vwc == nil || len(vwc.Webhooks) != 1 {
		t.Fatalf("validating only: %v %v %v", mwc, vwc, err)
	}
	mwc, vwc, err = Build(nil, Options{URL: "https://127.0.0.1:1"})
	if err != nil || mwc != nil || vwc != nil {
		t.Fatalf("no hooks: %v %v %v", mwc, vwc, err)
	}
}

func TestBuildDuplicatePolicyName(t *testing.T) {
	hooks := testHooks()
	second := hooks[0]
	second.Path = "/validate-pod-extra"
	_, vwc, err := Build([]admission.Hook{hooks[0], second}, Options{URL: "https://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	if vwc.Webhooks[0].Name != "pod-name.kadmit.io" || vwc.Webhooks[1].Name != "pod-name-validate-pod-extra.kadmit.io" {
		t.Fatalf("names %q %q", vwc.Webhooks[0].Name, vwc.Webhooks[1].Name)
	}
}

func TestBuildNoEndpoint(t *testing.T) {
	for _, o := range []Options{{}, {ServiceName: "kadmit"}, {ServiceNamespace: "kadmit-system"}} {
		if _, _, err := Build(testHooks(), o); !errors.Is(err, ErrNoEndpoint) {
			t.Errorf("Build(%+v) = %v, want ErrNoEndpoint", o, err)
		}
	}
}

func TestApply(t *testing.T) {
	mwc, vwc, err := Build(testHooks(), Options{URL: "https://127.0.0.1:9443"})
	if err != nil {
		t.Fatal(err)
	}
	cs := fake.NewClientset()
	ctx := context.Background()
	for range 2 { // applying again is a no-op, not a conflict
		if err := Apply(ctx, cs, mwc, vwc); err != nil {
			t.Fatal(err)
		}
	}
	var patches int
	for _, a := range cs.Actions() {
		pa, ok := a.(k8stesting.PatchActionImpl)
		if !ok {
			continue
		}
		patches++
		if pa.GetPatchType() != types.ApplyPatchType || pa.PatchOptions.FieldManager != FieldManager ||
			pa.PatchOptions.Force == nil || !*pa.PatchOptions.Force || pa.GetName() != "kadmit" {
			t.Errorf("patch %s %s: type %s options %+v", pa.GetResource().Resource, pa.GetName(), pa.GetPatchType(), pa.PatchOptions)
		}
	}
	if patches != 4 {
		t.Fatalf("%d apply patches, want 4: %v", patches, cs.Actions())
	}
	gotM, err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "kadmit", metav1.GetOptions{})
	if err != nil || len(gotM.Webhooks) != 2 || gotM.Webhooks[0].Name != "lifespan.kadmit.io" {
		t.Fatalf("stored mutating configuration: %v %+v", err, gotM)
	}
	gotV, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, "kadmit", metav1.GetOptions{})
	if err != nil || len(gotV.Webhooks) != 2 || gotV.Webhooks[1].Name != "node-overcommit.kadmit.io" {
		t.Fatalf("stored validating configuration: %v %+v", err, gotV)
	}

	// Nil configurations are skipped.
	cs = fake.NewClientset()
	if err := Apply(ctx, cs, nil, vwc); err != nil {
		t.Fatal(err)
	}
	if n := len(cs.Actions()); n != 1 || cs.Actions()[0].GetResource().Resource != "validatingwebhookconfigurations" {
		t.Fatalf("actions %v", cs.Actions())
	}
	// API errors name the object.
	cs = fake.NewClientset()
	cs.PrependReactor("patch", "mutatingwebhookconfigurations", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("denied by test")
	})
	err = Apply(ctx, cs, mwc, vwc)
	if err == nil || err.Error() != "apply MutatingWebhookConfiguration kadmit: denied by test" {
		t.Fatalf("err = %v", err)
	}
}

func TestBuildSharedPathIsOneWebhook(t *testing.T) {
	hooks := testHooks()
	quota := hooks[0]
	quota.Policy, quota.FailurePolicy = "elastic-quota", admissionregistrationv1.Ignore
	quota.Rules = []admissionregistrationv1.RuleWithOperations{{
		Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Update},
		Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
	}}
	_, vwc, err := Build([]admission.Hook{hooks[0], quota}, Options{URL: "https://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	if len(vwc.Webhooks) != 1 {
		t.Fatalf("%d webhooks for one path: the API server would call it twice", len(vwc.Webhooks))
	}
	w := vwc.Webhooks[0]
	if w.Name != "validate-pod.kadmit.io" || len(w.Rules) != len(hooks[0].Rules)+1 || *w.FailurePolicy != admissionregistrationv1.Fail {
		t.Fatalf("webhook %s rules %d failurePolicy %s", w.Name, len(w.Rules), *w.FailurePolicy)
	}
}

// The mirror-pod matchCondition goes on every webhook whose rules select pod
// objects, however the rules spell it.
func TestTouchesPodsFollowsTheRuleMatcher(t *testing.T) {
	rule := func(groups, versions, resources []string, ops ...admissionregistrationv1.OperationType) []admissionregistrationv1.RuleWithOperations {
		return []admissionregistrationv1.RuleWithOperations{{Operations: ops,
			Rule: admissionregistrationv1.Rule{APIGroups: groups, APIVersions: versions, Resources: resources}}}
	}
	core, v1, all := []string{""}, []string{"v1"}, []string{"*"}
	for _, tc := range []struct {
		name  string
		rules []admissionregistrationv1.RuleWithOperations
		want  bool
	}{
		{"pods", rule(core, v1, []string{"pods"}, "CREATE"), true},
		{"pods/* selects pods too", rule(core, v1, []string{"pods/*"}, "CREATE"), true},
		{"*", rule(all, all, []string{"*"}, "*"), true},
		{"*/*", rule(all, all, []string{"*/*"}, "UPDATE"), true},
		{"pods/status only", rule(core, v1, []string{"pods/status"}, "UPDATE"), false},
		{"*/status only", rule(all, all, []string{"*/status"}, "UPDATE"), false},
		{"pods in another group", rule([]string{"apps"}, v1, []string{"pods"}, "CREATE"), false},
		{"nodes", rule(core, v1, []string{"nodes"}, "CREATE"), false},
	} {
		if got := touchesPods(tc.rules); got != tc.want {
			t.Errorf("%s: touchesPods = %t, want %t", tc.name, got, tc.want)
		}
	}
}

// A path's webhook is IfNeeded when any hook on it asks for it or leaves
// reinvocationPolicy unset (the built-in mutators); Never only when every
// hook says Never (declared MutatingAdmissionPolicies by default).
func TestBuildReinvocationPolicy(t *testing.T) {
	never, ifNeeded := admissionregistrationv1.NeverReinvocationPolicy, admissionregistrationv1.IfNeededReinvocationPolicy
	mutator := testHooks()[1]
	hook := func(policy string, rp *admissionregistrationv1.ReinvocationPolicyType) admission.Hook {
		h := mutator
		h.Policy, h.Path, h.ReinvocationPolicy = policy, "/mutate-policies", rp
		return h
	}
	for _, tc := range []struct {
		name  string
		hooks []admission.Hook
		want  admissionregistrationv1.ReinvocationPolicyType
	}{
		{"unset", []admission.Hook{hook("a", nil)}, ifNeeded},
		{"never", []admission.Hook{hook("a", &never)}, never},
		{"ifNeeded", []admission.Hook{hook("a", &ifNeeded)}, ifNeeded},
		{"all never", []admission.Hook{hook("a", &never), hook("b", &never)}, never},
		{"one ifNeeded among never", []admission.Hook{hook("a", &never), hook("b", &ifNeeded), hook("c", &never)}, ifNeeded},
		{"one unset among never", []admission.Hook{hook("a", &never), hook("b", nil)}, ifNeeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mwc, vwc, err := Build(tc.hooks, Options{URL: "https://127.0.0.1:1"})
			if err != nil {
				t.Fatal(err)
			}
			if vwc != nil || len(mwc.Webhooks) != 1 {
				t.Fatalf("want one mutating webhook, got %+v / %+v", mwc, vwc)
			}
			if rp := mwc.Webhooks[0].ReinvocationPolicy; rp == nil || *rp != tc.want {
				t.Errorf("reinvocationPolicy = %v, want %s", rp, tc.want)
			}
		})
	}
	// Each path decides alone: a Never path next to an IfNeeded one.
	other := mutator
	mwc, _, err := Build([]admission.Hook{hook("a", &never), other}, Options{URL: "https://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]admissionregistrationv1.ReinvocationPolicyType{}
	for _, w := range mwc.Webhooks {
		got[w.Name] = *w.ReinvocationPolicy
	}
	if got["a.kadmit.io"] != never || got["lifespan.kadmit.io"] != ifNeeded {
		t.Errorf("reinvocationPolicy per webhook = %v", got)
	}
}
