package toleration

import (
	"reflect"
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
