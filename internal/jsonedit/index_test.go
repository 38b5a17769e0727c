package jsonedit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/kadmit/kadmit/internal/fixture"
	"github.com/kadmit/kadmit/internal/jsonedit/jsonscan"
)

var indexDocs = []string{
	`{}`, `{"a":1}`, ` {"a" : [1, 2, {"b": null}] , "c":"d"} `,
	`{"metadata":{"name":"p","labels":{"a":"b"}},"spec":{"containers":[{"name":"c"}]},"metadata":{"name":"q"}}`,
	`{"a\u0062":1,"ab":2,"` + "\xff" + `":3,"k\n":{"x":[]}}`,
	`{"a":1,}`, `{"a" 1}`, `{"a":1}x`, `{"a":`, `{"a":tru}`,
	strings.Repeat(`{"a":`, 9999) + "1" + strings.Repeat("}", 9999),
	strings.Repeat(`{"a":`, 10001) + "1" + strings.Repeat("}", 10001),
}

func manyMembers(n int) string {
	m := make([]string, n)
	for i := range m {
		m[i] = fmt.Sprintf(`"m%d":{"v":%d}`, i, i)
	}
	return "{" + strings.Join(m, ",") + "}"
}

// TestScanIndexedMatchesScanValue: ScanIndexed accepts and ends where
// ScanValue does, and a Doc built from its Index reads and edits as a
// fresh Doc does.
func TestScanIndexedMatchesScanValue(t *testing.T) {
	docs := append(indexDocs, manyMembers(IndexMembers), manyMembers(IndexMembers+1))
	for _, s := range docs {
		// Inside an envelope, at depth 2, as the admission decoder scans.
		body := []byte(`{"request":{"object":` + s + `}}`)
		vs := bytes.IndexByte(body[1:], '{') + 1
		vs = bytes.IndexByte(body[vs+1:], '{') + vs + 1
		vs = jsonscan.SkipSpace(body, vs+len(`{"object":`))
		var ix Index
		got, want := ScanIndexed(body, vs, 2, &ix), jsonscan.ScanValue(body, vs, 2)
		if got != want {
			t.Fatalf("%.60q: ScanIndexed %d, ScanValue %d", s, got, want)
		}
		_, ok := ix.From()
		if got < 0 {
			if ok {
				t.Fatalf("%.60q: invalid, yet indexed", s)
			}
			continue
		}
		raw := bytes.Clone(body[vs:got])
		bound := ix.Bind(raw)
		if bound {
			checkExtents(t, fmt.Sprintf("%.60q", s), raw, &ix.located.ext)
		}
		if n := strings.Count(s, `"m`); bound != (n <= IndexMembers) && strings.HasPrefix(s, `{"m0"`) {
			t.Fatalf("%d members: bound %v", n, bound)
		}
		if !bound {
			continue
		}
		indexed := NewDocIndexed(raw, &ix)
		if !indexed.parsed {
			t.Fatalf("%.60q: the index was not used", s)
		}
		if other := NewDocIndexed(bytes.Clone(raw), &ix); other.parsed {
			t.Fatalf("%.60q: the index was used for other bytes", s)
		}
		fresh := NewDoc(bytes.Clone(raw))
		for _, p := range [][]string{nil, {"a"}, {"ab"}, {"\ufffd"}, {"k\n", "x"}, {"metadata", "name"}, {"m3", "v"}, {"m16"}, {"zz"}} {
			ga, ea := indexed.Get(p...)
			gb, eb := fresh.Get(p...)
			if !bytes.Equal(ga, gb) || fmt.Sprint(ea) != fmt.Sprint(eb) {
				t.Fatalf("%.60q: Get %q = %q, %v; fresh Doc %q, %v", s, p, ga, ea, gb, eb)
			}
		}
		for _, d := range []*Doc{indexed, fresh} {
			_ = d.Set("x", "metadata", "labels", "k")
			_ = d.Remove("a")
			_ = d.Append([]string{"list"}, 1, 2)
		}
		if fmt.Sprint(indexed.Ops()) != fmt.Sprint(fresh.Ops()) {
			t.Fatalf("%.60q: ops %v, fresh Doc %v", s, indexed.Ops(), fresh.Ops())
		}
	}
}

// TestIndexRecordsExtents: the envelope's scan of a Deployment's pod
// records where the containers below its top-level members end (so a Doc
// locating spec.tolerations skips spec.containers instead of scanning it),
// at most maxExtents of them however many the object has.
func TestIndexRecordsExtents(t *testing.T) {
	pod := fixture.DeploymentPodJSON()
	var ix Index
	if ScanIndexed(pod, 0, 0, &ix) != len(pod) || !ix.Bind(pod) {
		t.Fatal("the pod was not indexed")
	}
	checkExtents(t, "pod", pod, &ix.located.ext)
	doc := NewDocIndexed(pod, &ix)
	for _, p := range [][]string{{"spec", "containers"}, {"spec", "containers", "0"}, {"metadata", "labels"}} {
		s, _, err := doc.locate(p)
		if err != nil || s < 0 {
			t.Fatalf("%q: %d, %v", p, s, err)
		}
		if e := ix.located.ext.skip(pod, s, 0); e < 0 || !slices.Contains(ix.located.ext.start[:ix.located.ext.n], int32(s)) {
			t.Errorf("%q at %d: not recorded", p, s)
		}
	}
	// 200 containers at level 2: the first maxExtents are recorded, and
	// the Doc still reads past them.
	many := `{"spec":{` + strings.TrimSuffix(strings.TrimPrefix(manyMembers(200), "{"), "}") + `,"last":"x"}}`
	if ScanIndexed([]byte(many), 0, 0, &ix) != len(many) || !ix.Bind([]byte(many)) {
		t.Fatal("not indexed")
	}
	raw := ix.c.data
	checkExtents(t, "many", raw, &ix.located.ext)
	if ix.located.ext.n != maxExtents {
		t.Fatalf("%d extents recorded, want the bound %d", ix.located.ext.n, maxExtents)
	}
	if got, err := NewDocIndexed(raw, &ix).Get("spec", "last"); err != nil || string(got) != `"x"` {
		t.Fatalf("spec.last = %s, %v", got, err)
	}
}

// TestUnquoteInvalidUTF8 checks keys and strings with invalid UTF-8 read
// as the decoder reads them: U+FFFD for each bad byte.
func TestUnquoteInvalidUTF8(t *testing.T) {
	d := NewDoc([]byte("{\"k\xff\":\"v\xfe\"}"))
	var s string
	if found, err := d.Decode(&s, "k\ufffd"); err != nil || !found || s != "v\ufffd" {
		t.Fatalf("Decode = %q, %v, %v", s, found, err)
	}
}

// TestAppendPatchSkipsOnlyValuesTheDocMade: values a Doc encoded or copied
// are not scanned again, anything else is, so a broken value never
// reaches the patch.
func TestAppendPatchSkipsOnlyValuesTheDocMade(t *testing.T) {
	d := NewDoc([]byte(`{"metadata":{"labels":{"a":"b"}},"spec":{"tolerations":[{"key":"k"}]}}`))
	caller := json.RawMessage(`{"key":"raw"}`)
	appended := json.RawMessage(`{"key":"appended"}`)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(d.Set("v", "metadata", "labels", "x"))                    // encoded by the Doc
	must(d.Set(map[string]int{"n": 1}, "metadata", "annotations")) // encoded by the Doc
	must(d.Set("w", "status", "phase"))                            // wrapped into new bytes
	must(d.AppendJSON([]string{"spec", "tolerations"}, appended))  // copied
	must(d.Append([]string{"spec", "list"}, 1, "two"))             // joined into a new array
	must(d.Set(caller, "spec", "raw"))                             // the caller's bytes
	ops := d.Ops()
	for i, op := range ops {
		if got, want := len(op.checked) > 0, op.Path != "/spec/raw"; got != want {
			t.Errorf("op %d %s: checked %v, want %v", i, op.Path, got, want)
		}
	}
	want, err := AppendPatch(nil, ops)
	must(err)
	if !json.Valid(want) {
		t.Fatalf("patch %s", want)
	}
	// AppendJSON copied its value: changing the caller's bytes changes nothing.
	copy(appended, `{"key":"CHANGED!"}`)
	if again, err := AppendPatch(nil, ops); err != nil || !bytes.Equal(again, want) {
		t.Fatalf("patch after the caller changed its bytes: %s, %v", again, err)
	}
	// The caller's own RawMessage is checked every time.
	caller[0] = '!'
	if _, err := AppendPatch(nil, ops); err == nil {
		t.Fatal("AppendPatch accepted a value the caller broke after Set")
	}
	caller[0] = '{'
	// A Value replaced, or re-sliced, is checked again.
	for _, bad := range []func(op *Op){
		func(op *Op) { op.Value = json.RawMessage(`{"x"`) },
		func(op *Op) { op.Value = op.Value[:len(op.Value)-1] },
	} {
		changed := append([]Op(nil), ops...)
		bad(&changed[1])
		if _, err := AppendPatch(nil, changed); err == nil {
			t.Fatalf("AppendPatch accepted %q", changed[1].Value)
		}
		if _, err := Apply([]byte(`{"metadata":{}}`), changed[1:2]); err == nil {
			t.Fatalf("Apply accepted %q", changed[1].Value)
		}
	}
}
