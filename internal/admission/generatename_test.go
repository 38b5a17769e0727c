package admission

import (
	"strings"
	"testing"
)

// fixedName is a names.NameGenerator with a known suffix.
type fixedName string

func (f fixedName) GenerateName(base string) string { return base + string(f) }

func TestGenerateName(t *testing.T) {
	for _, tc := range []struct {
		name, obj, want, wantName string
	}{
		{"generated", `{"kind":"Pod","metadata":{"generateName":"web-","namespace":"a"},"spec":{"n":1.50}}`,
			`{"kind":"Pod","metadata":{"generateName":"web-","namespace":"a","name":"web-abcde"},"spec":{"n":1.50}}`, "web-abcde"},
		{"empty name is generated", `{"metadata":{"name":"","generateName":"web-"}}`, `{"metadata":{"name":"web-abcde","generateName":"web-"}}`, "web-abcde"},
		{"name wins", `{"metadata":{"name":"fine","generateName":"web-"}}`, `{"metadata":{"name":"fine","generateName":"web-"}}`, "fine"},
		{"plain name", `{"metadata":{"name":"fine"}}`, `{"metadata":{"name":"fine"}}`, "fine"},
		{"no metadata", `{"kind":"Pod"}`, `{"kind":"Pod"}`, ""},
		{"null generateName", `{"metadata":{"generateName":null}}`, `{"metadata":{"generateName":null}}`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, name, err := GenerateName([]byte(tc.obj), fixedName("abcde"))
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want || name != tc.wantName {
				t.Errorf("got %s %q, want %s %q", got, name, tc.want, tc.wantName)
			}
		})
	}
	for _, bad := range []string{`{"metadata":{"generateName":1}}`, `{"metadata":{"generateName":"a-","name":2}}`, `{"metadata":[]}`, `[1]`} {
		if _, _, err := GenerateName([]byte(bad), nil); err == nil || !strings.Contains(err.Error(), "metadata") {
			t.Errorf("%s: err %v, want one naming the field", bad, err)
		}
	}
}

// TestGenerateNameDefault: without a generator, the API server's: the base
// cut to 58 bytes and 5 random lowercase alphanumerics, a new name each
// call.
func TestGenerateNameDefault(t *testing.T) {
	base := strings.Repeat("x", 70)
	seen := map[string]bool{}
	for range 5 {
		_, name, err := GenerateName([]byte(`{"metadata":{"generateName":"`+base+`"}}`), nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(name) != 63 || !strings.HasPrefix(name, base[:58]) || strings.Trim(name[58:], "bcdfghjklmnpqrstvwxz2456789") != "" {
			t.Fatalf("name %q: want 58 x and 5 random characters", name)
		}
		seen[name] = true
	}
	if len(seen) < 2 {
		t.Errorf("five generated names, %d distinct: not random", len(seen))
	}
}
