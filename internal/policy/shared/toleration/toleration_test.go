package toleration

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	k8sjson "sigs.k8s.io/json"

	"github.com/kadmit/kadmit/internal/jsonedit"
)

// Read must read what the decoder reads, or decline.
func TestReadMatchesDecoder(t *testing.T) {
	long := "[" + strings.Repeat(`{"key":"k"},`, MaxRead) + `{"key":"k"}]`
	for _, raw := range []string{
		`[]`, `[ ]`, `[{}]`, `[{"key":"a","operator":"Exists","effect":"NoSchedule"}]`,
		`[{"key":"node.kubernetes.io/not-ready","operator":"Exists","effect":"NoExecute","tolerationSeconds":300}]`,
		`[ { "key" : "a" , "value" : "1" } , {"effect":"NoExecute","tolerationSeconds":-0} ]`,
		`[{"key":"a","key":"b"}]`, `[{"tolerationSeconds":null}]`, `[{"tolerationSeconds":1.5}]`, `[{"tolerationSeconds":1e3}]`,
		`[{"tolerationSeconds":"300"}]`, `[{"tolerationSeconds":99999999999999999999}]`, `[{"key":null}]`, `[{"key":1}]`,
		`[{"key":"a\"b"}]`, `[{"key":"\u0061"}]`, `[{"Key":"a"}]`, `[{"unknown":"a"}]`, `[null]`, `[1]`, `{}`, `"x"`,
		`[{"key":"é<>&"}]`, long,
	} {
		var want []corev1.Toleration
		werr := k8sjson.UnmarshalCaseSensitivePreserveInts([]byte(raw), &want)
		got, ok := Read([]byte(raw), nil)
		if !ok {
			continue // the caller decodes
		}
		if werr != nil {
			t.Errorf("%s: read %v, the decoder fails: %v", raw, got, werr)
			continue
		}
		if len(want) == 0 && len(got) == 0 {
			continue
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: %+v, want %+v", raw, got, want)
		}
	}
	if _, ok := Read([]byte(`[{"key":"a"}]`), nil); !ok {
		t.Error("the common case declined")
	}
}

// ScanAt reads, through a Doc, what ScanList reads in the list's bytes.
func TestScanAtMatchesScanList(t *testing.T) {
	long := "[" + strings.Repeat(`{"key":"k"},`, MaxRead) + `{"key":"k"}]`
	for _, list := range []string{`[]`, `[{"key":"a","operator":"Exists"},{"key":"b","value":"1","tolerationSeconds":5}]`,
		`[{"key":"a\"b"}]`, `[{"unknown":"a"}]`, `[null]`, `[1]`, `{}`, `"x"`, `null`, long} {
		raw := []byte(`{"spec":{"tolerations":` + list + `}}`)
		var want, got []string
		wok := ScanList([]byte(list), func(r Raw) { want = append(want, string(r.Key)+"="+string(r.Value)) })
		if list == "null" {
			wok = true
		}
		ok, err := ScanAt(jsonedit.NewDoc(raw), []string{"spec", "tolerations"}, func(r Raw) { got = append(got, string(r.Key)+"="+string(r.Value)) })
		if err != nil || ok != wok || strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("%.60s: ScanAt %v %v %v, ScanList %v %v", list, got, ok, err, want, wok)
		}
	}
	if ok, err := ScanAt(jsonedit.NewDoc([]byte(`{"spec":{}}`)), []string{"spec", "tolerations"}, func(Raw) { t.Error("called") }); !ok || err != nil {
		t.Errorf("missing list: %v %v", ok, err)
	}
}

// AppendJSON must write what jsonedit.Marshal writes.
func TestAppendJSONMatchesMarshal(t *testing.T) {
	secs := int64(300)
	neg := int64(-5)
	for _, tol := range []corev1.Toleration{
		{}, {Key: "acme.com/lifespan", Operator: corev1.TolerationOpEqual, Value: "3", Effect: corev1.TaintEffectNoSchedule},
		{Key: "acme.com/lifespan", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
		{Key: "node.kubernetes.io/unreachable", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: &secs},
		{Value: "a\"<>&\u2028\x01é", TolerationSeconds: &neg},
	} {
		want, err := jsonedit.Marshal(tol)
		if err != nil {
			t.Fatal(err)
		}
		if got := AppendJSON(nil, tol); string(got) != string(want) {
			t.Errorf("%+v:\n got %s\nwant %s", tol, got, want)
		}
	}
}

// Of reads through Read, falls back to the decoder for what Read declines,
// and names the path in the decoder's error.
func TestOf(t *testing.T) {
	for _, c := range []struct {
		pod, want, err string
	}{
		{`{"spec":{}}`, `null`, ""},
		{`{"spec":{"tolerations":null}}`, `null`, ""},
		{`{"spec":{"tolerations":[{"key":"a","operator":"Exists"}]}}`, `[{"key":"a","operator":"Exists"}]`, ""},
		{`{"spec":{"tolerations":[{"key":"\u0061","tolerationSeconds":1e1}]}}`, ``, "/spec/tolerations"},
		{`{"spec":{"tolerations":[{"key":"\u0061"}]}}`, `[{"key":"a"}]`, ""},
		{`{"spec":{"tolerations":{}}}`, ``, "/spec/tolerations"},
	} {
		got, err := Of(jsonedit.NewDoc([]byte(c.pod)), "spec", "tolerations")
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: error %v, want one naming %s", c.pod, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.pod, err)
			continue
		}
		b, _ := jsonedit.Marshal(got)
		if string(b) != c.want {
			t.Errorf("%s: read %s, want %s", c.pod, b, c.want)
		}
	}
}

// checkKeysAbsent is KeysAbsent's property: when it says the keys are
// absent, no element of the list has one of them as the decoder reads its
// key member, whether or not the rest of the element decodes.
func checkKeysAbsent(t *testing.T, raw string, keys ...string) bool {
	t.Helper()
	ts := make([]corev1.Toleration, len(keys))
	for i, k := range keys {
		ts[i].Key = k
	}
	if !jsonedit.Valid([]byte(raw)) || !KeysAbsent([]byte(raw), ts) {
		return false
	}
	// Each element's key member alone, read case-sensitively as the API's
	// decoder reads it: an element that is not an object has no key.
	var elems []json.RawMessage
	if err := json.Unmarshal([]byte(raw), &elems); err != nil {
		t.Fatalf("%s: KeysAbsent true for something that is not an array: %v", raw, err)
	}
	for _, e := range elems {
		var key struct {
			Key *string `json:"key"`
		}
		if k8sjson.UnmarshalCaseSensitivePreserveInts(e, &key) != nil || key.Key == nil {
			var m map[string]json.RawMessage
			if json.Unmarshal(e, &m) != nil {
				continue
			}
			// The object does not decode as a whole: its key member alone.
			if k8sjson.UnmarshalCaseSensitivePreserveInts(m["key"], &key.Key) != nil || key.Key == nil {
				continue
			}
		}
		if slices.Contains(keys, *key.Key) {
			t.Fatalf("%s: KeysAbsent true, element %s has key %q", raw, e, *key.Key)
		}
	}
	return true
}

func TestKeysAbsent(t *testing.T) {
	for _, c := range []struct {
		raw    string
		keys   []string
		absent bool
	}{
		{`[]`, []string{"colocation-p0"}, true},
		{`[{"key":"node.kubernetes.io/not-ready","operator":"Exists","effect":"NoExecute","tolerationSeconds":300}]`, []string{"colocation-p0", "b"}, true},
		// Not read: an element the decoder refuses (the caller is told).
		{`[{"key":"a","tolerationSeconds":"300"},1]`, []string{"colocation-p0"}, true},
		{`[{"key":"colocation-p0","operator":"Exists"}]`, []string{"colocation-p0"}, false},
		{`[{"value":"colocation-p0"}]`, []string{"colocation-p0"}, false}, // found, if not as a key
		{`[{"key":"colocation-p0x"}]`, []string{"colocation-p0"}, true},
		{`[{"key":"xcolocation-p0"}]`, []string{"colocation-p0"}, true},
		{`[{"key":"\u0061"}]`, []string{"b"}, false}, // a backslash: not read
		{`[{"key":"\u0062"}]`, []string{"b"}, false},
		{`[{"key":"a"}]`, []string{""}, false},   // an empty key matches an absent member
		{`[{"key":"a"}]`, []string{"é"}, false},  // not printable ASCII
		{`[{"key":"a"}]`, []string{`a"`}, false}, // JSON escapes it
		{`{"key":"b"}`, []string{"a"}, false},    // not an array
		{`null`, []string{"a"}, false},
		{"[{\"key\":\"k\xff\"}]", []string{"k"}, true}, // invalid UTF-8 decodes to U+FFFD
		{`[{"key":"` + strings.Repeat("k", 300) + `"}]`, []string{strings.Repeat("k", 300)}, false},
		{`[{"key":"` + strings.Repeat("k", 300) + `"}]`, []string{strings.Repeat("k", 299)}, true},
	} {
		if got := checkKeysAbsent(t, c.raw, c.keys...); got != c.absent {
			t.Errorf("%.60s %q: KeysAbsent %v, want %v", c.raw, c.keys, got, c.absent)
		}
	}
}

// FuzzKeysAbsent: on any list, KeysAbsent is true only when no element's
// key member is one of the keys.
func FuzzKeysAbsent(f *testing.F) {
	for _, s := range []string{`[{"key":"t","operator":"Exists","effect":"NoExecute","tolerationSeconds":9}]`,
		`[{"key":"k","value":"v","operator":"Equal"},{}]`, `[{"Key":"t"},{"key":"t ","key":"u"}]`} {
		f.Add(s, "t")
	}
	f.Fuzz(func(t *testing.T, raw, key string) {
		if len(raw) > 4096 || len(key) > 64 {
			return
		}
		checkKeysAbsent(t, raw, key, "k")
	})
}
