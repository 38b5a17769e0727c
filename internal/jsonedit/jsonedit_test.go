package jsonedit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	jsonpatch4 "gopkg.in/evanphx/json-patch.v4"
)

// decodeExact decodes d keeping numbers as written (json.Number), so that
// comparisons see every digit.
func decodeExact(t testing.TB, d []byte) any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(d))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("decode %s: %v", d, err)
	}
	return v
}

// library applies ops with the API server's JSONPatch library: the oracle.
func library(t testing.TB, doc []byte, ops []Op) (_ []byte, err error) {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	b, err := AppendPatch(nil, ops)
	if err != nil {
		t.Fatal(err)
	}
	p, err := jsonpatch4.DecodePatch(b)
	if err != nil {
		return nil, err
	}
	return p.Apply(doc)
}

const big = `9007199254740993`

var applyDocs = []string{
	`{"a":1,"b":{"c":[1,2,3],"d":null,"e":{}},"n":` + big + `,"f":1.50e+3}`,
	` { "a" : 1 , "b" : { "c" : [ ] } } `,
	`{"spec":{"tolerations":[{"key":"k","tolerationSeconds":` + big + `}]},"metadata":{"labels":{"a/b~c":"x"}}}`,
	`{"dup":1,"dup":{"x":2},"o":{"k":"v","k":"w"}}`,
	`{"spe\u0063":{"x":1},"h":"<&>\u2028"}`,
	`{"arr":[[1],[2,[3]]],"empty":[],"s":"str","z":0}`,
	`[1,{"a":2}]`,
	`{}`,
	`null`,
	`{"a":`,
}

var applyPatches = [][]Op{
	{{Op: "add", Path: "/x", Value: []byte(big)}},
	{{Op: "add", Path: "/a", Value: []byte(`"<&>"`)}},
	{{Op: "remove", Path: "/a"}},
	{{Op: "remove", Path: "/missing"}},
	{{Op: "replace", Path: "/missing", Value: []byte(`1`)}},
	{{Op: "replace", Path: "/n", Value: []byte(`{"deep":[` + big + `]}`)}},
	{{Op: "add", Path: "/b/c/-", Value: []byte(`4`)}, {Op: "add", Path: "/b/c/-", Value: []byte(`5`)}, {Op: "add", Path: "/b/c/0", Value: []byte(`0`)}},
	{{Op: "add", Path: "/b/c/3", Value: []byte(`9`)}, {Op: "remove", Path: "/b/c/0"}, {Op: "replace", Path: "/b/c/1", Value: []byte(`7`)}},
	{{Op: "add", Path: "/b/c/9", Value: []byte(`9`)}},
	{{Op: "add", Path: "/b/c/-1", Value: []byte(`9`)}},
	{{Op: "add", Path: "/b/c/01", Value: []byte(`9`)}},
	{{Op: "add", Path: "/b/d/x", Value: []byte(`1`)}},
	{{Op: "add", Path: "/b/e/x", Value: []byte(`1`)}, {Op: "add", Path: "/b/e/y~1z~0", Value: []byte(`[]`)}, {Op: "remove", Path: "/b/e/x"}},
	{{Op: "add", Path: "/spec/tolerations/-", Value: []byte(`{"key":"new"}`)}, {Op: "add", Path: "/metadata/labels/a~1b~0c", Value: []byte(`"y"`)}},
	{{Op: "add", Path: "/spec", Value: []byte(`{"y":2}`)}},
	{{Op: "add", Path: "/dup/y", Value: []byte(`3`)}, {Op: "remove", Path: "/o/k"}},
	{{Op: "add", Path: "/dup", Value: []byte(`0`)}, {Op: "replace", Path: "/o/k", Value: []byte(`"z"`)}},
	{{Op: "remove", Path: "/dup"}},
	{{Op: "add", Path: "/arr/1/1/-", Value: []byte(`4`)}, {Op: "remove", Path: "/arr/0"}},
	{{Op: "add", Path: "/empty/0", Value: []byte(`1`)}, {Op: "add", Path: "/empty/-", Value: []byte(`2`)}},
	// Appends only (appendRun), to compact arrays and, in the second
	// document, to one with space in it.
	{{Op: "add", Path: "/b/c/-", Value: []byte(`4`)}, {Op: "add", Path: "/b/c/-", Value: []byte(" {\"x\":5}\n")}},
	{{Op: "add", Path: "/empty/-", Value: []byte(`1`)}, {Op: "add", Path: "/empty/-", Value: []byte(`[2]`)}},
	{{Op: "add", Path: "/spec/tolerations/-", Value: []byte(`{"key":"new"}`)}, {Op: "add", Path: "/arr/1/1/-", Value: []byte(`4`)}},
	{{Op: "add", Path: "/s/x", Value: []byte(`1`)}},
	{{Op: "add", Path: "/1/b", Value: []byte(`1`)}, {Op: "add", Path: "/-", Value: []byte(`3`)}},
	{{Op: "add", Path: "", Value: []byte(`{"root":true}`)}},
	{{Op: "test", Path: "/a", Value: []byte(`1`)}, {Op: "add", Path: "/t", Value: []byte(`true`)}},
	{{Op: "move", From: "/a", Path: "/moved"}},
	{{Op: "copy", From: "/b", Path: "/copied"}},
	{{Op: "add", Path: "/x~2", Value: []byte(`1`)}},
	{{Op: "add", Path: "/x", Value: []byte(`{bad`)}},
	{{Op: "add", Path: "/x"}},
	{{Op: "frob", Path: "/x"}},
}

// TestApplyMatchesLibrary is the differential test of Apply: on every
// document and patch, it succeeds exactly when the API server's library
// does, with the same document (as JSON values, numbers exact).
func TestApplyMatchesLibrary(t *testing.T) {
	for _, doc := range applyDocs {
		for _, ops := range applyPatches {
			checkApply(t, []byte(doc), ops)
		}
	}
}

func checkApply(t *testing.T, doc []byte, ops []Op) {
	t.Helper()
	valid := true
	for _, op := range ops {
		if op.Value != nil && !Valid(op.Value) {
			valid = false
		}
	}
	got, err := Apply(doc, ops)
	checkApplyIndexed(t, doc, ops, got, err)
	if !valid {
		if err == nil {
			t.Fatalf("%s with invalid value %v: no error", doc, ops)
		}
		return
	}
	want, werr := library(t, doc, ops)
	if (err == nil) != (werr == nil) {
		t.Fatalf("%s %v: Apply error %v, library error %v", doc, ops, err, werr)
	}
	// Identical bytes need no decoding (the library passes some documents
	// that are not JSON, such as an empty one, through unchanged).
	if err != nil || bytes.Equal(got, want) {
		return
	}
	if !reflect.DeepEqual(decodeExact(t, got), decodeExact(t, want)) {
		t.Fatalf("%s %v:\nApply   %s\nlibrary %s", doc, ops, got, want)
	}
}

// checkApplyIndexed checks ApplyIndexed, given doc's Index when it has one,
// answers as Apply did (got, err), and that the Index it makes of the
// result locates what a scan of the result locates.
func checkApplyIndexed(t *testing.T, doc []byte, ops []Op, got []byte, err error) {
	t.Helper()
	var ix, out Index
	if len(doc) > 0 && doc[0] == '{' && ScanIndexed(doc, 0, 0, &ix) == len(doc) && ix.Bind(doc) {
		// A Doc locates the containers the patch edits, and those on the
		// way to them, as a mutator's would: the index keeps them.
		d := NewDocIndexed(doc, &ix)
		for _, op := range ops {
			if p, err := ParsePointer(op.Path); err == nil {
				_, _ = d.Get(p...)
			}
		}
	}
	gotIx, errIx := ApplyIndexed(doc, &ix, ops, &out)
	if !bytes.Equal(gotIx, got) || (errIx == nil) != (err == nil) {
		t.Fatalf("%s %v: ApplyIndexed %s, %v; Apply %s, %v", doc, ops, gotIx, errIx, got, err)
	}
	n, bound := out.Len(gotIx)
	if !bound {
		return
	}
	checkLocated(t, fmt.Sprintf("%s %v", doc, ops), gotIx, &out)
	var fresh Index
	if ScanIndexed(gotIx, 0, 0, &fresh) != len(gotIx) || !fresh.Bind(gotIx) {
		t.Fatalf("%s %v: result %s indexed, but a scan does not index it", doc, ops, gotIx)
	}
	if m, _ := fresh.Len(gotIx); m != n {
		t.Fatalf("%s %v: %d members indexed, a scan finds %d", doc, ops, n, m)
	}
	for k := range n {
		a0, a1, a2, a3 := out.Member(k)
		b0, b1, b2, b3 := fresh.Member(k)
		if [4]int{a0, a1, a2, a3} != [4]int{b0, b1, b2, b3} {
			t.Fatalf("%s %v: member %d at %v, a scan finds %v", doc, ops, k, [4]int{a0, a1, a2, a3}, [4]int{b0, b1, b2, b3})
		}
		key := gotIx[a0+1 : a1-1]
		ga, ea := NewDocIndexed(gotIx, &out).Get(string(key))
		gb, eb := NewDoc(gotIx).Get(string(key))
		if !bytes.Equal(ga, gb) || fmt.Sprint(ea) != fmt.Sprint(eb) {
			t.Fatalf("%s %v: Get %s through the index %s, %v; fresh %s, %v", doc, ops, key, ga, ea, gb, eb)
		}
	}
}

// TestApplyIndexedKeepsTheIndex: edits below the top level leave an index
// of the result (checked by checkApplyIndexed), so the next mutator's Doc
// does not scan the document from the start.
func TestApplyIndexedKeepsTheIndex(t *testing.T) {
	doc := []byte(`{"metadata":{"labels":{"a":"b"}},"spec":{"tolerations":[{"key":"k"}]},"status":{}}`)
	ops := []Op{
		{Op: "add", Path: "/spec/tolerations/-", Value: []byte(`{"key":"l"}`)},
		{Op: "add", Path: "/spec/tolerations/-", Value: []byte(`{"key":"m"}`)},
		{Op: "add", Path: "/metadata/labels/c", Value: []byte(`"d"`)},
	}
	var ix, out Index
	if ScanIndexed(doc, 0, 0, &ix) != len(doc) || !ix.Bind(doc) {
		t.Fatal("not indexed")
	}
	got, err := ApplyIndexed(doc, &ix, ops, &out)
	if err != nil {
		t.Fatal(err)
	}
	checkApplyIndexed(t, doc, ops, got, nil)
	if n, ok := out.Len(got); !ok || n != 3 {
		t.Fatalf("result %s: index of %d members, bound %v; want 3, bound", got, n, ok)
	}
	// A top-level edit rebuilds the top level: its members are located as
	// they are written, and what was below it is located again when read.
	top := []Op{{Op: "add", Path: "/kind", Value: []byte(`"Pod"`)}}
	got, err = ApplyIndexed(doc, &ix, top, &out)
	if err != nil || string(got) != `{"metadata":{"labels":{"a":"b"}},"spec":{"tolerations":[{"key":"k"}]},"status":{},"kind":"Pod"}` {
		t.Fatalf("%s, %v", got, err)
	}
	if n, ok := out.Len(got); !ok || n != 4 {
		t.Fatalf("result %s: index of %d members, bound %v; want 4, bound", got, n, ok)
	}
	checkApplyIndexed(t, doc, top, got, nil)
}

// TestApplyIndexedCarriesWhatDocsLocated: the containers the first
// mutator's Doc located are located in the result too, moved by the edit,
// so the second mutator's Doc and the next Apply scan none of them.
func TestApplyIndexedCarriesWhatDocsLocated(t *testing.T) {
	doc := []byte(`{"metadata":{"labels":{"a":"b"}},"spec":{"containers":[{"name":"c"}],"tolerations":[{"key":"k"}],"z":{}},"status":{}}`)
	var ix Index
	if ScanIndexed(doc, 0, 0, &ix) != len(doc) || !ix.Bind(doc) {
		t.Fatal("not indexed")
	}
	d := NewDocIndexed(doc, &ix)
	var labels map[string]string
	if _, err := d.Decode(&labels, "metadata", "labels"); err != nil {
		t.Fatal(err)
	}
	for _, p := range [][]string{{"spec", "tolerations", "0"}, {"spec", "z", "q"}, {"spec", "containers", "0", "name"}} {
		if _, err := d.Get(p...); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.AppendJSON([]string{"spec", "tolerations"}, []byte(`{"key":"l"}`)); err != nil {
		t.Fatal(err)
	}
	var out Index
	got, err := ApplyIndexed(doc, &ix, d.Ops(), &out)
	if err != nil {
		t.Fatal(err)
	}
	checkLocated(t, "carried", got, &out)
	var starts []string
	out.located.each(func(c *container) { starts = append(starts, string(got[c.start:c.end])) })
	slices.Sort(starts)
	want := []string{`[{"key":"k"},{"key":"l"}]`, `[{"name":"c"}]`, `{"a":"b"}`, `{"containers":[{"name":"c"}],"tolerations":[{"key":"k"},{"key":"l"}],"z":{}}`,
		`{"labels":{"a":"b"}}`, `{"name":"c"}`, `{}`}
	if !slices.Equal(starts, want) {
		t.Fatalf("kept %q\nwant %q", starts, want)
	}
}

// TestApplySplicesNumbersExact checks the splicing path itself (not the
// library fallback) keeps integers above 2^53 and the spelling of every
// untouched byte.
func TestApplySplicesNumbersExact(t *testing.T) {
	doc := []byte(`{"spec":{"activeDeadlineSeconds":9007199254740993,"f":1.50e+3,"h":"<&>"},"metadata":{}}`)
	ops := []Op{{Op: "add", Path: "/spec/suspend", Value: []byte(`true`)}, {Op: "add", Path: "/metadata/labels", Value: []byte(`{"q":"<x>"}`)}}
	out, err := applySplice(nil, doc, nil, ops, &Index{})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"spec":{"activeDeadlineSeconds":9007199254740993,"f":1.50e+3,"h":"<&>","suspend":true},"metadata":{"labels":{"q":"<x>"}}}`
	if string(out) != want {
		t.Fatalf("got  %s\nwant %s", out, want)
	}
}

// FuzzApply checks Apply against the library on arbitrary documents and
// one- or two-operation patches.
func FuzzApply(f *testing.F) {
	for _, d := range applyDocs {
		f.Add([]byte(d), "add", "/a", []byte(`1`), "remove", "/b/c/0")
	}
	f.Fuzz(func(t *testing.T, doc []byte, op1, path1 string, value []byte, op2, path2 string) {
		if len(doc) > 4096 || len(value) > 256 {
			return
		}
		ops := []Op{{Op: op1, Path: path1, Value: value}, {Op: op2, Path: path2}}
		if !Valid(value) {
			ops[0].Value = nil
		}
		if op2 != "remove" {
			ops[1].Value = json.RawMessage(`"v"`)
		}
		checkApply(t, doc, ops)
	})
}

func TestPointer(t *testing.T) {
	for _, tc := range []struct {
		segs []string
		ptr  string
	}{
		{nil, ""},
		{[]string{""}, "/"},
		{[]string{"a/b", "~", "c~/1"}, "/a~1b/~0/c~0~11"},
		{[]string{"metadata", "labels", "acme.com/lifespan-requested"}, "/metadata/labels/acme.com~1lifespan-requested"},
	} {
		if got := Pointer(tc.segs...); got != tc.ptr {
			t.Errorf("Pointer(%q) = %q, want %q", tc.segs, got, tc.ptr)
		}
		back, err := ParsePointer(tc.ptr)
		if err != nil || !reflect.DeepEqual(back, tc.segs) && !(len(back) == 0 && len(tc.segs) == 0) {
			t.Errorf("ParsePointer(%q) = %q, %v", tc.ptr, back, err)
		}
	}
	for _, bad := range []string{"a", "/~", "/~2"} {
		if _, err := ParsePointer(bad); err == nil {
			t.Errorf("ParsePointer(%q) accepted", bad)
		}
	}
}

func TestAppendString(t *testing.T) {
	for _, s := range []string{"", "plain", "<&>", "q\"b\\", "\x00\x1f\n\t\r", "é🚀", "\u2028\u2029", "bad\xffutf8"} {
		got := AppendString(nil, s)
		var enc bytes.Buffer
		e := json.NewEncoder(&enc)
		e.SetEscapeHTML(false)
		if err := e.Encode(s); err != nil {
			t.Fatal(err)
		}
		if want := strings.TrimSuffix(enc.String(), "\n"); string(got) != want {
			t.Errorf("AppendString(%q) = %s, encoding/json gives %s", s, got, want)
		}
	}
}

func TestAppendPatch(t *testing.T) {
	b, err := AppendPatch(nil, []Op{{Op: "add", Path: "/a~1b", Value: []byte(`{"h":"<&>","n":` + big + `}`)}, {Op: "remove", Path: "/x"}})
	if err != nil {
		t.Fatal(err)
	}
	if want := `[{"op":"add","path":"/a~1b","value":{"h":"<&>","n":` + big + `}},{"op":"remove","path":"/x"}]`; string(b) != want {
		t.Fatalf("got %s\nwant %s", b, want)
	}
	if _, err := AppendPatch(nil, []Op{{Op: "add", Path: "/a", Value: []byte(`{`)}}); err == nil {
		t.Fatal("invalid value accepted")
	}
	if b, _ := AppendPatch(nil, nil); string(b) != "[]" {
		t.Fatalf("empty patch %s", b)
	}
	if b, _ := AppendPatch(nil); string(b) != "[]" {
		t.Fatalf("no runs: %s", b)
	}
	// Runs are one patch, in order, as if concatenated; empty runs add
	// nothing (no stray comma); a bad value in a later run still fails.
	a := []Op{{Op: "add", Path: "/a", Value: []byte(`1`)}}
	c := []Op{{Op: "remove", Path: "/c"}, {Op: "move", From: "/d", Path: "/e"}}
	b, err = AppendPatch([]byte("x"), nil, a, nil, c, []Op{})
	if want := `x[{"op":"add","path":"/a","value":1},{"op":"remove","path":"/c"},{"op":"move","path":"/e","from":"/d"}]`; err != nil || string(b) != want {
		t.Fatalf("runs: %s %v\nwant %s", b, err, want)
	}
	if _, err := AppendPatch(nil, a, []Op{{Op: "add", Path: "/b", Value: []byte(`[`)}}); err == nil {
		t.Fatal("invalid value in the second run accepted")
	}
}

func TestDocGet(t *testing.T) {
	d := NewDoc([]byte(`{"metadata":{"labels":{"a":"1","a":"2"},"Name":"x"},"spec":{"t":[{"k":` + big + `}],"n":null},"spe\u0063x":1,"s":"str"}`))
	for _, tc := range []struct {
		path []string
		want string
		err  bool
	}{
		{[]string{"metadata", "labels", "a"}, `"2"`, false},
		{[]string{"metadata", "name"}, ``, false},
		{[]string{"metadata", "Name"}, `"x"`, false},
		{[]string{"spec", "t", "0", "k"}, big, false},
		{[]string{"spec", "t", "1"}, ``, false},
		{[]string{"spec", "t", "x"}, ``, true},
		{[]string{"spec", "n", "x"}, ``, false},
		{[]string{"specx"}, `1`, false},
		{[]string{"s", "x"}, ``, true},
		{[]string{"missing", "x"}, ``, false},
	} {
		got, err := d.Get(tc.path...)
		if (err != nil) != tc.err || string(got) != tc.want {
			t.Errorf("Get(%q) = %s, %v; want %s, error %v", tc.path, got, err, tc.want, tc.err)
		}
	}
	var n struct {
		K json.Number `json:"k"`
	}
	if ok, err := d.Decode(&n, "spec", "t", "0"); !ok || err != nil || n.K.String() != big {
		t.Fatalf("Decode: %v %v %+v", ok, err, n)
	}
	var name struct {
		Name string `json:"name"`
	}
	if ok, err := d.Decode(&name, "metadata"); !ok || err != nil || name.Name != "" {
		t.Fatalf("Decode is not case-sensitive: %v %v %+v", ok, err, name)
	}
	if _, err := NewDoc([]byte(`{"a":1`)).Get("a"); !errors.Is(err, ErrSyntax) {
		t.Fatalf("invalid document: %v", err)
	}
}

// TestDocEdits checks the operations Doc builds against what they are meant
// to do, applied by the library.
func TestDocEdits(t *testing.T) {
	for _, tc := range []struct {
		name, doc string
		edit      func(d *Doc) error
		want      string
	}{
		{"set creates parents once", `{"spec":{}}`, func(d *Doc) error {
			return errors.Join(d.Set("a", "metadata", "labels", "x"), d.Set("b", "metadata", "labels", "y~/"), d.Set(true, "spec", "suspend"))
		}, `{"metadata":{"labels":{"x":"a","y~/":"b"}},"spec":{"suspend":true}}`},
		{"null parent", `{"metadata":{"labels":null}}`, func(d *Doc) error { return d.Set("v", "metadata", "labels", "k") },
			`{"metadata":{"labels":{"k":"v"}}}`},
		{"append to missing, then existing", `{"spec":{"t":[1]}}`, func(d *Doc) error {
			return errors.Join(d.Append([]string{"spec", "u"}, 1, 2), d.Append([]string{"spec", "u"}, 3), d.Append([]string{"spec", "t"}, big))
		}, `{"spec":{"t":[1,"` + big + `"],"u":[1,2,3]}}`},
		{"remove present and absent", `{"spec":{"priority":` + big + `}}`, func(d *Doc) error {
			return errors.Join(d.Remove("spec", "priority"), d.Remove("spec", "priority"), d.Remove("spec", "nope"), d.Remove("x", "y"))
		}, `{"spec":{}}`},
		{"set array element member", `{"spec":{"t":[{"key":"a"},{"key":"b","operator":""}]}}`, func(d *Doc) error {
			return d.Set("Equal", "spec", "t", "1", "operator")
		}, `{"spec":{"t":[{"key":"a"},{"key":"b","operator":"Equal"}]}}`},
		{"set then remove inside", `{}`, func(d *Doc) error {
			return errors.Join(d.Set(map[string]string{"a": "1", "b": "2"}, "m"), d.Remove("m", "a"), d.Set("3", "m", "c"))
		}, `{"m":{"b":"2","c":"3"}}`},
		{"html and numbers", `{"n":` + big + `}`, func(d *Doc) error {
			return d.Set(json.RawMessage(`{"h":"<&>","n":`+big+`}`), "v")
		}, `{"n":` + big + `,"v":{"h":"<&>","n":` + big + `}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := NewDoc([]byte(tc.doc))
			if err := tc.edit(d); err != nil {
				t.Fatal(err)
			}
			got, err := library(t, []byte(tc.doc), d.Ops())
			if err != nil {
				t.Fatalf("ops %v: %v", d.Ops(), err)
			}
			if !reflect.DeepEqual(decodeExact(t, got), decodeExact(t, []byte(tc.want))) {
				t.Fatalf("ops %v give %s, want %s", d.Ops(), got, tc.want)
			}
			spliced, err := Apply([]byte(tc.doc), d.Ops())
			if err != nil || !reflect.DeepEqual(decodeExact(t, spliced), decodeExact(t, got)) {
				t.Fatalf("Apply gives %s, %v; library %s", spliced, err, got)
			}
		})
	}
}

func TestDocErrors(t *testing.T) {
	for _, tc := range []struct {
		doc  string
		edit func(d *Doc) error
		msg  string
	}{
		{`null`, func(d *Doc) error { return d.Set(1, "a") }, "the document is null, not an object"},
		{`{"spec":"x"}`, func(d *Doc) error { return d.Set(1, "spec", "a") }, "/spec is a string, not an object"},
		{`{"spec":{"t":{}}}`, func(d *Doc) error { return d.Append([]string{"spec", "t"}, 1) }, "it is an object, not an array"},
		{`{"t":[]}`, func(d *Doc) error { return d.Set(1, "t", "0") }, "has no element 0"},
		{`{"a":`, func(d *Doc) error { return d.Set(1, "a") }, "invalid JSON"},
		{`{}`, func(d *Doc) error { return d.Set(1) }, "path is empty"},
	} {
		err := tc.edit(NewDoc([]byte(tc.doc)))
		if err == nil || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: error %v, want containing %q", tc.doc, err, tc.msg)
		}
	}
}

// TestAppendFragments: appending checked fragments gives AppendJSON's
// operations, with or without a list to append to; invalid JSON is refused
// when the fragment is made, and a zero Fragment when it is appended.
func TestAppendFragments(t *testing.T) {
	if _, err := NewFragment([]byte(`{"a":`)); !errors.Is(err, ErrSyntax) {
		t.Fatalf("NewFragment of invalid JSON: %v", err)
	}
	src := []byte(`{"k":"v"}`)
	f, err := NewFragment(src)
	if err != nil {
		t.Fatal(err)
	}
	src[2] = 'x' // the fragment is a copy
	g, _ := NewFragment([]byte(`1`))
	for _, doc := range []string{`{"spec":{"list":[0]}}`, `{"spec":{}}`, `{"spec":{"list":null}}`} {
		a, b := NewDoc([]byte(doc)), NewDoc([]byte(doc))
		if err := a.AppendFragments([]string{"spec", "list"}, f, g); err != nil {
			t.Fatal(err)
		}
		if err := b.AppendJSON([]string{"spec", "list"}, json.RawMessage(`{"k":"v"}`), json.RawMessage(`1`)); err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(a.Ops()) != fmt.Sprint(b.Ops()) {
			t.Fatalf("%s: AppendFragments %v, AppendJSON %v", doc, a.Ops(), b.Ops())
		}
		if _, err := Apply([]byte(doc), a.Ops()); err != nil {
			t.Fatalf("%s: %v", doc, err)
		}
	}
	if err := NewDoc([]byte(`{}`)).AppendFragments([]string{"list"}, Fragment{}); !errors.Is(err, ErrSyntax) {
		t.Fatalf("zero Fragment: %v", err)
	}
}

// TestDocEachElement: a Doc's EachElement sees what the package's
// EachElement sees in the array's bytes, from a fresh Doc, from one over
// an Index, and from the result of an edit (whose array ApplyIndexed
// carried over located); missing and null are empty, other values refused.
func TestDocEachElement(t *testing.T) {
	collect := func(each func(func([]byte) bool) (bool, error)) (string, bool, error) {
		var got []string
		ok, err := each(func(v []byte) bool { got = append(got, string(v)); return len(got) < 3 })
		return strings.Join(got, "|"), ok, err
	}
	docs := []string{`{"s":{"l":[1,{"a":[2]},"x"]}}`, `{"s":{"l":[1,2,3,4]}}`, `{"s":{"l":[]}}`, `{"s":{"l":null}}`,
		`{"s":{}}`, `{"s":{"l":{"a":1}}}`, `{"s":{"l":"x"}}`, `{"s":[1]}`}
	for _, doc := range docs {
		raw := []byte(doc)
		var ix Index
		if ScanIndexed(raw, 0, 0, &ix) != len(raw) || !ix.Bind(raw) {
			t.Fatal(doc)
		}
		want, wok, werr := "", true, error(nil)
		if l, err := NewDoc(raw).Get("s", "l"); err != nil {
			wok, werr = false, err
		} else if l != nil && l[0] != 'n' {
			want, wok, _ = collect(func(f func([]byte) bool) (bool, error) { return EachElement(l, f), nil })
		}
		for name, d := range map[string]*Doc{"fresh": NewDoc(raw), "indexed": NewDocIndexed(raw, &ix)} {
			got, ok, err := collect(func(f func([]byte) bool) (bool, error) { return d.EachElement([]string{"s", "l"}, f) })
			if got != want || ok != wok || fmt.Sprint(err) != fmt.Sprint(werr) {
				t.Errorf("%s %s: %q %v %v, want %q %v %v", doc, name, got, ok, err, want, wok, werr)
			}
		}
	}
	// After an edit the array is read from what the edit located.
	raw := []byte(`{"s":{"l":[1]}}`)
	var ix, out Index
	ScanIndexed(raw, 0, 0, &ix)
	ix.Bind(raw)
	d := NewDocIndexed(raw, &ix)
	if err := d.AppendJSON([]string{"s", "l"}, json.RawMessage(`{"b":2}`)); err != nil {
		t.Fatal(err)
	}
	res, err := ApplyIndexed(raw, &ix, d.Ops(), &out)
	if err != nil {
		t.Fatal(err)
	}
	got, ok, err := collect(func(f func([]byte) bool) (bool, error) {
		return NewDocIndexed(res, &out).EachElement([]string{"s", "l"}, f)
	})
	if got != `1|{"b":2}` || !ok || err != nil {
		t.Fatalf("after the edit: %q %v %v", got, ok, err)
	}
}
