package jsonedit

import (
	"bytes"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kadmit/kadmit/internal/jsonedit/jsonscan"
	k8sjson "sigs.k8s.io/json"
)

func k8sjsonUnmarshal(b []byte, v any) error { return k8sjson.UnmarshalCaseSensitivePreserveInts(b, v) }

// checkLocated fails unless ix, bound to res, locates exactly what a fresh
// scan of res locates: its top level, and each container it keeps below
// it (same start, end, members and decoded keys), each kept once.
func checkLocated(t testing.TB, what string, res []byte, ix *Index) {
	t.Helper()
	if _, ok := ix.Len(res); !ok {
		t.Fatalf("%s: index not bound to %s", what, res)
	}
	same := func(name string, got *container) {
		t.Helper()
		if len(got.data) != len(res) || &got.data[0] != &res[0] {
			t.Fatalf("%s: %s at %d is of other bytes", what, name, got.start)
		}
		want, err := parseContainer(res, got.start, 0, nil)
		if err != nil {
			t.Fatalf("%s: %s at %d: no container there in %s: %v", what, name, got.start, res, err)
		}
		if got.object != want.object || got.end != want.end || !slices.Equal(got.items, want.items) {
			t.Fatalf("%s: %s at %d:\nkept  %v %d %v\nfresh %v %d %v\nin %s", what, name, got.start,
				got.object, got.end, got.items, want.object, want.end, want.items, res)
		}
	}
	same("top level", &ix.c)
	checkExtents(t, what, res, &ix.located.ext)
	seen := map[int]bool{}
	if ix.located.len() > maxLocated {
		t.Fatalf("%s: %d containers kept (at most %d)", what, ix.located.len(), maxLocated)
	}
	ix.located.each(func(c *container) {
		if c.start == 0 || seen[c.start] {
			t.Fatalf("%s: container at %d kept twice (or as the top level)", what, c.start)
		}
		seen[c.start] = true
		same("container", c)
	})
}

// checkExtents fails unless each container x records is one in res, at
// increasing starts: an object or array at start that a fresh scan ends at
// end.
func checkExtents(t testing.TB, what string, res []byte, x *extents) {
	t.Helper()
	if x.n > maxExtents {
		t.Fatalf("%s: %d extents (at most %d)", what, x.n, maxExtents)
	}
	for k := 0; k < x.n; k++ {
		s, e := int(x.start[k]), int(x.end[k])
		if k > 0 && s <= int(x.start[k-1]) {
			t.Fatalf("%s: extent %d starts at %d, not after %d", what, k, s, x.start[k-1])
		}
		if s <= 0 || s >= len(res) || (res[s] != '{' && res[s] != '[') {
			t.Fatalf("%s: extent %d at %d is no container of %s", what, k, s, res)
		}
		if got := jsonscan.ScanValue(res, s, 0); got != e {
			t.Fatalf("%s: extent %d at %d ends at %d, a fresh scan at %d, in %s", what, k, s, e, got, res)
		}
	}
}

// containerPaths returns the paths of every object and array in the valid
// JSON doc, the root first.
func containerPaths(doc []byte) [][]string {
	var out [][]string
	var visit func(s int, path []string)
	visit = func(s int, path []string) {
		if doc[s] != '{' && doc[s] != '[' {
			return
		}
		out = append(out, slices.Clone(path))
		c, err := parseContainer(doc, s, len(path), nil)
		if err != nil {
			panic(err)
		}
		for i, it := range c.items {
			seg := strconv.Itoa(i)
			if c.object {
				seg = c.keyOf(i)
			}
			visit(it.vs, append(slices.Clip(path), seg))
		}
	}
	visit(jsonscan.SkipSpace(doc, 0), nil)
	return out
}

// randValue is a random JSON value of at most depth levels: keys with
// escapes, repeats and invalid UTF-8, space inside containers now and then.
func randValue(r *rand.Rand, depth int) string {
	sp := func() string {
		if r.IntN(8) == 0 {
			return " "
		}
		return ""
	}
	switch k := r.IntN(10); {
	case depth == 0 || k < 3:
		return []string{`1`, `"s"`, `null`, `true`, `9007199254740993`, `"<\u0026>"`, `-1.5e3`, `""`}[r.IntN(8)]
	case k < 7:
		n := r.IntN(5)
		parts := make([]string, n)
		for i := range parts {
			parts[i] = sp() + string(AppendString(nil, randKey(r))) + sp() + ":" + sp() + randValue(r, depth-1) + sp()
		}
		if n > 0 && r.IntN(6) == 0 { // a repeated member
			parts = append(parts, parts[0])
		}
		if r.IntN(10) == 0 { // an escaped key
			parts = append(parts, `"e\u0073c":`+randValue(r, depth-1))
		}
		return "{" + strings.Join(parts, ",") + "}"
	default:
		parts := make([]string, r.IntN(5))
		for i := range parts {
			parts[i] = sp() + randValue(r, depth-1) + sp()
		}
		return "[" + strings.Join(parts, ",") + "]"
	}
}

func randKey(r *rand.Rand) string {
	return []string{"a", "b", "spec", "metadata", "a/b", "t~i", "", "esc", "k\xff", "x"}[r.IntN(10)]
}

// randOps is a patch of one to four operations on members of the
// containers of doc (a random one each, sometimes the same as the
// previous op's, so that runs form), or on a member of a new object.
func randOps(r *rand.Rand, doc []byte) []Op {
	paths := containerPaths(doc)
	ops := make([]Op, 1+r.IntN(4))
	var parent []string
	for i := range ops {
		if i == 0 || r.IntN(2) == 0 {
			parent = paths[r.IntN(len(paths))]
		}
		seg := randKey(r)
		if raw, _ := NewDoc(doc).Get(parent...); len(raw) > 0 && raw[0] == '[' {
			seg = []string{"-", "0", "1", "2"}[r.IntN(4)]
		}
		op := Op{Op: []string{"add", "add", "replace", "remove"}[r.IntN(4)], Path: Pointer(append(slices.Clip(parent), seg)...)}
		if op.Op != "remove" {
			op.Value = []byte(randValue(r, 2))
			if r.IntN(5) == 0 {
				op.Value = []byte(" " + string(op.Value) + "\n")
			}
		}
		ops[i] = op
	}
	return ops
}

// readSome reads, through a Doc over doc started from ix, a random half of
// doc's containers and their members, so that ix keeps them.
func readSome(r *rand.Rand, doc []byte, ix *Index) {
	d := NewDocIndexed(doc, ix)
	for _, p := range containerPaths(doc) {
		if r.IntN(2) == 0 {
			_, _ = d.Get(append(slices.Clip(p), randKey(r))...)
			_, _ = d.Get(append(slices.Clip(p), "0")...)
		}
	}
}

// TestApplyIndexedCarriesLocated is the property test of carrying an Index
// across Apply: on random documents, after Docs located random containers
// and random patches were applied, round after round as in a mutating
// chain, the result is Apply's and its Index (top level and every kept
// container) equals a fresh scan of the result; a Doc started from it reads
// what a fresh Doc reads.
func TestApplyIndexedCarriesLocated(t *testing.T) {
	r := rand.New(rand.NewPCG(24, 5))
	carried, extents, reused := 0, 0, 0
	var spare []byte
	for n := 0; n < 3000; n++ {
		doc := []byte(randValue(r, 4))
		if doc[0] != '{' {
			doc = []byte(`{"o":` + string(doc) + `}`)
		}
		ix := new(Index)
		if ScanIndexed(doc, 0, 0, ix) != len(doc) || !ix.Bind(doc) {
			continue
		}
		for round := 0; round < 4; round++ {
			readSome(r, doc, ix)
			checkLocated(t, fmt.Sprintf("doc %d round %d before", n, round), doc, ix)
			ops := randOps(r, doc)
			want, werr := Apply(doc, ops)
			out := new(Index)
			// As a mutating chain does, the result goes into a buffer
			// the previous rounds used (its stale bytes scribbled over),
			// so a carried index that still read it would fail below.
			for i := range spare[:cap(spare)] {
				spare[:cap(spare)][i] = 'x'
			}
			got, err := ApplyIndexedTo(spare, doc, ix, ops, out)
			if !bytes.Equal(got, want) || (err == nil) != (werr == nil) {
				t.Fatalf("%s %v: ApplyIndexed %s, %v; Apply %s, %v", doc, ops, got, err, want, werr)
			}
			if err != nil {
				break
			}
			what := fmt.Sprintf("doc %d round %d: %s %v", n, round, doc, ops)
			if _, ok := out.Len(got); !ok {
				break
			}
			checkLocated(t, what, got, out)
			carried += out.located.len()
			extents += out.located.ext.n
			kept, fresh := NewDocIndexed(got, out), NewDoc(got)
			for _, p := range containerPaths(got) {
				for _, q := range [][]string{p, append(slices.Clip(p), "0"), append(slices.Clip(p), "a")} {
					ga, ea := kept.Get(q...)
					gb, eb := fresh.Get(q...)
					if !bytes.Equal(ga, gb) || fmt.Sprint(ea) != fmt.Sprint(eb) {
						t.Fatalf("%s: Get %q through the kept index %s, %v; fresh %s, %v", what, q, ga, ea, gb, eb)
					}
				}
			}
			if len(got) > 0 && cap(spare) > 0 && &got[:1][0] == &spare[:1][0] {
				reused++
			}
			if len(doc) > 0 && &got[:1][0] != &doc[:1][0] { // doc is free: the next round's buffer
				spare = doc[:0]
			}
			doc, ix = got, out
		}
	}
	if reused < 300 { // 416 with this seed: a result that outgrows the buffer, or takes two runs, gets a new one
		t.Fatalf("only %d results written into the reused buffer: the test does not exercise ApplyIndexedTo's dst", reused)
	}
	if carried < 1000 {
		t.Fatalf("only %d containers carried over: the test does not exercise carrying", carried)
	}
	if extents < 1000 {
		t.Fatalf("only %d extents carried over: the test does not exercise moving them", extents)
	}
}

// TestIndexLocatedBound: however many containers the Docs over an Index's
// bytes locate, it keeps at most maxLocated; the Docs keep the rest.
func TestIndexLocatedBound(t *testing.T) {
	m := make([]string, 100)
	for i := range m {
		m[i] = fmt.Sprintf(`{"v":{"w":%d}}`, i)
	}
	doc := []byte(`{"list":[` + strings.Join(m, ",") + `]}`)
	var ix Index
	if ScanIndexed(doc, 0, 0, &ix) != len(doc) || !ix.Bind(doc) {
		t.Fatal("not indexed")
	}
	d := NewDocIndexed(doc, &ix)
	for i := range m {
		if got, err := d.Get("list", strconv.Itoa(i), "v", "w"); err != nil || string(got) != strconv.Itoa(i) {
			t.Fatalf("element %d: %s, %v", i, got, err)
		}
	}
	if n := ix.located.len(); n != maxLocated {
		t.Fatalf("the index keeps %d containers, want %d", n, maxLocated)
	}
	checkLocated(t, "bound", doc, &ix)
	out := new(Index)
	got, err := ApplyIndexed(doc, &ix, []Op{{Op: "add", Path: "/list/0/v/x", Value: []byte(`1`)}}, out)
	if err != nil {
		t.Fatal(err)
	}
	checkLocated(t, "carried", got, out)
}

// TestDecodeStringMapMatchesDecoder: an object of strings decodes, through
// the fast path (one copy of the object, substrings of it), to what
// sigs.k8s.io/json decodes: escapes, invalid UTF-8, repeated keys (the
// last wins), and a non-string member (the decoder's error).
func TestDecodeStringMapMatchesDecoder(t *testing.T) {
	for _, obj := range []string{
		`{}`, `{"a":"b","c":""}`, `{"a\u0062":"x\n","k\/":"\u00e9"}`, "{\"k\xff\":\"v\xfe\",\"w\":\"\xc3\"}",
		`{"a":"1","a":"2"}`, `{"a":"1","b":2}`, `{"a":null}`, ` { "a" : "b" } `,
	} {
		doc := []byte(`{"m":` + obj + `}`)
		var got, want map[string]string
		_, gerr := NewDoc(doc).Decode(&got, "m")
		werr := k8sjsonUnmarshal([]byte(obj), &want)
		if (gerr == nil) != (werr == nil) || (gerr == nil && !maps.Equal(got, want)) {
			t.Fatalf("%s: Decode %q, %v; decoder %q, %v", obj, got, gerr, want, werr)
		}
	}
}
