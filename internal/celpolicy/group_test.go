package celpolicy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/celpolicy"
	"github.com/kadmit/kadmit/internal/jsonedit"
	"github.com/kadmit/kadmit/internal/testkit"
)

// labelMAP is a MutatingAdmissionPolicy on pods setting label name to
// the CEL expression value.
func labelMAP(name, value, reinvoke string) string {
	return fmt.Sprintf(`---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicy
metadata: {name: %[1]s}
spec:
  failurePolicy: Fail
  reinvocationPolicy: %[3]s
  matchConstraints:
    resourceRules: [{apiGroups: [""], apiVersions: ["v1"], operations: ["CREATE"], resources: ["pods"]}]
  mutations:
  - patchType: ApplyConfiguration
    applyConfiguration:
      expression: "Object{metadata: Object.metadata{labels: {'%[1]s': %[2]s}}}"
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicyBinding
metadata: {name: %[1]s}
spec: {policyName: %[1]s}
`, name, value, reinvoke)
}

func podReview(pod string) *admission.Request {
	return testkit.PodRequest(admissionv1.Create, pod, "", testkit.Namespace("default"), testkit.Name("p"), testkit.Requested())
}

func labelsOf(t *testing.T, obj []byte) map[string]string {
	t.Helper()
	var p struct {
		Metadata struct {
			Labels map[string]string `json:"labels"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(obj, &p); err != nil {
		t.Fatal(err)
	}
	return p.Metadata.Labels
}

// The MAPs a review reaches one after another run as the API server runs
// them, in one dispatcher on one object with its reinvocation across
// policies (mutating/dispatcher.go dispatchInvocations, admission/
// reinvocation.go, v0.37.1): an IfNeeded policy that ran before a later
// one changed the object runs again and sees that change. The webhook's
// answer is the engine's (every policy in one dispatcher, as in tree).
func TestMAPRunReinvokesAcrossPolicies(t *testing.T) {
	docs := labelMAP("first", `has(object.metadata.labels) && 'second' in object.metadata.labels ? 'saw-second' : 'alone'`, "IfNeeded") +
		labelMAP("second", `'x'`, "Never")
	for i := 3; i <= 5; i++ {
		docs += labelMAP(fmt.Sprintf("l%d", i), `'x'`, "Never")
	}
	set, err := celpolicy.LoadReader("maps.yaml", strings.NewReader(docs))
	if err != nil {
		t.Fatal(err)
	}
	e, err := celpolicy.New(set, celpolicy.Options{Budget: celpolicy.NewBudget(0)})
	if err != nil {
		t.Fatal(err)
	}
	whs, err := admission.NewWebhooks(e.Hooks())
	if err != nil {
		t.Fatal(err)
	}
	const pod = `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"default"},"spec":{"containers":[{"name":"c","image":"nginx"}]}}`
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out, err := whs[0].Review(ctx, podReview(pod))
	if err != nil || !out.Response.Allowed {
		t.Fatal(err, out.Response)
	}
	if out.Matched != 5 {
		t.Errorf("matched %d hooks, want 5", out.Matched)
	}
	got := labelsOf(t, out.Object)
	if got["first"] != "saw-second" || len(got) != 5 {
		t.Errorf("labels %v: want first=saw-second (reinvoked after second changed the object) and 5 labels", got)
	}
	d, err := e.Mutate(context.Background(), &celpolicy.Request{Kind: schemaPod.Kind, Resource: schemaPod.Resource, Namespace: "default", Name: "p", Operation: "CREATE", Object: []byte(pod)})
	if err != nil {
		t.Fatal(err)
	}
	if want := labelsOf(t, d.Object); fmt.Sprint(want) != fmt.Sprint(got) {
		t.Errorf("webhook labels %v, engine's %v", got, want)
	}
	// The patch answered turns the request's object into that result.
	patched, err := jsonedit.Apply([]byte(pod), out.Patch)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(labelsOf(t, patched)) != fmt.Sprint(got) {
		t.Errorf("patch yields %s", patched)
	}
}

// A built-in mutator between two MAPs of the path ends their run: it sees
// the first MAP's result and the second MAP sees its; a denial by a MAP
// of a run is that policy's, with its message, and ends the chain.
func TestMAPRunSplitByBuiltinAndDenial(t *testing.T) {
	docs := labelMAP("a", `'1'`, "Never") + labelMAP("b", `has(object.metadata.annotations) && 'builtin' in object.metadata.annotations ? 'after-builtin' : 'before'`, "Never") +
		labelMAP("c", `'3'`, "Never") + `---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicy
metadata: {name: deny}
spec:
  reinvocationPolicy: Never
  failurePolicy: Fail
  matchConstraints:
    resourceRules: [{apiGroups: [""], apiVersions: ["v1"], operations: ["CREATE"], resources: ["pods"]}]
  matchConditions:
  - name: only-deny-label
    expression: "has(object.metadata.labels) && 'deny' in object.metadata.labels"
  mutations:
  - patchType: JSONPatch
    jsonPatch:
      expression: "[JSONPatch{op: 'replace', path: '/metadata/name', value: string(1/(size(object.metadata.name) - 1))}]"
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicyBinding
metadata: {name: deny}
spec: {policyName: deny}
`
	set, err := celpolicy.LoadReader("maps.yaml", strings.NewReader(docs))
	if err != nil {
		t.Fatal(err)
	}
	e, err := celpolicy.New(set, celpolicy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	hooks := e.Hooks()
	var sawA string
	builtin := admission.Hook{Policy: "builtin", Path: celpolicy.MutatePath, Type: admission.Mutating, Rules: hooks[0].Rules,
		Mutator: admission.MutatorFunc(func(_ context.Context, req *admission.Request) ([]jsonedit.Op, admission.Verdict) {
			sawA = labelsOf(t, req.Object.Raw)["a"]
			return []jsonedit.Op{{Op: "add", Path: "/metadata/annotations", Value: json.RawMessage(`{"builtin":"y"}`)}}, admission.Allow()
		})}
	whs, err := admission.NewWebhooks([]admission.Hook{hooks[0], builtin, hooks[1], hooks[2], hooks[3]})
	if err != nil {
		t.Fatal(err)
	}
	const pod = `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"default"},"spec":{"containers":[{"name":"c","image":"nginx"}]}}`
	out, err := whs[0].Review(context.Background(), podReview(pod))
	if err != nil || !out.Response.Allowed {
		t.Fatal(err, out.Response)
	}
	if got := labelsOf(t, out.Object); sawA != "1" || got["b"] != "after-builtin" || got["c"] != "3" {
		t.Errorf("built-in saw a=%q; labels %v", sawA, got)
	}
	if patched, err := jsonedit.Apply([]byte(pod), out.Patch); err != nil || fmt.Sprint(labelsOf(t, patched)) != fmt.Sprint(labelsOf(t, out.Object)) {
		t.Errorf("patch yields %s (%v), object %s", patched, err, out.Object)
	}

	denied := `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"default","labels":{"deny":"y"}},"spec":{"containers":[{"name":"c","image":"nginx"}]}}`
	whs, err = admission.NewWebhooks(hooks)
	if err != nil {
		t.Fatal(err)
	}
	out, err = whs[0].Review(context.Background(), podReview(denied))
	if err != nil {
		t.Fatal(err)
	}
	if out.Response.Allowed || out.Policy != "map-deny" || out.Patch != nil || !strings.Contains(out.Response.Result.Message, "deny") {
		t.Errorf("denied review: policy %q, patch %v, result %+v", out.Policy, out.Patch, out.Response.Result)
	}
}
