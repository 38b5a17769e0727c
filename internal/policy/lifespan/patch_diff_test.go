package lifespan

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"gomodules.xyz/jsonpatch/v2"
	jsonpatch4 "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/bench"
)

// TestMutatePatchMatchesFullDiff is the differential test of the fast path:
// on every object of the corpus, MutatePatch's operations applied to the
// original give the same object (as JSON values) as the full-object diff of
// Mutate's output, with the same verdict, or MutatePatch declines.
func TestMutatePatchMatchesFullDiff(t *testing.T) {
	benchPod, err := yaml.YAMLToJSON(bench.DefaultPod())
	if err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("x", 256<<10)
	corpus := map[string]struct {
		pod     string
		decline bool // MutatePatch must decline (non-canonical spelling)
	}{
		"bench pod":                {pod: string(benchPod)},
		"no label, no spec":        {pod: `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"}}`},
		"spec null":                {pod: `{"metadata":{"name":"p"},"spec":null}`},
		"tolerations null":         {pod: `{"metadata":{"name":"p"},"spec":{"containers":[],"tolerations":null}}`},
		"tolerations empty":        {pod: `{"metadata":{"name":"p"},"spec":{"tolerations":[]}}`},
		"no metadata":              {pod: `{"spec":{"containers":[{"name":"c"}]}}`},
		"empty object":             {pod: `{}`},
		"labelled, no spec":        {pod: `{"metadata":{"labels":{"acme.com/lifespan-requested":"3"}}}`},
		"labelled max":             {pod: `{"metadata":{"labels":{"acme.com/lifespan-requested":"14"}},"spec":{}}`},
		"labelled leading zeros":   {pod: `{"metadata":{"labels":{"acme.com/lifespan-requested":"007"}},"spec":{"tolerations":[]}}`},
		"existing tolerations":     {pod: `{"metadata":{"labels":{"acme.com/lifespan-requested":"10"}},"spec":{"tolerations":[{"key":"acme.com/lifespan-remaining","operator":"Equal","value":"12","effect":"NoSchedule"},{"key":"acme.com/lifespan-remaining","value":"10","effect":"NoSchedule"},{"key":"other","operator":"Exists"}]}}`},
		"all present":              {pod: `{"metadata":{"labels":{"acme.com/lifespan-requested":"14"}},"spec":{"tolerations":[{"key":"acme.com/lifespan-remaining","operator":"Equal","value":"14","effect":"NoSchedule"}]}}`},
		"exists present":           {pod: `{"spec":{"tolerations":[{"key":"acme.com/lifespan-remaining","operator":"Exists","effect":"NoSchedule"}]}}`},
		"exists wrong effect":      {pod: `{"spec":{"tolerations":[{"key":"acme.com/lifespan-remaining","operator":"Exists","effect":"NoExecute","tolerationSeconds":30}]}}`},
		"unicode":                  {pod: `{"metadata":{"name":"pöd-名前","labels":{"ключ":"значение","emoji":"🚀"},"annotations":{"note":"héllo \u2028 wörld \u00e9"}},"spec":{"containers":[{"name":"c","image":"ï"}]}}`},
		"large annotation":         {pod: `{"metadata":{"name":"p","annotations":{"big":"` + big + `"}},"spec":{"tolerations":[{"key":"k","operator":"Exists"}]}}`},
		"pointer chars in keys":    {pod: `{"metadata":{"name":"p","labels":{"a~b/c":"~1","x/~0y":"z"},"annotations":{"~":"/","/":"~"}},"spec":{"nodeSelector":{"a/b~c":"d"}}}`},
		"numbers kept":             {pod: `{"metadata":{"name":"p"},"spec":{"terminationGracePeriodSeconds":30.0,"priority":1e3,"tolerations":[{"key":"k","operator":"Exists","tolerationSeconds":12345678901234}]}}`},
		"whitespace":               {pod: " {\n \"metadata\" : { \"labels\" : { \"acme.com/lifespan-requested\" : \"13\" } } ,\n \"spec\" : { \"tolerations\" : [ ] } } \n"},
		"html chars":               {pod: `{"metadata":{"name":"p","annotations":{"h":"<a href=\"x\">&</a>"}}}`},
		"bad label":                {pod: `{"metadata":{"labels":{"acme.com/lifespan-requested":"15"}}}`},
		"wrong types":              {pod: `{"spec":{"tolerations":{}}}`},
		"not JSON":                 {pod: `{"metadata":`},
		"case-variant spec":        {pod: `{"Spec":{"Tolerations":[{"key":"k","operator":"Exists"}]}}`, decline: true},
		"case-variant tolerations": {pod: `{"spec":{"Tolerations":[{"key":"k","operator":"Exists"}]}}`, decline: true},
		"escaped key":              {pod: `{"spe\u0063":{"tolerations":[{"key":"k","operator":"Exists"}]}}`, decline: true},
		"duplicate spec":           {pod: `{"spec":{"tolerations":[{"key":"k","operator":"Exists"}]},"spec":{"containers":[]}}`, decline: true},
	}
	p, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for name, tc := range corpus {
		t.Run(name, func(t *testing.T) {
			raw := []byte(tc.pod)
			req := &admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{UID: "u", Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: raw}}}
			mutated, fullV := p.Mutate(ctx, req)
			ops, fastV, ok := p.MutatePatch(ctx, req)
			if !ok {
				if !tc.decline {
					t.Fatalf("MutatePatch declined")
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
			full, err := jsonpatch.CreatePatch(raw, mutated)
			if err != nil {
				t.Fatal(err)
			}
			want := apply(t, raw, full)
			got := apply(t, raw, ops)
			if !reflect.DeepEqual(decode(t, want), decode(t, got)) {
				t.Fatalf("fast patch %s\ngives %s\nfull diff gives %s", patchJSON(t, ops), got, want)
			}
			if !reflect.DeepEqual(decode(t, mutated), decode(t, got)) {
				t.Fatalf("fast patch gives %s, Mutate gives %s", got, mutated)
			}
		})
	}
}

func patchJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// apply applies ops with the JSONPatch implementation the API server uses.
func apply(t *testing.T, doc []byte, ops []jsonpatch.Operation) []byte {
	t.Helper()
	p, err := jsonpatch4.DecodePatch(patchJSON(t, ops))
	if err != nil {
		t.Fatal(err)
	}
	out, err := p.Apply(doc)
	if err != nil {
		t.Fatalf("apply %s: %v", patchJSON(t, ops), err)
	}
	return out
}

func decode(t *testing.T, b []byte) any {
	t.Helper()
	var v any
	d := json.NewDecoder(strings.NewReader(string(b)))
	d.UseNumber()
	if err := d.Decode(&v); err != nil {
		t.Fatal(err)
	}
	return v
}
