package review

import (
	"context"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"

	"github.com/kadmit/kadmit/internal/jsonedit"
	"github.com/kadmit/kadmit/internal/served"
)

// The example MutatingAdmissionPolicy appends to /spec/tolerations with a
// JSONPatch: on the API server DefaultTolerationSeconds has made the list
// before the policy runs, so --defaults is what makes review agree.
func TestRunDefaults(t *testing.T) {
	whs := assembled(t, served.Sources{Declared: &served.Declared{Paths: []string{"../../examples/cel/defaults-tolerations/policy.yaml"}}})
	pod := []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"default"},"spec":{"containers":[{"name":"c","image":"nginx","resources":{"limits":{"cpu":"500m"}}}]}}`)
	doc := Document{Source: "pod.json", Object: pod}

	res, err := Run(context.Background(), whs, doc, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Allowed || !strings.Contains(res.Message, `doc is missing path: "/spec/tolerations/-"`) {
		t.Fatalf("without defaults: got allowed=%v %q, want the JSONPatch to fail", res.Allowed, res.Message)
	}

	res, err = Run(context.Background(), whs, doc, Options{Defaults: true})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Allowed {
		t.Fatalf("with defaults: denied: %d %s", res.Code, res.Message)
	}
	for p, want := range map[string]string{
		"/spec/tolerations/0/key":                   `"node.kubernetes.io/not-ready"`,
		"/spec/tolerations/2/key":                   `"dedicated"`,
		"/spec/containers/0/resources/requests/cpu": `"500m"`,
		"/spec/serviceAccountName":                  `"default"`,
	} {
		segs, _ := jsonedit.ParsePointer(p)
		got, err := jsonedit.NewDoc(res.Object).Get(segs...)
		if err != nil || string(got) != want {
			t.Errorf("%s: got %s (%v), want %s", p, got, err, want)
		}
	}
	// The patch is the policy's only, relative to the defaulted object:
	// the defaults are not in it.
	if len(res.Patch) != 1 || !strings.HasPrefix(res.Patch[0].Path, "/spec/tolerations") {
		t.Errorf("patch: got %+v, want one operation on /spec/tolerations", res.Patch)
	}

	// UPDATE: the old object is defaulted too (the stored one was).
	res, err = Run(context.Background(), whs, doc, Options{Operation: admissionv1.Update, Old: []Document{doc}, Defaults: true})
	if err != nil || !res.Allowed {
		t.Fatalf("UPDATE: %v %+v", err, res)
	}
	// Input the API server would not decode is an input error.
	bad := Document{Source: "bad.json", Object: []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"containers":"x"}}`)}
	if _, err := Run(context.Background(), whs, bad, Options{Defaults: true}); err == nil || !strings.Contains(err.Error(), "bad.json") {
		t.Errorf("bad pod: got %v, want an input error naming the document", err)
	}
}

// The API server defaults what a mutating webhook returns: with --defaults
// the documentation's sidecar, added by a declared policy, has a
// container's defaults.
func TestRunDefaultsAfterMutation(t *testing.T) {
	whs := assembled(t, served.Sources{Declared: &served.Declared{Paths: []string{"../../examples/cel/docs-map-jsonpatch/policy.yaml"}}})
	doc := Document{Source: "pod.json", Object: []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"default"},"spec":{"initContainers":[{"name":"i","image":"busybox"}],"containers":[{"name":"c","image":"nginx"}]}}`)}
	for _, defaults := range []bool{false, true} {
		res, err := Run(context.Background(), whs, doc, Options{Defaults: defaults})
		if err != nil || !res.Allowed {
			t.Fatalf("defaults %v: %v %+v", defaults, err, res)
		}
		segs, _ := jsonedit.ParsePointer("/spec/initContainers/1/terminationMessagePath")
		got, _ := jsonedit.NewDoc(res.Object).Get(segs...)
		if want := `"/dev/termination-log"`; defaults && string(got) != want || !defaults && got != nil {
			t.Errorf("defaults %v: the sidecar's terminationMessagePath: got %s", defaults, got)
		}
	}
}
