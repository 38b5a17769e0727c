package policysuite

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/kadmit/kadmit/internal/celpolicy"
)

// The comparison of an offline decision with a server's answer; the
// answers against a real API server are test/e2e/testserver's.
func TestDiffOutcomes(t *testing.T) {
	yes, no := true, false
	pod := []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","labels":{"a":"b"}},"spec":{"containers":[{"name":"c","image":"nginx"}]}}`)
	denied := &celpolicy.Decision{Allowed: false, Status: &metav1.Status{Code: 422, Message: "pods \"p\" is forbidden: no"}}
	server := func(obj string) map[string]any {
		var m map[string]any
		if err := json.Unmarshal([]byte(obj), &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	defaulted := server(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","uid":"u","labels":{"a":"b"}},"spec":{"containers":[{"name":"c","image":"nginx","imagePullPolicy":"Always"}]}}`)
	for _, tc := range []struct {
		name string
		test Test
		d    *celpolicy.Decision
		o    ServerOutcome
		want []string
	}{
		{name: "agree on a denial", test: Test{Expect: Expect{Allowed: &no}}, d: denied,
			o: ServerOutcome{Code: 422, Message: "pods \"p\" is forbidden: no", Warnings: []string{}}},
		{name: "denied offline, allowed by the server", test: Test{Expect: Expect{Allowed: &no}}, d: denied,
			o:    ServerOutcome{Allowed: true, Warnings: []string{}, Object: defaulted},
			want: []string{`offline allowed=false 422 "pods \"p\" is forbidden: no", server allowed=true`}},
		{name: "another message", test: Test{Expect: Expect{Allowed: &no}}, d: denied,
			o:    ServerOutcome{Code: 403, Message: "forbidden", Warnings: []string{}},
			want: []string{`offline allowed=false 422 "pods \"p\" is forbidden: no", server allowed=false 403 "forbidden"`}},
		{name: "warnings", test: Test{Expect: Expect{Allowed: &yes}}, d: &celpolicy.Decision{Allowed: true, Warnings: []string{"w"}},
			o:    ServerOutcome{Allowed: true, Warnings: []string{}, Object: defaulted},
			want: []string{`warnings: offline ["w"], server []`}},
		{name: "defaults are a subset", test: Test{Expect: Expect{Allowed: &yes, Patched: map[string]json.RawMessage{"/spec/containers/0": json.RawMessage(`{}`)}}},
			d: &celpolicy.Decision{Allowed: true}, o: ServerOutcome{Allowed: true, Warnings: []string{}, Object: defaulted}},
		{name: "a named field that differs", test: Test{Expect: Expect{Allowed: &yes, Patched: map[string]json.RawMessage{"/metadata/labels/a": json.RawMessage(`"b"`)}}},
			d: &celpolicy.Decision{Allowed: true}, o: ServerOutcome{Allowed: true, Warnings: []string{},
				Object: server(`{"metadata":{"labels":{"a":"c"}}}`)},
			want: []string{`/metadata/labels/a: offline "b", server "c"`}},
		{name: "expect.object leaves, server-set fields aside", test: Test{Expect: Expect{Allowed: &yes,
			Object: json.RawMessage(`{"metadata":{"name":"p","uid":"x"},"spec":{"containers":[{"image":"nginx"}],"hostNetwork":true}}`)}},
			// hostNetwork is in neither object: agreeing on nothing is no
			// difference.
			d: &celpolicy.Decision{Allowed: true}, o: ServerOutcome{Allowed: true, Warnings: []string{}, Object: defaulted}},
		{name: "nothing offline, something on the server", test: Test{Expect: Expect{Allowed: &yes, Patched: map[string]json.RawMessage{"/spec/tolerations": json.RawMessage(`null`)}}},
			d: &celpolicy.Decision{Allowed: true}, o: ServerOutcome{Allowed: true, Warnings: []string{},
				Object: server(`{"spec":{"tolerations":[{"key":"k"}]}}`)},
			want: []string{`/spec/tolerations: offline nothing, server [{"key":"k"}]`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := diffOutcomes(offline{test: &tc.test, req: &celpolicy.Request{Object: pod}, d: tc.d}, tc.o)
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %q\nwant %q", got, tc.want)
			}
		})
	}
}

func TestSubsetJSON(t *testing.T) {
	for _, tc := range []struct {
		off, srv string
		want     bool
	}{
		{`{"a":1}`, `{"a":1,"b":2}`, true},
		{`{"a":1,"b":2}`, `{"a":1}`, false},
		{`[{"a":1}]`, `[{"a":1,"x":0}]`, true},
		{`[{"a":1}]`, `[{"a":1},{"a":2}]`, false},
		{`"x"`, `"y"`, false},
		{`null`, ``, true},
		{``, `null`, true},
		{``, `1`, false},
		{`1`, ``, false},
	} {
		var off, srv []byte
		if tc.off != "" {
			off = []byte(tc.off)
		}
		if tc.srv != "" {
			srv = []byte(tc.srv)
		}
		if got := subsetJSON(off, srv); got != tc.want {
			t.Errorf("subsetJSON(%s, %s) = %v, want %v", tc.off, tc.srv, got, tc.want)
		}
	}
}

func TestLeafPointers(t *testing.T) {
	var v any
	if err := json.Unmarshal([]byte(`{"metadata":{"uid":"u","name":"n","labels":{"a/b~c":"x"}},"spec":{"l":[1,{"k":true}],"e":{}}}`), &v); err != nil {
		t.Fatal(err)
	}
	got := leafPointers(v, "", nil)
	slices.Sort(got)
	want := []string{"/metadata/labels/a~1b~0c", "/metadata/name", "/spec/e", "/spec/l/0", "/spec/l/1/k"}
	if !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestWithout(t *testing.T) {
	if got := without([]string{"a", "b", "a", "c"}, []string{"a", "c", "z"}); !slices.Equal(got, []string{"b", "a"}) {
		t.Errorf("got %q", got)
	}
	if got := without(nil, nil); got == nil || len(got) != 0 {
		t.Errorf("got %#v, want an empty list", got)
	}
}

func TestPrintServer(t *testing.T) {
	var b bytes.Buffer
	n := Print(&b, []Result{
		{Suite: "s", Test: "agrees", Server: &ServerCheck{Notes: []string{"expect.auditAnnotations not compared"}}},
		{Suite: "s", Test: "differs", Server: &ServerCheck{Diff: []string{"offline allowed=true, server allowed=false 403 \"no\""}}},
		{Suite: "s", Test: "fails and differs", Failures: []string{"allowed: got true, want false"}, Server: &ServerCheck{Diff: []string{"x"}}},
	})
	want := `PASS  s / agrees
      server: expect.auditAnnotations not compared
PASS  s / differs
DIFF  s / differs: offline allowed=true, server allowed=false 403 "no"
FAIL  s / fails and differs
      allowed: got true, want false
DIFF  s / fails and differs: x
3 tests, 2 passed, 1 failed, 2 differ from the API server
`
	if b.String() != want || n != 2 {
		t.Errorf("Print returned %d, wrote\n%s\nwant 2 and\n%s", n, b.String(), want)
	}
}

// PolicyDocuments reads the files as written: policies before bindings,
// every other object a param, the MAP version set, the count bounded.
func TestPolicyDocuments(t *testing.T) {
	dir := t.TempDir()
	doc := `apiVersion: admissionregistration.k8s.io/v1alpha1
kind: MutatingAdmissionPolicyBinding
metadata: {name: mb}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: param, namespace: default}
---
apiVersion: admissionregistration.k8s.io/v1beta1
kind: ValidatingAdmissionPolicy
metadata: {name: vp}
spec: {failurePolicy: Ignore}
---
apiVersion: admissionregistration.k8s.io/v1alpha1
kind: MutatingAdmissionPolicy
metadata: {name: mp}
`
	if err := os.WriteFile(filepath.Join(dir, "p.yaml"), []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	pols, params, err := PolicyDocuments([]string{dir}, "v1beta1", 10)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range pols {
		got = append(got, p.GetAPIVersion()+" "+p.GetKind()+" "+p.GetName())
	}
	want := []string{
		"admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy vp",
		"admissionregistration.k8s.io/v1beta1 MutatingAdmissionPolicy mp",
		"admissionregistration.k8s.io/v1beta1 MutatingAdmissionPolicyBinding mb",
	}
	if !slices.Equal(got, want) || len(params) != 1 || params[0].GetName() != "param" {
		t.Errorf("policies %q params %d, want %q and the ConfigMap", got, len(params), want)
	}
	if v, _, _ := unstructured.NestedString(pols[0].Object, "spec", "failurePolicy"); v != "Ignore" {
		t.Errorf("the policy as written lost its spec: %v", pols[0].Object)
	}
	if _, _, err := PolicyDocuments([]string{dir}, "v1", 3); err == nil || !strings.Contains(err.Error(), "more than 3 objects") {
		t.Errorf("bound: got %v", err)
	}
}
