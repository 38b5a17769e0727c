package jsonedit

import "github.com/kadmit/kadmit/internal/jsonedit/jsonscan"

// An admission request's body is scanned once by the envelope decoder
// (package admission), which must walk request.object to find where it
// ends. Index lets that walk record where the object's top-level members
// are, so that the first Doc over the object (the first mutator, and every
// validator: they see the object as sent) starts with its root container
// located instead of scanning the object a second time.

// IndexMembers is the most top-level members an Index records: a pod, a
// node or a ConfigMap has five or six. An object with more is scanned as
// usual by the Doc, so an Index is a fixed size whatever the input.
const IndexMembers = 16

// Index is the located top-level members of one JSON object: what a Doc's
// first scan of the object would find. ScanIndexed fills it while checking
// the object's syntax; Bind ties it to the bytes a Doc will read; from then
// on its top level is read-only, and every Doc built over those bytes with
// NewDocIndexed shares it (a Doc never changes a container it located, so
// one policy's edits cannot change what another reads). Its zero value is
// an empty Index, which NewDocIndexed ignores.
//
// A bound Index also keeps the containers below the top level that the
// Docs over its bytes located (up to maxLocated of them): the next Doc, say
// the next validator, finds them located, and ApplyIndexed carries them
// over to the result it makes, so the next mutator in a chain does not
// scan again the parts of the object the previous one read. Because Docs
// record into it, an Index, like a Doc, is not safe for concurrent use.
type Index struct {
	c     container
	buf   [IndexMembers]item
	from  int  // where the indexed object started in the scanned buffer
	ok    bool // ScanIndexed recorded every member
	bound bool // Bind succeeded: c.data is the bytes Docs will read
	// located holds containers of c.data other than the top level, each
	// with every member or element (as parseContainer locates them).
	located located
}

// ScanIndexed is ScanValue for the object starting at d[i] (d[i] == '{';
// depth as for ScanValue): it returns the index just past the object, or -1
// when it is not valid JSON, and records the object's members in ix when it
// has at most IndexMembers of them (ix is reset first, and left empty
// otherwise). Offsets are kept relative to d[i], so the Index applies to a
// copy of d[i:end].
func ScanIndexed(d []byte, i, depth int, ix *Index) int {
	*ix = Index{from: i}
	if i >= len(d) || d[i] != '{' {
		return jsonscan.ScanValue(d, i, depth)
	}
	items, complete, err := ix.c.parse(d, i, depth, IndexMembers, ix.buf[:0], skipper{x: &ix.located.ext, record: true, base: i})
	ix.c.items = items
	if err != nil {
		*ix = Index{}
		return -1
	}
	end := ix.c.end
	if !complete {
		*ix = Index{}
		return end
	}
	for k := range ix.c.items {
		it := &ix.c.items[k]
		it.ks, it.ke, it.vs, it.ve = it.ks-i, it.ke-i, it.vs-i, it.ve-i
	}
	ix.c.start, ix.c.end, ix.c.data = 0, end-i, nil
	ix.ok = true
	return end
}

// From returns where, in the buffer ScanIndexed scanned, the indexed object
// started, and whether ix holds an index at all.
func (ix *Index) From() (int, bool) { return ix.from, ix.ok }

// Bind ties ix to raw, which must be a copy of exactly the bytes
// ScanIndexed indexed (checked by length): raw is what NewDocIndexed will
// be given. It reports whether ix is usable; after Bind, ix must not change.
func (ix *Index) Bind(raw []byte) bool {
	if !ix.ok || len(raw) != ix.c.end {
		*ix = Index{}
		return false
	}
	ix.c.items = ix.buf[:len(ix.c.items)] // its own array, even if ix was copied
	ix.c.data, ix.bound = raw, true
	return true
}

// NewDocIndexed is NewDoc(raw), starting from ix when ix was bound to raw
// itself (the same bytes at the same address): the Doc then does not scan
// raw's top level again. With any other raw, or a nil or unbound ix, it is
// exactly NewDoc(raw). Errors, reads and edits are NewDoc's: an Index is
// only ever built over valid JSON, which is all a Doc's first scan checks.
func NewDocIndexed(raw []byte, ix *Index) *Doc {
	d := &Doc{raw: raw}
	if ix.boundTo(raw) {
		d.parsed, d.root, d.rootE = true, 0, len(raw)
		d.memo.put(&ix.c) // before sharing: the top level stays the Doc's
		d.memo.shared = &ix.located
	}
	return d
}

// boundTo reports whether ix was bound to raw itself (same address and
// length); ix may be nil.
func (ix *Index) boundTo(raw []byte) bool {
	return ix != nil && ix.bound && len(raw) > 0 && len(raw) == len(ix.c.data) && &raw[0] == &ix.c.data[0]
}

// Len returns how many top-level members ix located, and false when ix
// (which may be nil) is not bound to raw itself: then raw must be scanned.
func (ix *Index) Len(raw []byte) (int, bool) {
	if !ix.boundTo(raw) {
		return 0, false
	}
	return len(ix.c.items), true
}

// Member returns where member k (0 <= k < Len) of the bound object is, in
// document order, as offsets into the bound bytes: its key's JSON string
// (quotes included, escapes kept) is raw[ks:ke], its value raw[vs:ve].
func (ix *Index) Member(k int) (ks, ke, vs, ve int) {
	it := &ix.c.items[k]
	return it.ks, it.ke, it.vs, it.ve
}

// carry fills ix (reset first) with what is located in res, the document
// made from another, doc, by replacing the container rc.data[edited.start:e]
// with edited (edited.data is res; its members located as they were
// written), and binds it to res: rc is doc's top level (it may be the
// edited container itself) and loc, when not nil, the containers
// below it that Docs over doc located. Each is carried over with its
// offsets moved: unchanged before the edit, grown by the edit when it
// holds it, shifted after it; a container inside the edited one is
// dropped (a later Doc locates it again if it needs it). ix stays empty
// when res's top level cannot be an Index: not an object, more than
// IndexMembers members, or space around it.
func (ix *Index) carry(rc *container, loc *located, edited *container, e int, res []byte) {
	*ix = Index{}
	s, delta := edited.start, len(res)-len(rc.data)
	// A Doc over res starts from an Index as the object spanning all of
	// res, so a document with space around its object gets none.
	top := rc
	if s == rc.start {
		top = edited
	}
	if !top.object || len(top.items) > IndexMembers || rc.start != 0 || rc.end+delta != len(res) {
		return
	}
	ix.c = container{object: true, start: 0, end: len(res), data: res, items: ix.buf[:0]}
	if top == edited {
		ix.c.items = append(ix.c.items, edited.items...)
	} else {
		ix.c.items = moved(ix.c.items, rc, s, e, delta)
	}
	ix.ok, ix.bound = true, true
	if loc != nil {
		ix.located.ext = loc.ext.moved(s, e, delta)
	}
	// The containers below the top level, in one array, and the members of
	// those around or after the edit, moved, in another: an Apply costs two
	// allocations however many it keeps. Members never change once
	// located, so a container before the edit shares its members' array.
	n, ni := 0, 0
	keep := func(x *container) bool { return x.start < s || x.start >= e }
	loc.each(func(x *container) {
		if keep(x) {
			n++
			if x.end > s { // around or after the edit: members moved
				ni += len(x.items)
			}
		}
	})
	cs := make([]container, 0, n+1)
	its := make([]item, 0, ni)
	add := func(x container, members []item) {
		k := len(its)
		its = append(its, members...)
		x.items = its[k:len(its):len(its)]
		cs = append(cs, x)
		ix.located.put(&cs[len(cs)-1])
	}
	loc.each(func(x *container) {
		if !keep(x) { // the edited container, or inside it
			return
		}
		nx := container{object: x.object, start: x.start, end: x.end, data: res}
		switch {
		case x.end <= s: // before the edit: the same members (never changed)
			nx.items = x.items
			cs = append(cs, nx)
			ix.located.put(&cs[len(cs)-1])
		case x.start >= e: // after it
			nx.start, nx.end = x.start+delta, x.end+delta
			k := len(its)
			add(nx, x.items)
			shiftItems(its[k:], x.object, delta)
		default: // around it
			nx.end += delta
			k := len(its)
			its = moved(its, x, s, e, delta)
			nx.items = its[k:len(its):len(its)]
			cs = append(cs, nx)
			ix.located.put(&cs[len(cs)-1])
		}
	})
	if top != edited { // its members were written for it: no copy
		cs = append(cs, *edited)
		ix.located.put(&cs[len(cs)-1])
	}
}

// moved appends to dst the members of x, a container holding the bytes
// [s, e) that an edit replaced, growing them by delta, as they are after
// the edit: the member holding them grows, the ones after shift.
func moved(dst []item, x *container, s, e, delta int) []item {
	k := len(dst)
	dst = append(dst, x.items...)
	for i := range dst[k:] {
		it := &dst[k+i]
		switch {
		case it.vs <= s && e <= it.ve:
			it.ve += delta
		case it.vs >= e:
			shiftItems(dst[k+i:k+i+1], x.object, delta)
		}
	}
	return dst
}

// shiftItems moves members (elements) by delta bytes; an element has no
// key, and its key offsets stay 0.
func shiftItems(items []item, object bool, delta int) {
	for i := range items {
		it := &items[i]
		if object {
			it.ks, it.ke = it.ks+delta, it.ke+delta
		}
		it.vs, it.ve = it.vs+delta, it.ve+delta
	}
}
