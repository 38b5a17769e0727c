package doctor

import (
	"context"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
)

func podHook(fail bool, conds ...admissionregistrationv1.MatchCondition) *Webhook {
	fp := admissionregistrationv1.Ignore
	if fail {
		fp = admissionregistrationv1.Fail
	}
	c := &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "c"}, Webhooks: []admissionregistrationv1.ValidatingWebhook{{
		Name: "h.example.com", FailurePolicy: &fp, MatchConditions: conds,
		Rules: []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{"*"},
			Rule: admissionregistrationv1.Rule{APIGroups: []string{"*"}, APIVersions: []string{"*"}, Resources: []string{"pods", "leases", "nodes"}}}},
	}}}
	return FromValidating(c)[0]
}

func mc(name, expr string) admissionregistrationv1.MatchCondition {
	return admissionregistrationv1.MatchCondition{Name: name, Expression: expr}
}

func TestEvalConditions(t *testing.T) {
	ctx := context.Background()
	ownPod := Object{Request: Request{Version: "v1", Resource: "pods", Operation: "CREATE", Namespaced: true}, Kind: "Pod",
		Namespace: "kyverno", Labels: map[string]string{"app.kubernetes.io/part-of": "kyverno"}, User: replicaSetController,
		Body: podBody(corev1.PodSpec{ServiceAccountName: "kyverno-admission-controller"})}
	lease := Object{Request: Request{Group: "coordination.k8s.io", Version: "v1", Resource: "leases", Operation: "UPDATE", Namespaced: true}, Kind: "Lease",
		Namespace: "kube-node-lease", Name: "node-1", User: kubelet}
	cases := []struct {
		name     string
		conds    []admissionregistrationv1.MatchCondition
		obj      Object
		matches  bool
		excluded string
		err      bool
		unknown  bool
	}{
		{"no conditions", nil, ownPod, true, "", false, false},
		{"own namespace excluded", []admissionregistrationv1.MatchCondition{mc("not-kyverno", `request.namespace != "kyverno"`)}, ownPod, false, "not-kyverno", false, false},
		{"other namespace only", []admissionregistrationv1.MatchCondition{mc("not-other", `request.namespace != "other"`)}, ownPod, true, "", false, false},
		{"by object label", []admissionregistrationv1.MatchCondition{mc("not-part-of", `!has(object.metadata.labels) || !("app.kubernetes.io/part-of" in object.metadata.labels) || object.metadata.labels["app.kubernetes.io/part-of"] != "kyverno"`)}, ownPod, false, "not-part-of", false, false},
		{"by pod spec", []admissionregistrationv1.MatchCondition{mc("not-own-sa", `object.spec.serviceAccountName != "kyverno-admission-controller"`)}, ownPod, false, "not-own-sa", false, false},
		{"by controller user", []admissionregistrationv1.MatchCondition{mc("not-controllers", `!request.userInfo.username.startsWith("system:serviceaccount:kube-system:")`)}, ownPod, false, "not-controllers", false, false},
		{"leases by nodes excluded", []admissionregistrationv1.MatchCondition{mc("not-nodes", `!("system:nodes" in request.userInfo.groups)`)}, lease, false, "not-nodes", false, false},
		{"leases: old object present on UPDATE", []admissionregistrationv1.MatchCondition{mc("old", `oldObject != null && oldObject.metadata.name == "node-1"`)}, lease, true, "", false, false},
		{"runtime error with Fail", []admissionregistrationv1.MatchCondition{mc("missing-key", `object.metadata.labels["absent"] == "x"`)}, ownPod, false, "", true, false},
		{"authorizer is not evaluable offline", []admissionregistrationv1.MatchCondition{mc("breakglass", `!authorizer.group("admissionregistration.k8s.io").resource("validatingwebhookconfigurations").name("c").check("breakglass").allowed()`)}, ownPod, false, "", true, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := podHook(true, c.conds...)
			got := w.EvalConditions(ctx, c.obj)
			if got.Matches != c.matches || got.Excluded != c.excluded || (got.Err != nil) != c.err || (got.Unknown != "") != c.unknown {
				t.Fatalf("EvalConditions = %+v; want matches %v excluded %q err %v unknown %v", got, c.matches, c.excluded, c.err, c.unknown)
			}
		})
	}
}

func TestConditionCompileErrors(t *testing.T) {
	for _, fail := range []bool{true, false} {
		w := podHook(fail, mc("ok", `true`), mc("bad", `request.nosuchfield == 1 +`), mc("not-bool", `"string"`))
		fs := conditionFindings(w)
		if len(fs) != 1 || fs[0].ID != IDMatchConditionError {
			t.Fatalf("fail=%v: want one KD607; got %+v", fail, fs)
		}
		want := SeverityWarning
		if fail {
			want = SeverityError
		}
		if fs[0].Severity != want || !strings.Contains(fs[0].What, "2 matchCondition(s)") || !strings.Contains(fs[0].What, "bad: ") || !strings.Contains(fs[0].What, "not-bool: ") {
			t.Errorf("fail=%v: KD607 = %+v", fail, fs[0])
		}
		if got := w.EvalConditions(context.Background(), Object{Request: Request{Version: "v1", Resource: "pods", Operation: "CREATE", Namespaced: true}, Kind: "Pod", Namespace: "x", User: anyUser}); fail && got.Err == nil {
			t.Errorf("a condition that does not compile must reject with Fail, as the API server does; got %+v", got)
		}
	}
	if fs := conditionFindings(podHook(true, mc("ok", `request.namespace != "kube-system"`))); len(fs) != 0 {
		t.Errorf("valid condition reported: %+v", fs)
	}
}

// A Fail webhook on pods in its own namespace is a deadlock unless a
// matchCondition excludes its own pods; kube-system and node leases
// likewise.
func TestInterceptionWithMatchConditions(t *testing.T) {
	kyverno := map[string]string{"app.kubernetes.io/name": "kyverno"}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "kyverno-admission-controller-6b9f7c8d5-x1", Namespace: "kyverno", Labels: withHash(kyverno, "6b9f7c8d5"),
		OwnerReferences: ctrl("ReplicaSet", "kyverno-admission-controller-6b9f7c8d5")}, Spec: podSpec()}
	mk := func(conds ...admissionregistrationv1.MatchCondition) []runtime.Object {
		fail, none := admissionregistrationv1.Fail, admissionregistrationv1.SideEffectClassNone
		return []runtime.Object{
			&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kyverno", Labels: map[string]string{"kubernetes.io/metadata.name": "kyverno"}}},
			&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kube-system"}},
			&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kube-node-lease"}},
			pod,
			&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "kyverno-svc", Namespace: "kyverno"}, Spec: corev1.ServiceSpec{Selector: kyverno, Ports: []corev1.ServicePort{{Name: "https", Port: 443}}}},
			&admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "kyverno-resource-validating-webhook-cfg"}, Webhooks: []admissionregistrationv1.ValidatingWebhook{{
				Name:         "validate.kyverno.svc-fail",
				ClientConfig: admissionregistrationv1.WebhookClientConfig{CABundle: testBundle, Service: &admissionregistrationv1.ServiceReference{Namespace: "kyverno", Name: "kyverno-svc", Path: ptrTo("/validate/fail")}},
				Rules: []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{"CREATE", "UPDATE"},
					Rule: admissionregistrationv1.Rule{APIGroups: []string{"*"}, APIVersions: []string{"*"}, Resources: []string{"pods", "leases"}}}},
				FailurePolicy: &fail, SideEffects: &none, AdmissionReviewVersions: []string{"v1"}, MatchConditions: conds,
			}}},
		}
	}
	run := func(conds ...admissionregistrationv1.MatchCondition) *WebhookReport {
		cs := fake.NewClientset(mk(conds...)...)
		return diagnose(t, cs).Webhook("kyverno-resource-validating-webhook-cfg", "validate.kyverno.svc-fail")
	}
	w := run()
	for _, id := range []string{IDSelfInterception, IDInterceptsKubeSystem, IDInterceptsNodeLeases} {
		if !w.Has(id) {
			t.Errorf("without conditions: no %s in %+v", id, w.Findings)
		}
	}
	w = run(mc("exclude-own-namespace", `request.namespace != "kyverno"`))
	if w.Has(IDSelfInterception) {
		t.Errorf("excluded by matchCondition, still KD501: %+v", w.ByID(IDSelfInterception))
	}
	if !w.Has(IDInterceptsKubeSystem) || !w.Has(IDInterceptsNodeLeases) {
		t.Errorf("kube-system and leases are not excluded by that condition: %+v", w.Findings)
	}
	f := w.ByID(IDInterceptsKubeSystem)[0]
	if !strings.Contains(f.What, "matchCondition(s), evaluated with the API server's CEL library") {
		t.Errorf("KD502 does not say the conditions were evaluated: %q", f.What)
	}
	w = run(mc("exclude-bootstrap", `!(request.namespace in ["kyverno", "kube-system", "kube-node-lease"])`))
	for _, id := range []string{IDSelfInterception, IDInterceptsKubeSystem, IDInterceptsNodeLeases} {
		if w.Has(id) {
			t.Errorf("excluded by matchCondition, still %s: %+v", id, w.ByID(id))
		}
	}
	w = run(mc("exclude-other", `request.namespace != "somewhere-else"`))
	f = w.ByID(IDSelfInterception)[0]
	if f.Severity != SeverityError || !strings.Contains(f.What, "all return true") {
		t.Errorf("a condition that does not exclude the webhook's pods: KD501 = %+v", f)
	}
	w = run(mc("breakglass", `!authorizer.group("").resource("pods").check("breakglass").allowed()`))
	f = w.ByID(IDSelfInterception)[0]
	if f.Severity != SeverityWarning || !strings.Contains(f.What, "cannot tell for sure") || !strings.Contains(f.What, "authorizer") {
		t.Errorf("authorizer condition: KD501 must be a warning that says why; got %+v", f)
	}
}
