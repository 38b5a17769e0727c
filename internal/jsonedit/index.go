package jsonedit

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
// on it is read-only, and every Doc built over those bytes with
// NewDocIndexed shares it (a Doc never changes a container it located, so
// one policy's edits cannot change what another reads). Its zero value is
// an empty Index, which NewDocIndexed ignores.
type Index struct {
	c     container
	buf   [IndexMembers]item
	from  int  // where the indexed object started in the scanned buffer
	ok    bool // ScanIndexed recorded every member
	bound bool // Bind succeeded: c.data is the bytes Docs will read
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
		return ScanValue(d, i, depth)
	}
	ix.c.items = ix.buf[:0]
	complete, err := ix.c.parse(d, i, depth, IndexMembers)
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
		d.memo.put(&ix.c)
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

// shift fills ix with the top-level members of res, the document rc (the
// located top level of the document res was made from, an object) became
// when the bytes [s, e) inside one of its members' values were replaced,
// growing the document by delta bytes, and binds it to res. It leaves ix
// empty when rc is not an object, has more than IndexMembers members, or
// no member's value holds [s, e), or space surrounds it.
func (ix *Index) shift(rc *container, s, e, delta int, res []byte) {
	*ix = Index{}
	// A Doc over res starts from an Index as the object spanning all of
	// res, so a document with space around its object gets none.
	if !rc.object || len(rc.items) > IndexMembers || rc.start != 0 || rc.end+delta != len(res) {
		return
	}
	at := -1
	for k := range rc.items {
		if it := &rc.items[k]; it.vs <= s && e <= it.ve {
			at = k
			break
		}
	}
	if at < 0 {
		return
	}
	ix.c.object, ix.c.start, ix.c.end = true, rc.start, rc.end+delta
	ix.c.items = append(ix.buf[:0], rc.items...)
	for k := range ix.c.items {
		it := &ix.c.items[k]
		switch {
		case k == at:
			it.ve += delta
		case k > at:
			it.ks, it.ke, it.vs, it.ve = it.ks+delta, it.ke+delta, it.vs+delta, it.ve+delta
		}
	}
	ix.ok = true
	ix.c.data, ix.bound = res, true
}
