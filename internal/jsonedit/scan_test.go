package jsonedit

import (
	"encoding/json"
	"reflect"
	"testing"
)

// TestEachMember: EachMember walks exactly the members encoding/json
// reads (raw keys, values as spelled, in order), refuses what is not one
// valid object, stops when fn says so, and allocates nothing.
func TestEachMember(t *testing.T) {
	for _, s := range []string{`{}`, ` {"a" : 1 , "b":[1,{"c":2}], "a":"x"} `, `{"k\u0065y":null}`} {
		var keys []string
		var vals []json.RawMessage
		if !EachMember([]byte(s), func(k, v []byte) bool {
			keys, vals = append(keys, string(k)), append(vals, json.RawMessage(v))
			return true
		}) {
			t.Fatalf("%s: refused", s)
		}
		for _, v := range vals {
			if !json.Valid(v) {
				t.Fatalf("%s: value %q is not a whole value", s, v)
			}
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal([]byte(s), &m); err != nil || (len(m) == 0) != (len(keys) == 0) {
			t.Fatalf("%s: %v, %d keys", s, err, len(keys))
		}
	}
	for _, s := range []string{``, `[]`, `{"a":1`, `{"a":1}x`, `{"a" 1}`, `{1:2}`, `null`} {
		if EachMember([]byte(s), func(k, v []byte) bool { return true }) {
			t.Errorf("%q: accepted", s)
		}
	}
	n := 0
	if EachMember([]byte(`{"a":1,"b":2,"c":3}`), func(k, v []byte) bool { n++; return n < 2 }) || n != 2 {
		t.Fatalf("stop: walked %d members", n)
	}
	doc := []byte(`{"metadata":{"name":"p","labels":{"a":"b"}},"spec":{"containers":[{"name":"c"}]}}`)
	if a := testing.AllocsPerRun(100, func() {
		EachMember(doc, func(k, v []byte) bool { return true })
	}); a != 0 {
		t.Fatalf("EachMember allocates %v times per call", a)
	}
}

// TestEachElement: the elements as spelled, in order; not an array or
// invalid JSON is refused.
func TestEachElement(t *testing.T) {
	var got []string
	if !EachElement([]byte(` [1, "a" ,{"b":[]}] `), func(v []byte) bool { got = append(got, string(v)); return true }) {
		t.Fatal("refused")
	}
	if want := []string{`1`, `"a"`, `{"b":[]}`}; !reflect.DeepEqual(got, want) {
		t.Fatalf("elements %q, want %q", got, want)
	}
	for _, s := range []string{`{}`, `[1,]`, `[1 2]`, `[`} {
		if EachElement([]byte(s), func([]byte) bool { return true }) {
			t.Errorf("%q: accepted", s)
		}
	}
}

// TestUnmarshalIsCaseSensitive: the key rule is the API server's.
func TestUnmarshalIsCaseSensitive(t *testing.T) {
	var v struct {
		Name string `json:"name"`
	}
	if err := Unmarshal([]byte(`{"Name":"q","NAME":"r"}`), &v); err != nil || v.Name != "" {
		t.Fatalf("name %q, %v: a case variant matched", v.Name, err)
	}
	if err := Unmarshal([]byte(`{"n\u0061me":"e"}`), &v); err != nil || v.Name != "e" {
		t.Fatalf("name %q, %v: an escaped exact name did not match", v.Name, err)
	}
}
