package manifests

import (
	"errors"
	"strings"
	"testing"
)

func objects(t *testing.T, in string) ([]string, error) {
	t.Helper()
	var out []string
	err := Objects(strings.NewReader(in), func(obj []byte) error {
		out = append(out, string(obj))
		return nil
	})
	return out, err
}

// TestObjects: JSON and YAML streams, Lists expanded item by item
// whatever the position of their kind, a top-level items that is not an
// array kept as it was, and the errors named by object index.
func TestObjects(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     []string
	}{
		{"JSON stream", `{"kind":"Pod","n":12345678901234567890} null {"kind":"Pod","b":[1,{"c":null}]}`,
			[]string{`{"kind":"Pod","n":12345678901234567890}`, `{"kind":"Pod","b":[1,{"c":null}]}`}},
		{"JSON List, kind after items", ` {"apiVersion":"v1","items":[{"kind":"A"},{"kind":"B"}],"kind":"List"}`,
			[]string{`{"kind":"A"}`, `{"kind":"B"}`}},
		{"items not an array", `{"kind":"X","items":{"a":[1,2.5e3,"<&>"],"b":true},"z":1}`,
			[]string{`{"kind":"X","items":{"a":[1,2.5e3,"\u003c\u0026\u003e"],"b":true},"z":1}`}},
		{"YAML documents and a List", "---\n# empty\n---\nkind: Pod\nmetadata: {name: a}\n---\nkind: List\nitems:\n- {kind: A}\n- kind: B\n",
			[]string{`{"kind":"Pod","metadata":{"name":"a"}}`, `{"kind":"A"}`, `{"kind":"B"}`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := objects(t, tc.in)
			if err != nil || strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
	for _, tc := range []struct {
		name, in string
		index    int
		want     string
	}{
		{"item not an object", `{"kind":"List","items":[{"kind":"A"},3]}`, 1, "items member is not an object"},
		{"List without kind", `{"items":[{"kind":"A"}]}`, 1, "a List needs a kind"},
		{"not an object", "- a\n- b\n", 0, "must be a JSON object"},
		{"bad JSON after a List", `{"kind":"List","items":[{},{}]} {"a":`, 2, "EOF"},
		{"bad YAML", "kind: Pod\n---\nkind: [\n", 1, "yaml"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := objects(t, tc.in)
			var de *DecodeError
			if !errors.As(err, &de) || de.Index != tc.index || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want a DecodeError at %d containing %q", err, tc.index, tc.want)
			}
		})
	}
	// fn's error stops the stream at once and comes back as is.
	stop := errors.New("stop")
	n := 0
	err := Objects(strings.NewReader(`{"kind":"List","items":[{},{},{}]}`), func([]byte) error {
		if n++; n == 2 {
			return stop
		}
		return nil
	})
	if err != stop || n != 2 {
		t.Fatalf("err = %v after %d objects", err, n)
	}
}
