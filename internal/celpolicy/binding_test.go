package celpolicy

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
)

// bindingPolicies: a VAP and a MAP on configmaps, each with a binding whose
// namespaceSelector picks env=guarded, and each with a second binding whose
// param is missing with parameterNotFoundAction Deny, for env=broken
// namespaces, and a third whose param is missing with Allow, for env=lax.
const bindingPolicies = `apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: v}
spec:
  paramKind: {apiVersion: v1, kind: Secret}
  matchConstraints:
    resourceRules: [{apiGroups: [""], apiVersions: ["v1"], operations: ["CREATE"], resources: ["configmaps"]}]
  validations: [{expression: "false", message: "v denies"}]
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: v-guarded}
spec:
  policyName: v
  validationActions: [Deny]
  paramRef: {name: present, namespace: p, parameterNotFoundAction: Deny}
  matchResources:
    namespaceSelector: {matchLabels: {env: guarded}}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: v-broken}
spec:
  policyName: v
  validationActions: [Deny]
  paramRef: {name: missing, namespace: p, parameterNotFoundAction: Deny}
  matchResources:
    namespaceSelector: {matchLabels: {env: broken}}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: v-lax}
spec:
  policyName: v
  validationActions: [Deny]
  paramRef: {name: missing, namespace: p, parameterNotFoundAction: Allow}
  matchResources:
    namespaceSelector: {matchLabels: {env: lax}}
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicy
metadata: {name: m}
spec:
  reinvocationPolicy: Never
  paramKind: {apiVersion: v1, kind: Secret}
  matchConstraints:
    resourceRules: [{apiGroups: [""], apiVersions: ["v1"], operations: ["CREATE"], resources: ["configmaps"]}]
  mutations:
  - patchType: JSONPatch
    jsonPatch:
      expression: '[JSONPatch{op: "add", path: "/metadata/labels", value: {"mutated": "yes"}}]'
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicyBinding
metadata: {name: m-guarded}
spec:
  policyName: m
  paramRef: {name: present, namespace: p, parameterNotFoundAction: Deny}
  matchResources:
    namespaceSelector: {matchLabels: {env: guarded}}
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicyBinding
metadata: {name: m-broken}
spec:
  policyName: m
  paramRef: {name: missing, namespace: p, parameterNotFoundAction: Deny}
  matchResources:
    namespaceSelector: {matchLabels: {env: broken}}
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicyBinding
metadata: {name: m-lax}
spec:
  policyName: m
  paramRef: {name: missing, namespace: p, parameterNotFoundAction: Allow}
  matchResources:
    namespaceSelector: {matchLabels: {env: lax}}
---
apiVersion: v1
kind: Secret
metadata: {name: present, namespace: p}
`

func configMapIn(env string) *Request {
	ns := "ns-" + env
	return &Request{
		Kind:      schema.GroupVersionKind{Version: "v1", Kind: "ConfigMap"},
		Resource:  schema.GroupVersionResource{Version: "v1", Resource: "configmaps"},
		Name:      "c",
		Namespace: ns,
		Operation: admission.Create,
		Object:    []byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c","namespace":"` + ns + `"}}`),
		NamespaceObject: &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
			Labels: map[string]string{"env": env, "kubernetes.io/metadata.name": ns}}},
	}
}

// A binding's matchResources.namespaceSelector survives loading (a binding
// whose selector is dropped would match every namespace), and a binding's
// missing param is handled as its parameterNotFoundAction says: Deny denies
// with the API server's message (generic/policy_dispatcher.go v0.37.1),
// Allow skips the binding. Both for validating and mutating bindings.
func TestBindingNamespaceSelectorAndMissingParam(t *testing.T) {
	set, err := LoadReader("b.yaml", strings.NewReader(bindingPolicies))
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range set.ValidatingBinding {
		if b.Name == "v-guarded" && (b.Spec.MatchResources.NamespaceSelector == nil || b.Spec.MatchResources.NamespaceSelector.MatchLabels["env"] != "guarded") {
			t.Errorf("v-guarded namespaceSelector after load: %v", b.Spec.MatchResources.NamespaceSelector)
		}
	}
	for _, b := range set.MutatingBinding {
		if b.Name == "m-guarded" && (b.Spec.MatchResources.NamespaceSelector == nil || b.Spec.MatchResources.NamespaceSelector.MatchLabels["env"] != "guarded") {
			t.Errorf("m-guarded namespaceSelector after load: %v", b.Spec.MatchResources.NamespaceSelector)
		}
	}
	e, err := New(set, Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, c := range []struct {
		env         string
		allowed     bool
		message     string // validating denial contains
		mutated     bool
		mutateError string // mutating denial contains
	}{
		{env: "guarded", allowed: false, message: "v denies", mutated: true},
		{env: "other", allowed: true},
		{env: "broken", allowed: false, message: "no params found for policy binding with `Deny` parameterNotFoundAction", mutateError: "no params found for policy binding with `Deny` parameterNotFoundAction"},
		{env: "lax", allowed: true},
	} {
		d, err := e.Validate(ctx, configMapIn(c.env))
		if err != nil {
			t.Fatalf("%s: %v", c.env, err)
		}
		if d.Allowed != c.allowed || (!c.allowed && !strings.Contains(d.Message(), c.message)) {
			t.Errorf("validate in env=%s: allowed=%v %q, want allowed=%v containing %q", c.env, d.Allowed, d.Message(), c.allowed, c.message)
		}
		m, err := e.Mutate(ctx, configMapIn(c.env))
		if err != nil {
			t.Fatalf("%s: %v", c.env, err)
		}
		if c.mutateError != "" {
			if m.Allowed || !strings.Contains(m.Message(), c.mutateError) {
				t.Errorf("mutate in env=%s: allowed=%v %q, want a denial containing %q", c.env, m.Allowed, m.Message(), c.mutateError)
			}
			continue
		}
		if !m.Allowed {
			t.Errorf("mutate in env=%s denied: %s", c.env, m.Message())
		}
		if got := strings.Contains(string(m.Object), `"mutated":"yes"`); got != c.mutated {
			t.Errorf("mutate in env=%s: mutated=%v, want %v (object %s)", c.env, got, c.mutated, m.Object)
		}
	}
}
