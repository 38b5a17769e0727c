package celpolicy_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/celpolicy"
	"github.com/kadmit/kadmit/internal/registration"
	"github.com/kadmit/kadmit/internal/review"
)

// The declared policies run through kadmit's own admission chain, as
// `kadmit review --policies` and `kadmit serve` run them: the webhook
// rules come from matchConstraints, a denial keeps the in-tree message
// and code, a mutation is stated as JSONPatch operations that yield the
// engine's object.
func TestHooksThroughTheChain(t *testing.T) {
	whs, e, err := celpolicy.LoadWebhooks(celpolicy.Options{}, "testdata/basic.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(whs) != 2 || whs[0].Path != celpolicy.MutatePath || whs[1].Path != celpolicy.ValidatePath {
		t.Fatalf("webhooks = %+v", whs)
	}
	var names []string
	for _, h := range whs[1].Hooks {
		names = append(names, h.Policy)
		if r := h.Rules; len(r) != 1 || r[0].Resources[0] != "deployments" || len(r[0].Operations) != 2 {
			t.Errorf("%s rules = %+v", h.Policy, r)
		}
	}
	if strings.Join(names, ",") != "vap-demo-policy.example.com,vap-replicalimit-policy.example.com" {
		t.Errorf("hooks = %v", names)
	}
	ctx := context.Background()

	dep := []byte(`{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"web","namespace":"default"},"spec":{"replicas":6}}`)
	res, err := review.Run(ctx, whs, review.Document{Source: "t", Object: dep}, review.Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := "ValidatingAdmissionPolicy 'demo-policy.example.com' with binding 'demo-binding-test.example.com' denied request: failed expression: object.spec.replicas <= 5"
	if res.Allowed || res.Code != 422 || res.Message != want {
		t.Errorf("deployment: %+v", res)
	}

	pod := []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"default"},"spec":{"initContainers":[{"name":"init","image":"busybox"}],"containers":[{"name":"c","image":"nginx"}]}}`)
	res, err = review.Run(ctx, whs, review.Document{Source: "t", Object: pod}, review.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Allowed || len(res.Patch) == 0 {
		t.Fatalf("pod: %+v", res)
	}
	d, err := e.Mutate(ctx, &celpolicy.Request{Kind: schemaPod.Kind, Resource: schemaPod.Resource, Namespace: "default", Name: "p", Operation: "CREATE", Object: pod})
	if err != nil {
		t.Fatal(err)
	}
	var a, b any
	_ = json.Unmarshal(res.Object, &a)
	_ = json.Unmarshal(d.Object, &b)
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	if string(ja) != string(jb) {
		t.Errorf("patched object %s, engine's %s", ja, jb)
	}
	// A DELETE is not sent to mutating policies.
	for _, h := range whs[0].Hooks {
		if admission.MatchRules(h.Rules, admission.NewRuleAttributes(schemaPod.Resource, "", admissionv1.Delete, "default")) {
			t.Errorf("%s matches DELETE", h.Policy)
		}
	}
}

// A MutatingAdmissionPolicy's reinvocationPolicy reaches its hook (Never
// when the policy leaves it unset, the API's default), and through
// registration.Build the webhook on MutatePath.
func TestHooksReinvocationPolicy(t *testing.T) {
	const never = `
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicy
metadata:
  name: label-never
spec:
  reinvocationPolicy: Never
  matchConstraints:
    resourceRules:
    - apiGroups: [""]
      apiVersions: ["v1"]
      operations: ["CREATE"]
      resources: ["configmaps"]
  mutations:
  - patchType: ApplyConfiguration
    applyConfiguration:
      expression: 'Object{metadata: Object.metadata{labels: {"seen": "yes"}}}'
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicyBinding
metadata:
  name: label-never
spec:
  policyName: label-never
`
	hooksOf := func(set *celpolicy.Set) []admission.Hook {
		t.Helper()
		e, err := celpolicy.New(set, celpolicy.Options{})
		if err != nil {
			t.Fatal(err)
		}
		var out []admission.Hook
		for _, h := range e.Hooks() {
			if h.Type == admission.Mutating {
				out = append(out, h)
			}
		}
		return out
	}
	registered := func(hooks []admission.Hook) admissionregistrationv1.ReinvocationPolicyType {
		t.Helper()
		mwc, _, err := registration.Build(hooks, registration.Options{URL: "https://127.0.0.1:1"})
		if err != nil {
			t.Fatal(err)
		}
		if len(mwc.Webhooks) != 1 {
			t.Fatalf("mutating webhooks = %+v", mwc.Webhooks)
		}
		return *mwc.Webhooks[0].ReinvocationPolicy
	}

	set, err := celpolicy.LoadReader("never.yaml", strings.NewReader(never))
	if err != nil {
		t.Fatal(err)
	}
	hs := hooksOf(set)
	if len(hs) != 1 || hs[0].ReinvocationPolicy == nil || *hs[0].ReinvocationPolicy != admissionregistrationv1.NeverReinvocationPolicy {
		t.Fatalf("unset reinvocationPolicy: hooks = %+v", hs)
	}
	if got := registered(hs); got != admissionregistrationv1.NeverReinvocationPolicy {
		t.Errorf("registered %s for a Never policy", got)
	}

	set, err = celpolicy.Load("testdata/basic.yaml")
	if err != nil {
		t.Fatal(err)
	}
	ifNeeded := hooksOf(set)
	if len(ifNeeded) != 1 || ifNeeded[0].ReinvocationPolicy == nil || *ifNeeded[0].ReinvocationPolicy != admissionregistrationv1.IfNeededReinvocationPolicy {
		t.Fatalf("reinvocationPolicy: IfNeeded: hooks = %+v", ifNeeded)
	}
	// The IfNeeded policy shares MutatePath with the Never one: the webhook
	// is IfNeeded.
	if got := registered(append(hs, ifNeeded...)); got != admissionregistrationv1.IfNeededReinvocationPolicy {
		t.Errorf("registered %s for a path with an IfNeeded policy", got)
	}
}
