package jsonedit

import (
	"encoding/json"
	"reflect"
	"strings"
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

// MayHoldString is false only where no string in the text can decode to
// s; each false case is checked against the decoded text.
func TestMayHoldString(t *testing.T) {
	for _, c := range []struct {
		raw, s string
		may    bool
	}{
		{`{"a":"b"}`, "c", false},
		{`{"a":"b"}`, "a", true},                      // a member name
		{`[{"k":"x-y"}]`, "x-y", true},                // a value
		{`[{"k":"x-yz"},{"k":"wx-y"}]`, "x-y", false}, // inside longer strings only
		{`{"a":"\u0062"}`, "b", true},                 // a backslash: not sure
		{`{"a":"\\"}`, "q", true},                     // any backslash
		{`{"a":"b"}`, "", true},                       // empty: an absent member may count
		{`{"a":"é"}`, "é", true},                      // not printable ASCII
		{`{"a":"b"}`, `b"`, true},                     // JSON escapes it
		{"{\"a\":\"k\xff\"}", "k", false},             // invalid UTF-8 decodes to U+FFFD
		{`{"` + strings.Repeat("k", 100) + `":1}`, strings.Repeat("k", 100), true}, // longer than the buffer
		{`{"` + strings.Repeat("k", 100) + `":1}`, strings.Repeat("k", 99), false},
	} {
		if got := MayHoldString([]byte(c.raw), c.s); got != c.may {
			t.Errorf("%.40s %.20q: %v, want %v", c.raw, c.s, got, c.may)
		}
		if !c.may && strings.Contains(decodedStrings(t, c.raw), "\x00"+c.s+"\x00") {
			t.Errorf("%s: false, but it decodes to a string %q", c.raw, c.s)
		}
	}
}

// decodedStrings is every string of the JSON text raw (member names and
// values), decoded, each between NUL bytes.
func decodedStrings(t *testing.T, raw string) string {
	t.Helper()
	var v any
	if err := Unmarshal([]byte(raw), &v); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	var walk func(any)
	walk = func(v any) {
		switch v := v.(type) {
		case string:
			b.WriteString("\x00" + v + "\x00")
		case map[string]any:
			for k, e := range v {
				b.WriteString("\x00" + k + "\x00")
				walk(e)
			}
		case []any:
			for _, e := range v {
				walk(e)
			}
		}
	}
	walk(v)
	return b.String()
}
