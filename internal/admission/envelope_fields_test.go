package admission

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// jsonFields lists the JSON names of t's fields as encoding/json sees them:
// the tag's name, else the Go name; inline (embedded, untagged or
// `json:",inline"`) structs contribute their fields; "-" is skipped.
func jsonFields(t reflect.Type) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("json")
		name, opts, _ := strings.Cut(tag, ",")
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
		out = append(out, name)
	}
	return out
}

// missing returns the JSON fields of t that known does not list.
func missing(t reflect.Type, known []string) []string {
	var out []string
	for _, f := range jsonFields(t) {
		if !slices.Contains(known, f) {
			out = append(out, f)
		}
	}
	return out
}

// TestDecoderKnowsEveryField: every JSON field of the types the envelope
// decoder reads by hand is in its list for that type, so a field a
// k8s.io/api bump adds cannot be skipped silently on the fast path (it
// would be, as an unknown key); and the lists name no field the types do
// not have.
func TestDecoderKnowsEveryField(t *testing.T) {
	for _, c := range []struct {
		typ   reflect.Type
		known []string
	}{
		{reflect.TypeFor[admissionv1.AdmissionReview](), reviewFields},
		{reflect.TypeFor[admissionv1.AdmissionRequest](), requestFields},
		{reflect.TypeFor[metav1.GroupVersionKind](), gvkFields},
		{reflect.TypeFor[metav1.GroupVersionResource](), gvrFields},
		{reflect.TypeFor[authenticationv1.UserInfo](), userInfoFields},
	} {
		if m := missing(c.typ, c.known); len(m) > 0 {
			t.Errorf("%s has fields the envelope decoder does not know: %v; list and handle them in envelope.go", c.typ, m)
		}
		have := jsonFields(c.typ)
		for _, k := range c.known {
			if !slices.Contains(have, k) {
				t.Errorf("%s: the decoder lists %q, which the type does not have", c.typ, k)
			}
		}
	}
}

// TestDecoderFieldCheckCatchesANewField: the check above fails for a type
// with one field more than the decoder's list, as AdmissionRequest would
// after a k8s.io/api release that adds one.
func TestDecoderFieldCheckCatchesANewField(t *testing.T) {
	type grownRequest struct {
		admissionv1.AdmissionRequest `json:",inline"`
		Priority                     string `json:"priority,omitempty"`
	}
	if m := missing(reflect.TypeFor[grownRequest](), requestFields); !slices.Equal(m, []string{"priority"}) {
		t.Fatalf("missing = %v, want [priority]", m)
	}
}
