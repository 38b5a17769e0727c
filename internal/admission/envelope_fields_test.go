package admission

import (
	"bytes"
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// jsonField is one JSON field of a struct as the decoder sees it.
type jsonField struct {
	name string
	typ  reflect.Type
}

// jsonFields lists the JSON fields of t as encoding/json (and
// sigs.k8s.io/json, a fork of it) sees them: the tag's name, else the Go
// name; inline (embedded, untagged or `json:",inline"`) structs contribute
// their fields, recursively; "-" is skipped.
func jsonFields(t reflect.Type) []jsonField {
	var out []jsonField
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" && opts == "" {
			continue
		}
		if f.Anonymous && (name == "" || strings.Contains(","+opts+",", ",inline,")) && f.Type.Kind() == reflect.Struct {
			out = append(out, jsonFields(f.Type)...)
			continue
		}
		if name == "" {
			name = f.Name
		}
		out = append(out, jsonField{name, f.Type})
	}
	return out
}

// reflectedFields walks t (a struct) recursively and returns, by JSON path
// from t (as decoderFields spells them), the field names of every object
// whose members are decoded member by member: a struct field, or a pointer
// to one, that does not decode itself (json.Unmarshaler, as
// runtime.RawExtension) and is not in leaves (paths read whole).
func reflectedFields(t reflect.Type, path string, leaves []string, out map[string][]string) {
	var names []string
	for _, f := range jsonFields(t) {
		names = append(names, f.name)
		ft := f.typ
		if ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		sub := f.name
		if path != "" {
			sub = path + "." + f.name
		}
		if ft.Kind() != reflect.Struct || reflect.PointerTo(ft).Implements(reflect.TypeFor[json.Unmarshaler]()) ||
			slices.Contains(leaves, sub) {
			continue
		}
		reflectedFields(ft, sub, leaves, out)
	}
	out[path] = names
}

// envelopeLeaves are the struct-valued paths the envelope decoder does not
// read member by member: it declines a review with a response.
var envelopeLeaves = []string{"response"}

// compareFields returns, both ways, where the reflected fields and the
// decoder's table differ: a field the type has and the table lacks (the fast
// path would skip it) or an object the table lacks entirely; and a table
// entry the type does not have.
func compareFields(reflected, table map[string][]string) (unknown, stale []string) {
	for path, names := range reflected {
		for _, n := range names {
			if !slices.Contains(table[path], n) {
				unknown = append(unknown, strings.TrimPrefix(path+"."+n, "."))
			}
		}
	}
	for path, names := range table {
		for _, n := range names {
			if !slices.Contains(reflected[path], n) {
				stale = append(stale, strings.TrimPrefix(path+"."+n, "."))
			}
		}
	}
	slices.Sort(unknown)
	slices.Sort(stale)
	return unknown, stale
}

// TestDecoderKnowsEveryField: admissionv1.AdmissionReview, walked by
// reflection (request, its kind, resource, userInfo, ... recursively),
// has exactly the fields of the envelope decoder's table, so a field a
// k8s.io/api bump adds cannot be skipped silently on the fast path (it
// would be, as an unknown key), and the table names no field the types do
// not have.
func TestDecoderKnowsEveryField(t *testing.T) {
	reflected := map[string][]string{}
	reflectedFields(reflect.TypeFor[admissionv1.AdmissionReview](), "", envelopeLeaves, reflected)
	if len(reflected) != len(decoderFields) {
		t.Errorf("reflection reached %d objects, the table has %d", len(reflected), len(decoderFields))
	}
	unknown, stale := compareFields(reflected, decoderFields)
	if len(unknown) > 0 {
		t.Errorf("AdmissionReview has fields the envelope decoder does not know: %v; list and handle them in envelope.go", unknown)
	}
	if len(stale) > 0 {
		t.Errorf("the envelope decoder lists fields AdmissionReview does not have: %v", stale)
	}

	// The comparison itself reports a planted difference each way: a
	// request with one field more than the table, as AdmissionRequest
	// would have after a k8s.io/api release that adds one, and a table
	// entry the type lacks.
	t.Run("planted field", func(t *testing.T) {
		type grownRequest struct {
			admissionv1.AdmissionRequest `json:",inline"`
			Priority                     string `json:"priority,omitempty"`
		}
		type grownReview struct {
			admissionv1.AdmissionReview `json:",inline"`
			Request                     *grownRequest `json:"request,omitempty"`
		}
		planted := map[string][]string{}
		reflectedFields(reflect.TypeFor[grownReview](), "", envelopeLeaves, planted)
		if unknown, _ := compareFields(planted, decoderFields); !slices.Equal(unknown, []string{"request.priority"}) {
			t.Fatalf("unknown = %v, want [request.priority]", unknown)
		}
	})
	t.Run("planted table entry", func(t *testing.T) {
		table := map[string][]string{}
		for k, v := range decoderFields {
			table[k] = v
		}
		table["request.userInfo"] = append(slices.Clone(userInfoFields), "nickname")
		if _, stale := compareFields(reflected, table); !slices.Equal(stale, []string{"request.userInfo.nickname"}) {
			t.Fatalf("stale = %v, want [request.userInfo.nickname]", stale)
		}
	})
}

// fill sets every field of v (walked by reflection) to a non-zero value,
// so that its JSON has every member; it fails on a kind it does not know,
// so a new field of a new shape fails loudly rather than being left out.
func fill(t *testing.T, v reflect.Value, name string) {
	t.Helper()
	if v.Type() == reflect.TypeFor[runtime.RawExtension]() {
		v.Set(reflect.ValueOf(runtime.RawExtension{Raw: []byte(`{"f":"` + name + `"}`)}))
		return
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString("x-" + name)
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(t, v.Elem(), name)
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 2, 2))
		for i := range 2 {
			fill(t, v.Index(i), name)
		}
	case reflect.Map:
		v.Set(reflect.MakeMap(v.Type()))
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(t, k, name+"-key")
		fill(t, e, name)
		v.SetMapIndex(k, e)
	case reflect.Struct:
		for i := range v.NumField() {
			if f := v.Type().Field(i); f.IsExported() {
				fill(t, v.Field(i), name+"."+f.Name)
			}
		}
	default:
		t.Fatalf("%s: cannot fill a %s; teach fill (and the envelope decoder) this field", name, v.Type())
	}
}

// TestDecoderHandlesEveryField: an AdmissionRequest with every field set
// (walked by reflection) is decoded by the fast path, not declined, and
// gives exactly the request sent and the API server's decoder's answer.
func TestDecoderHandlesEveryField(t *testing.T) {
	var req admissionv1.AdmissionRequest
	fill(t, reflect.ValueOf(&req).Elem(), "request")
	body, err := json.Marshal(Review{APIVersion: APIVersionV1, Kind: ReviewKind, Request: &req})
	if err != nil {
		t.Fatal(err)
	}
	blk, ok := decodeEnvelope(body)
	if !ok {
		t.Fatalf("the envelope decoder declined a request with every field set: %s", body)
	}
	if !reflect.DeepEqual(*blk.review.Request, req) {
		t.Fatalf("fast path decoded\n%#v\nsent\n%#v", *blk.review.Request, req)
	}
	want, err := oldDecodeReview(body)
	if err != nil || !reflect.DeepEqual(&blk.review, want) {
		t.Fatalf("fast path %#v; decoder %#v, %v", blk.review, want, err)
	}
	if !bytes.Contains(body, []byte(`"dryRun":true`)) {
		t.Fatalf("fill left dryRun out: %s", body)
	}
}
