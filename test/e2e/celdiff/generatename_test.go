package celdiff

import (
	"context"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apiserver/pkg/storage/names"

	"github.com/kadmit/kadmit/internal/celpolicy"
	"github.com/kadmit/kadmit/internal/policysuite"
)

// fixedName is names.SimpleNameGenerator with a known suffix: the base
// cut to names.MaxGeneratedNameLength, then the suffix.
type fixedName string

func (f fixedName) GenerateName(base string) string {
	if len(base) > names.MaxGeneratedNameLength {
		base = base[:names.MaxGeneratedNameLength]
	}
	return base + string(f)
}

// generatedSuffix is what k8s.io/apiserver v0.37.1's SimpleNameGenerator
// appends: 5 characters of utilrand's alphabet.
var generatedSuffix = regexp.MustCompile(`^[bcdfghjklmnpqrstvwxz2456789]{5}$`)

// TestGenerateName: the API server names a generateName object between
// mutating and validating admission (the mutating policy sees no name, the
// validating one sees it in object.metadata.name and request.name), which
// `kadmit test` and `kadmit review` repeat offline (admission.GenerateName).
// The suite internal/policysuite/testdata/generatename records that; here its
// expectations must hold on a real API server, and the engine's outcome
// (policysuite.Evaluate, the name generated with a known suffix) must equal
// the API server's once its random suffix is replaced by the same one.
// Not in the corpus TestCorpus runs: its engine side starts from the
// object the API server admitted, already named.
func TestGenerateName(t *testing.T) {
	requireWorld(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	file := filepath.Join("..", "..", "..", "internal", "policysuite", "testdata", "generatename", "suite.yaml")
	s, err := policysuite.ReadSuite(file)
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, p := range s.Policies {
		paths = append(paths, filepath.Join(filepath.Dir(file), p))
	}
	set, err := celpolicy.Load(paths...)
	if err != nil {
		t.Fatal(err)
	}
	engine, err := celpolicy.New(set, celpolicy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	written, _ := policyDocuments(t, paths)

	var reqs []*request
	for i := range s.Tests {
		r := buildRequest(ctx, t, filepath.Dir(file), &s.Tests[i])
		base, err := send(ctx, r)
		if err != nil || !base.Allowed {
			t.Fatalf("%s: without policies: %v %s", r.test.Name, err, base)
		}
		r.admitted = &unstructured.Unstructured{Object: base.Object}
		reqs = append(reqs, r)
	}

	// The engine, on the object as admitted without policies but unnamed
	// again when the test's object has no name (the admitted one was named
	// by that dry run).
	want := make([]outcome, len(reqs))
	for i, r := range reqs {
		req := engineRequest(t, r)
		if r.obj.GetName() == "" {
			obj := r.admitted.DeepCopy()
			for _, f := range []string{"name", "uid", "creationTimestamp"} {
				unstructured.RemoveNestedField(obj.Object, "metadata", f)
			}
			if req.Object, err = obj.MarshalJSON(); err != nil {
				t.Fatal(err)
			}
			req.Name = ""
		}
		d, err := policysuite.EvaluateWith(ctx, engine, req, fixedName("xxxxx"))
		if err != nil {
			t.Fatalf("%s: engine: %v", r.test.Name, err)
		}
		want[i] = outcome{Allowed: d.Allowed, Warnings: nonNil(d.Warnings)}
		if !d.Allowed {
			want[i].Code, want[i].Message = d.Status.Code, d.Status.Message
		}
	}

	remove := installPolicies(ctx, t, written)
	defer remove()
	// Both policies in effect: the mutating one annotates, the validating
	// one denies the blocked- pod.
	waitFor(ctx, t, "policies in effect", func() bool {
		a, err := send(ctx, reqs[0])
		if err != nil || !a.Allowed {
			return false
		}
		annotations, _, _ := unstructured.NestedStringMap(a.Object, "metadata", "annotations")
		d, err := send(ctx, reqs[2])
		return err == nil && annotations["saw-name"] != "" && !d.Allowed
	})
	for i, r := range reqs {
		got, err := send(ctx, r)
		if err != nil {
			t.Fatalf("%s: %v", r.test.Name, err)
		}
		f, skipped := checkExpect(r.test.Expect, got, r.obj.Object, r.admitted.Object)
		if len(f) > 0 || len(skipped) > 0 {
			t.Errorf("%s: the API server does not decide what the suite expects:\n  %s\n  not checked: %v", r.test.Name, strings.Join(f, "\n  "), skipped)
		}
		// The API server's generated name, and its suffix replaced by the
		// engine's in the message.
		name := r.obj.GetName()
		if name == "" {
			gen := r.obj.GetGenerateName()
			if len(gen) > names.MaxGeneratedNameLength {
				gen = gen[:names.MaxGeneratedNameLength]
			}
			name = gen + "xxxxx"
			if got.Allowed {
				served, _, _ := unstructured.NestedString(got.Object, "metadata", "name")
				if !strings.HasPrefix(served, gen) || !generatedSuffix.MatchString(strings.TrimPrefix(served, gen)) {
					t.Errorf("%s: the API server named it %q, want %q and 5 random characters", r.test.Name, served, gen)
				}
			} else {
				got.Message = regexp.MustCompile(regexp.QuoteMeta(gen)+`[bcdfghjklmnpqrstvwxz2456789]{5}`).ReplaceAllString(got.Message, name)
			}
		}
		w := want[i]
		if w.Allowed != got.Allowed || w.Code != got.Code || w.Message != got.Message || !reflect.DeepEqual(w.Warnings, nonNil(got.Warnings)) {
			t.Errorf("%s: kadmit and the API server differ:\n kadmit:     %s\n API server: %s", r.test.Name, w, strip(got))
		} else {
			t.Logf("%s: identical: allowed=%v code=%d message=%q", r.test.Name, got.Allowed, got.Code, got.Message)
		}
	}
}
