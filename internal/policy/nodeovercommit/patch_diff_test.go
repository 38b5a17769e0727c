package nodeovercommit

import (
	"context"
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"

	"gomodules.xyz/jsonpatch/v2"
	jsonpatch4 "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
)

// TestMutatePatchMatchesFullDiff is the differential test of the fast path:
// MutatePatch's operations applied to the original node give the same object
// (as JSON values) as the full diff of Mutate's output, with the same
// verdict, or MutatePatch declines.
func TestMutatePatchMatchesFullDiff(t *testing.T) {
	benchNode, err := os.ReadFile("../../admission/testdata/node.json")
	if err != nil {
		t.Fatal(err)
	}
	raw := `{"allocatable":{"cpu":"3500m"},"capacity":{"cpu":"4"}}`
	corpus := map[string]struct {
		node    string
		decline bool
	}{
		"bench node":            {node: string(benchNode)},
		"no annotations":        {node: node(t, nil, map[string]string{"cpu": "4"}, map[string]string{"cpu": "3500m"})},
		"other annotations":     {node: node(t, map[string]string{"a/b~c": "ü", "big": strings.Repeat("y", 100000)}, map[string]string{"cpu": "4"}, map[string]string{"cpu": "3500m"})},
		"already amplified":     {node: node(t, map[string]string{AnnotationRaw: raw}, map[string]string{"cpu": "7500m"}, map[string]string{"cpu": "7"})},
		"new raw values":        {node: node(t, map[string]string{AnnotationRaw: raw}, map[string]string{"cpu": "8"}, map[string]string{"cpu": "8"})},
		"unreadable raw":        {node: node(t, map[string]string{AnnotationRaw: "{"}, map[string]string{"cpu": "4"}, map[string]string{"cpu": "3500m"})},
		"stale raw, no cpu":     {node: node(t, map[string]string{AnnotationRaw: raw}, map[string]string{"memory": "1Gi"}, map[string]string{"memory": "1Gi"})},
		"ratio override":        {node: node(t, map[string]string{AnnotationRatio: `{"cpu":"1.5","example.com/gpu":"2"}`}, map[string]string{"cpu": "4", "example.com/gpu": "2"}, map[string]string{"cpu": "4", "example.com/gpu": "2"})},
		"bad override":          {node: node(t, map[string]string{AnnotationRatio: `x`}, map[string]string{"cpu": "4"}, map[string]string{"cpu": "4"})},
		"no status":             {node: `{"metadata":{"name":"n"}}`},
		"no metadata":           {node: `{"status":{"capacity":{"cpu":"2"},"allocatable":{"cpu":"2"}}}`},
		"metadata null":         {node: `{"metadata":null,"status":{"capacity":{"cpu":"2"},"allocatable":{"cpu":"2"}}}`},
		"annotations null":      {node: `{"metadata":{"name":"n","annotations":null},"status":{"capacity":{"cpu":"2"},"allocatable":{"cpu":"2"}}}`},
		"case-variant metadata": {node: `{"Metadata":{"annotations":{}},"status":{"capacity":{"cpu":"2"},"allocatable":{"cpu":"2"}}}`, decline: true},
		"escaped status":        {node: `{"st\u0061tus":{"capacity":{"cpu":"2"},"allocatable":{"cpu":"2"}}}`, decline: true},
		"not JSON":              {node: `{"status":`},
	}
	cfg := DefaultConfig()
	cfg.Ratios = map[corev1.ResourceName]string{"cpu": "2", "example.com/gpu": "1.5"}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for name, tc := range corpus {
		t.Run(name, func(t *testing.T) {
			req := request(admissionv1.Create, "", tc.node, "")
			mutated, fullV := p.Mutate(ctx, req)
			ops, fastV, ok := p.MutatePatch(ctx, req)
			if !ok {
				if !tc.decline {
					t.Fatal("MutatePatch declined")
				}
				return
			}
			if tc.decline && ops != nil {
				t.Fatalf("MutatePatch did not decline: %v", ops)
			}
			if !reflect.DeepEqual(fullV, fastV) {
				t.Fatalf("verdicts differ: full %+v, fast %+v", fullV, fastV)
			}
			if mutated == nil {
				if ops != nil {
					t.Fatalf("Mutate changed nothing, MutatePatch returned %v", ops)
				}
				return
			}
			full, err := jsonpatch.CreatePatch([]byte(tc.node), mutated)
			if err != nil {
				t.Fatal(err)
			}
			want, got := applyOps(t, tc.node, full), applyOps(t, tc.node, ops)
			if !reflect.DeepEqual(want, got) {
				t.Fatalf("fast patch %v gives %v\nfull diff gives %v", ops, got, want)
			}
		})
	}
}

func applyOps(t *testing.T, doc string, ops []jsonpatch.Operation) any {
	t.Helper()
	b, err := json.Marshal(ops)
	if err != nil {
		t.Fatal(err)
	}
	p, err := jsonpatch4.DecodePatch(b)
	if err != nil {
		t.Fatal(err)
	}
	out, err := p.Apply([]byte(doc))
	if err != nil {
		t.Fatalf("apply %s: %v", b, err)
	}
	var v any
	d := json.NewDecoder(strings.NewReader(string(out)))
	d.UseNumber()
	if err := d.Decode(&v); err != nil {
		t.Fatal(err)
	}
	return v
}
