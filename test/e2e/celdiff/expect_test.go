package celdiff

import (
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/kadmit/kadmit/internal/jsonedit"
	"github.com/kadmit/kadmit/internal/policysuite"
)

// checkExpect compares one side's outcome with what the suite's test
// records (expect:), so that a bug both sides share still fails. It is
// policysuite's comparison (internal/policysuite/suite.go compare) with two
// differences, because here the object went through the API server's own
// admission and defaulting before and after the policies (a container
// gains imagePullPolicy, DefaultTolerationSeconds prepends two
// tolerations, ...), where `kadmit test` sees the object as the suite
// writes it:
//   - expect.patched and expect.object values are matched as a subset of
//     what is there;
//   - a patched pointer is checked only where the API server's admission
//     without policies (admitted) left the pointer's parent and target as
//     the suite wrote them (raw); the others are returned in skipped, as
//     their positions mean something else here.
func checkExpect(e policysuite.Expect, o outcome, raw, admitted map[string]any) (f, skipped []string) {
	if *e.Allowed != o.Allowed {
		f = append(f, fmt.Sprintf("allowed: got %v (%d %s), want %v", o.Allowed, o.Code, o.Message, *e.Allowed))
	}
	code := o.Code
	if o.Allowed {
		code = 200
	}
	if e.Code != nil && *e.Code != code {
		f = append(f, fmt.Sprintf("code: got %d, want %d", code, *e.Code))
	}
	if e.Message != nil && *e.Message != o.Message {
		f = append(f, fmt.Sprintf("message: got %q, want %q", o.Message, *e.Message))
	}
	if e.MessageContains != "" && !strings.Contains(o.Message, e.MessageContains) {
		f = append(f, fmt.Sprintf("message: got %q, want it to contain %q", o.Message, e.MessageContains))
	}
	if e.Warnings != nil && !slices.Equal(nonNil(o.Warnings), *e.Warnings) {
		f = append(f, fmt.Sprintf("warnings: got %q, want %q", o.Warnings, *e.Warnings))
	}
	keys := slices.Sorted(maps.Keys(e.AuditAnnotations))
	for _, k := range keys {
		if got, ok := o.Audit[k]; !ok || got != e.AuditAnnotations[k] {
			f = append(f, fmt.Sprintf("auditAnnotations[%s]: got %q (present %v), want %q", k, got, ok, e.AuditAnnotations[k]))
		}
	}
	if len(e.Patched) == 0 && len(e.Object) == 0 {
		return f, nil
	}
	if !o.Allowed {
		return append(f, "patched/object: denied, so nothing to compare"), nil
	}
	result, err := json.Marshal(o.Object)
	if err != nil {
		return append(f, err.Error()), nil
	}
	rawJSON, err := json.Marshal(raw)
	if err != nil {
		return append(f, err.Error()), nil
	}
	admittedJSON, err := json.Marshal(admitted)
	if err != nil {
		return append(f, err.Error()), nil
	}
	if len(e.Object) > 0 {
		var want any
		if err := json.Unmarshal(e.Object, &want); err != nil || !subset(want, o.Object) {
			f = append(f, fmt.Sprintf("object: got %s, want (a subset) %s", result, e.Object))
		}
	}
	pointers := slices.Sorted(maps.Keys(e.Patched))
	for _, p := range pointers {
		segs, err := jsonedit.ParsePointer(p)
		if err != nil {
			f = append(f, fmt.Sprintf("patched %s: %v", p, err))
			continue
		}
		if !untouched(rawJSON, admittedJSON, segs[:len(segs)-1]) || !untouched(rawJSON, admittedJSON, segs) {
			skipped = append(skipped, p)
			continue
		}
		got, err := jsonedit.NewDoc(result).Get(segs...)
		if err != nil {
			f = append(f, fmt.Sprintf("patched %s: %v", p, err))
			continue
		}
		var want any
		if err := json.Unmarshal(e.Patched[p], &want); err != nil {
			f = append(f, fmt.Sprintf("patched %s: %v", p, err))
			continue
		}
		if want == nil {
			if got != nil && string(got) != "null" {
				f = append(f, fmt.Sprintf("patched %s: got %s, want nothing there", p, got))
			}
			continue
		}
		var have any
		if got == nil || json.Unmarshal(got, &have) != nil || !subset(want, have) {
			f = append(f, fmt.Sprintf("patched %s: got %s, want (a subset) %s", p, got, e.Patched[p]))
		}
	}
	return f, skipped
}

// untouched reports whether the value at path is as the suite wrote it
// (raw) after the API server's admission without policies (admitted):
// absent in both, or raw's a subset of admitted's.
func untouched(raw, admitted []byte, path []string) bool {
	r, rerr := jsonedit.NewDoc(raw).Get(path...)
	a, aerr := jsonedit.NewDoc(admitted).Get(path...)
	if rerr != nil || aerr != nil {
		return false
	}
	if r == nil || a == nil {
		return r == nil && a == nil
	}
	var rv, av any
	if json.Unmarshal(r, &rv) != nil || json.Unmarshal(a, &av) != nil {
		return false
	}
	return subset(rv, av)
}

// subset reports whether every field of want is in have with the same
// value; lists must have the same length, element by element.
func subset(want, have any) bool {
	switch w := want.(type) {
	case map[string]any:
		h, ok := have.(map[string]any)
		if !ok {
			return false
		}
		for k, v := range w {
			hv, ok := h[k]
			if !ok || !subset(v, hv) {
				return false
			}
		}
		return true
	case []any:
		h, ok := have.([]any)
		if !ok || len(h) != len(w) {
			return false
		}
		for i := range w {
			if !subset(w[i], h[i]) {
				return false
			}
		}
		return true
	default:
		// JSON numbers: the API server's object decodes to int64 where
		// json.Unmarshal gives float64; compare through JSON.
		a, _ := json.Marshal(want)
		b, _ := json.Marshal(have)
		return reflect.DeepEqual(a, b)
	}
}

// policyDocuments reads the suite's policy files as written
// (policysuite.PolicyDocuments, what `kadmit test --server` installs): the
// four policy kinds, to create in the API server without going through
// kadmit's loader (a loading bug in kadmit, such as a dropped
// namespaceSelector, then shows up as a difference), and every other
// object as a param. MutatingAdmissionPolicy kinds are sent in the
// version the server serves (world.mapVersion; the fields are the same).
func policyDocuments(t *testing.T, paths []string) (policies, params []*unstructured.Unstructured) {
	t.Helper()
	policies, params, err := policysuite.PolicyDocuments(paths, world.mapVersion, policysuite.DefaultMaxObjects)
	if err != nil {
		t.Fatal(err)
	}
	return policies, params
}
