// Package policytest holds the differential test of admission mutators,
// for the policies' own tests: a mutator's JSONPatch, applied to the object
// by the API server's JSONPatch library, must give what decoding the object
// into its Go type, changing it the slow way and encoding it again gives,
// and must leave every other byte's meaning alone, numbers exact.
package policytest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	jsonpatch4 "gopkg.in/evanphx/json-patch.v4"
	k8sjson "sigs.k8s.io/json"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/fixture"
	"github.com/kadmit/kadmit/internal/jsonedit"
)

// Check applies ops to in with gopkg.in/evanphx/json-patch.v4 (what the API
// server applies webhook patches with) and fails t unless:
//
//   - the result, decoded into T as the API server decodes (case-sensitive,
//     sigs.k8s.io/json) and encoded again, equals in decoded into T,
//     changed by slow and encoded again, with numbers compared digit for
//     digit;
//   - every value of in that no operation's path reaches (an operation on
//     /a/b reaches /a/b and below) is in the result, unchanged.
//
// It returns the patched object.
func Check[T any](t testing.TB, in []byte, ops []jsonedit.Op, slow func(*T)) []byte {
	t.Helper()
	got := in
	if len(ops) > 0 {
		b, err := jsonedit.AppendPatch(nil, ops)
		if err != nil {
			t.Fatalf("encode patch %v: %v", ops, err)
		}
		p, err := jsonpatch4.DecodePatch(b)
		if err != nil {
			t.Fatalf("decode patch %s: %v", b, err)
		}
		if got, err = p.Apply(in); err != nil {
			t.Fatalf("apply patch %s: %v", b, err)
		}
	}
	var want T
	if err := k8sjson.UnmarshalCaseSensitivePreserveInts(in, &want); err != nil {
		t.Fatalf("typed decode of the input: %v", err)
	}
	slow(&want)
	var typed T
	if err := k8sjson.UnmarshalCaseSensitivePreserveInts(got, &typed); err != nil {
		t.Fatalf("typed decode of the patched object %s: %v", got, err)
	}
	if w, g := Exact(t, Marshal(t, want)), Exact(t, Marshal(t, typed)); !reflect.DeepEqual(w, g) {
		t.Fatalf("patch %v gives (typed) %s\nthe slow way gives %s", ops, Marshal(t, typed), Marshal(t, want))
	}
	var reached [][]string
	for _, op := range ops {
		segs, err := jsonedit.ParsePointer(op.Path)
		if err != nil {
			t.Fatalf("op %v: %v", op, err)
		}
		reached = append(reached, segs)
	}
	untouched(t, nil, Exact(t, in), Exact(t, got), reached)
	return got
}

// untouched fails t when a value of in below path that no operation reaches
// differs in got.
func untouched(t testing.TB, path []string, in, got any, reached [][]string) {
	t.Helper()
	for _, r := range reached {
		if len(r) <= len(path) && slices.Equal(r, path[:len(r)]) {
			return
		}
	}
	switch v := in.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			t.Fatalf("%s: was an object, is %v", jsonedit.Pointer(path...), got)
		}
		for k, sub := range v {
			gsub, ok := g[k]
			if !ok && !reachedBelow(append(slices.Clone(path), k), reached) {
				t.Fatalf("%s lost", jsonedit.Pointer(append(path, k)...))
			}
			if ok {
				untouched(t, append(slices.Clone(path), k), sub, gsub, reached)
			}
		}
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) < len(v) {
			t.Fatalf("%s: was %v, is %v", jsonedit.Pointer(path...), in, got)
		}
		for i, sub := range v {
			untouched(t, append(slices.Clone(path), fmt.Sprint(i)), sub, g[i], reached)
		}
	default:
		if !reflect.DeepEqual(in, got) {
			t.Fatalf("%s: was %v, is %v", jsonedit.Pointer(path...), in, got)
		}
	}
}

func reachedBelow(path []string, reached [][]string) bool {
	for _, r := range reached {
		if len(r) >= len(path) && slices.Equal(r[:len(path)], path) {
			return true
		}
	}
	return false
}

// Exact decodes JSON with numbers as json.Number, so that comparing two
// decoded values compares numbers digit for digit.
func Exact(t testing.TB, b []byte) any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
	return v
}

// Marshal is json.Marshal that fails t.
func Marshal(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Pods is the differential tests' corpus of pod objects, by name: the bench
// pod, missing and null fields, existing tolerations, unicode, a 256 KiB
// annotation, "~" and "/" in keys, integers above 2^53, unusual spellings
// (whitespace, escaped keys, case variants), HTML characters and unknown
// fields. Some carry the lifespan label or qos: be, for the policies on
// /mutate-pod.
func Pods(t testing.TB) map[string]string {
	benchPod := fixture.DeploymentPodJSON()
	big := strings.Repeat("x", 256<<10)
	return map[string]string{
		"bench pod":              string(benchPod),
		"no label, no spec":      `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"}}`,
		"spec null":              `{"metadata":{"name":"p"},"spec":null}`,
		"tolerations null":       `{"metadata":{"name":"p"},"spec":{"containers":[],"tolerations":null}}`,
		"tolerations empty":      `{"metadata":{"name":"p"},"spec":{"tolerations":[]}}`,
		"no metadata":            `{"spec":{"containers":[{"name":"c"}]}}`,
		"empty object":           `{}`,
		"labelled, no spec":      `{"metadata":{"labels":{"acme.com/lifespan-requested":"3"}}}`,
		"labelled max":           `{"metadata":{"labels":{"acme.com/lifespan-requested":"14"}},"spec":{}}`,
		"labelled leading zeros": `{"metadata":{"labels":{"acme.com/lifespan-requested":"007"}},"spec":{"tolerations":[]}}`,
		"existing tolerations":   `{"metadata":{"labels":{"acme.com/lifespan-requested":"10"}},"spec":{"tolerations":[{"key":"acme.com/lifespan-remaining","operator":"Equal","value":"12","effect":"NoSchedule"},{"key":"acme.com/lifespan-remaining","value":"10","effect":"NoSchedule"},{"key":"other","operator":"Exists"}]}}`,
		"all present":            `{"metadata":{"labels":{"acme.com/lifespan-requested":"14"}},"spec":{"tolerations":[{"key":"acme.com/lifespan-remaining","operator":"Equal","value":"14","effect":"NoSchedule"}]}}`,
		"exists present":         `{"spec":{"tolerations":[{"key":"acme.com/lifespan-remaining","operator":"Exists","effect":"NoSchedule"}]}}`,
		"exists wrong effect":    `{"spec":{"tolerations":[{"key":"acme.com/lifespan-remaining","operator":"Exists","effect":"NoExecute","tolerationSeconds":30}]}}`,
		"unicode":                `{"metadata":{"name":"pöd-名前","labels":{"ключ":"значение","emoji":"🚀"},"annotations":{"note":"héllo \u2028 wörld \u00e9"}},"spec":{"containers":[{"name":"c","image":"ï"}]}}`,
		"large annotation":       `{"metadata":{"name":"p","annotations":{"big":"` + big + `"}},"spec":{"tolerations":[{"key":"k","operator":"Exists"}]}}`,
		"pointer chars in keys":  `{"metadata":{"name":"p","labels":{"a~b/c":"~1","x/~0y":"z"},"annotations":{"~":"/","/":"~"}},"spec":{"nodeSelector":{"a/b~c":"d"}}}`,
		"numbers above 2^53":     `{"metadata":{"name":"p","labels":{"qos":"be"}},"spec":{"activeDeadlineSeconds":9007199254740993,"terminationGracePeriodSeconds":30,"priority":1000,"tolerations":[{"key":"k","operator":"Exists","effect":"NoExecute","tolerationSeconds":9007199254740993}]}}`,
		"whitespace":             " {\n \"metadata\" : { \"labels\" : { \"acme.com/lifespan-requested\" : \"13\", \"qos\": \"be\" } } ,\n \"spec\" : { \"tolerations\" : [ ] } } \n",
		"html chars":             `{"metadata":{"name":"p","annotations":{"h":"<a href=\"x\">&</a>"}}}`,
		"escaped keys":           `{"spe\u0063":{"toler\u0061tions":[{"key":"k","operator":"Exists"}]},"met\u0061data":{"l\u0061bels":{"qos":"be"}}}`,
		"case-variant spec":      `{"Spec":{"Tolerations":[{"key":"k","operator":"Exists"}]},"spec":{}}`,
		"unknown fields":         `{"metadata":{"name":"p","creationTimestamp":null},"spec":{"futureField":{"x":[1,2.50,1e3]},"containers":[{"name":"c","resources":{}}]},"status":{},"extra":12345678901234567890}`,
	}
}

// Mutate runs m on r and returns the object its operations produce (applied
// with jsonedit.Apply), or nil when it returned none, with its verdict.
func Mutate(t testing.TB, m admission.Mutator, r *admission.Request) ([]byte, admission.Verdict) {
	t.Helper()
	ops, v := m.Mutate(context.Background(), r)
	if len(ops) == 0 {
		return nil, v
	}
	out, err := jsonedit.Apply(r.Object.Raw, ops)
	if err != nil {
		t.Fatalf("apply %v: %v", ops, err)
	}
	return out, v
}
