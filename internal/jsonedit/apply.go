package jsonedit

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/kadmit/kadmit/internal/jsonedit/jsonscan"
	jsonpatch4 "gopkg.in/evanphx/json-patch.v4"
)

// Apply applies ops to doc, in order, and returns the resulting document;
// doc is not modified, and is returned as it is when ops is empty.
//
// Operations add, remove and replace below the root (every operation a Doc
// builds) are applied by splicing: each run of operations on members of the
// same object or array rewrites that one container and copies the rest of
// doc byte for byte, so numbers keep their spelling and nothing else is
// re-encoded. A patch with any other operation, a root path, an index this
// path does not handle (negative) or an operation that does not apply is
// handed whole to gopkg.in/evanphx/json-patch.v4, the library the API server
// applies webhook patches with, so Apply accepts and refuses exactly what
// the API server does; its error is returned. Its cost is about one scan of
// doc per run of operations on the same container.
func Apply(doc []byte, ops []Op) ([]byte, error) {
	return ApplyIndexed(doc, nil, ops, nil)
}

// ApplyIndexed is Apply for a mutating chain, where the result is read
// again by the next mutator. When ix is bound to doc itself (as
// NewDocIndexed takes it), splicing starts from ix instead of scanning
// doc's top level. When out is not nil it is reset, and, when the result
// was spliced and its top-level members can be located from doc's by
// shifting offsets (edits below the top level, at most IndexMembers
// members), filled with them and bound to the result: a Doc over the
// result (NewDocIndexed) then does not scan it from the start either. The
// result and errors are Apply's.
func ApplyIndexed(doc []byte, ix *Index, ops []Op, out *Index) ([]byte, error) {
	return ApplyIndexedTo(nil, doc, ix, ops, out)
}

// ApplyIndexedTo is ApplyIndexed writing the result, when it is spliced
// in one run of operations and fits in cap(dst), into dst's array instead
// of a new one, overwriting what dst held: a mutating chain that owns dst
// and reads nothing it held any more reuses one buffer instead of
// allocating an object per apply. The result is dst's array, doc itself
// (no operations) or a new array, never a part of doc; dst must not
// overlap doc.
func ApplyIndexedTo(dst, doc []byte, ix *Index, ops []Op, out *Index) ([]byte, error) {
	if out != nil {
		*out = Index{}
	}
	if len(ops) == 0 {
		return doc, nil
	}
	if res, err := applySplice(dst, doc, ix, ops, out); err == nil {
		return res, nil
	}
	if out != nil {
		*out = Index{}
	}
	return applyLibrary(doc, ops)
}

// applyLibrary applies ops with the API server's JSONPatch library. The
// library panics on some documents (an "add" to the document null); that is
// an error here.
func applyLibrary(doc []byte, ops []Op) (_ []byte, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("apply JSONPatch: the library failed: %v", r)
		}
	}()
	b, err := AppendPatch(nil, ops)
	if err != nil {
		return nil, err
	}
	p, err := jsonpatch4.DecodePatch(b)
	if err != nil {
		return nil, fmt.Errorf("decode JSONPatch: %w", err)
	}
	out, err := p.Apply(doc)
	if err != nil {
		return nil, fmt.Errorf("apply JSONPatch: %w", err)
	}
	return out, nil
}

// errSplice means applySplice cannot apply the patch; Apply then hands it
// to the library, which applies it or says why not.
var errSplice = errors.New("patch not applied by splicing")

// applySplice applies ops by splicing, each run of operations on one
// container at a time; ix, when bound to doc, locates doc's top level, and
// out, when not nil, receives the result's (see ApplyIndexed). The first
// run writes into dst when it fits (a later one reads the first's result,
// which may be dst).
func applySplice(dst, doc []byte, ix *Index, ops []Op, out *Index) ([]byte, error) {
	// Each operation's parent pointer, the same for a run of operations,
	// is parsed once per run; its last segment is unescaped by the run.
	for i := range ops {
		op := &ops[i]
		switch op.Op {
		case "add", "replace":
			if op.Value == nil || !op.validValue() {
				return nil, errSplice
			}
		case "remove":
		default:
			return nil, errSplice
		}
		if _, ok := lastSegment(op.Path); !ok {
			return nil, errSplice
		}
	}
	for i := 0; i < len(ops); {
		// Escaping is one-to-one, so operations with equal escaped parent
		// pointers have equal parents.
		pp := parentPointer(ops[i].Path)
		j := i + 1
		for j < len(ops) && parentPointer(ops[j].Path) == pp {
			j++
		}
		parent, err := ParsePointer(pp)
		if err != nil {
			return nil, errSplice
		}
		if out == nil { // nobody reads the result's index: locate nothing
			if doc, err = applyRun(dst, doc, ix, parent, ops[i:j], nil); err != nil {
				return nil, err
			}
			ix, i, dst = nil, j, nil
			continue
		}
		if j == len(ops) && ix != out {
			// The last run (often the only one) reads ix and fills out
			// directly: an Index is a few KiB, not worth a copy.
			if doc, err = applyRun(dst, doc, ix, parent, ops[i:j], out); err != nil {
				return nil, err
			}
		} else {
			// The next run reads ix while this one fills next, so they
			// are two Indexes; copying next into out keeps it usable
			// (Bind points items at the copy's own array).
			var next Index
			if doc, err = applyRun(dst, doc, ix, parent, ops[i:j], &next); err != nil {
				return nil, err
			}
			*out = next
		}
		dst = nil
		if out.bound && !out.Bind(doc) {
			*out = Index{}
		}
		ix = out
		i = j
	}
	return doc, nil
}

// parentPointer returns the pointer p (which has a "/") without its last
// segment.
func parentPointer(p string) string { return p[:strings.LastIndexByte(p, '/')] }

// lastSegment returns the last segment of the pointer p, unescaped (no
// allocation unless it has a "~"); ok is false when p has no "/" or the
// segment is not validly escaped.
func lastSegment(p string) (string, bool) {
	k := strings.LastIndexByte(p, '/')
	if k < 0 {
		return "", false
	}
	return unescapeSegment(p[k+1:])
}

// entry is a member or element of the container a run edits: its key as
// spelled in the document (quotes included) and its value.
type entry struct {
	rawKey []byte
	// key is, for a member of the document, its item's key (the decoded
	// key when it differs from rawKey's bytes, else ""); for a member an
	// operation added (added), its name.
	key   string
	added bool
	value []byte
	// op is true when value is an operation's (it may have space around
	// it), false when it is the document's bytes.
	op bool
}

// keyIs reports whether the entry's unescaped key is seg, without
// allocating.
func (en *entry) keyIs(seg string) bool {
	if en.added || en.key != "" {
		return en.key == seg
	}
	return string(en.rawKey[1:len(en.rawKey)-1]) == seg
}

// itemKey is the entry's item.key in the result: "" unless rawKey decodes
// to something other than its bytes.
func (en *entry) itemKey() string {
	if !en.added {
		return en.key
	}
	if k := en.rawKey[1 : len(en.rawKey)-1]; needsUnquote(k) {
		if key, err := unquote(en.rawKey); err == nil {
			return key
		}
	}
	return ""
}

// applyRun applies ops, all on members of the container at parent, to doc;
// ix, when bound to doc, locates doc's top level and the containers Docs
// located below it; out, when not nil, is filled with what is located in
// the result when it can be (see ApplyIndexed and Index.carry).
func applyRun(dst, doc []byte, ix *Index, parent []string, ops []Op, out *Index) ([]byte, error) {
	root := jsonscan.SkipSpace(doc, 0)
	if root >= len(doc) || (doc[root] != '{' && doc[root] != '[') {
		return nil, errSplice
	}
	var rc *container
	var loc *located // what Docs over doc located below its top level
	if ix.boundTo(doc) {
		rc, loc = &ix.c, &ix.located // rc is read only; an Index is built over valid JSON
	} else {
		var err error
		rc, err = parseContainer(doc, root, 0, nil)
		if err != nil || jsonscan.SkipSpace(doc, rc.end) != len(doc) {
			return nil, errSplice
		}
	}
	m := &memo{}
	m.put(rc)
	m.shared = loc // after the top level, which stays out of it
	s, e, err := walk(doc, root, parent, m)
	if err != nil || s < 0 || (doc[s] != '{' && doc[s] != '[') {
		return nil, errSplice
	}
	c := m.get(s)
	if c == nil {
		if c, err = parseContainer(doc, s, len(parent), m.extents()); err != nil {
			return nil, errSplice
		}
	}
	if res, ok := appendRun(dst, doc, c, ops, out != nil); ok {
		if out != nil {
			out.carry(rc, loc, &res.edited, e, res.doc)
		}
		return res.doc, nil
	}
	entries := make([]entry, len(c.items), len(c.items)+len(ops))
	for i, it := range c.items {
		entries[i] = entry{value: doc[it.vs:it.ve]}
		if c.object {
			entries[i].key, entries[i].rawKey = it.key, doc[it.ks:it.ke]
		}
	}
	for _, op := range ops {
		seg, _ := lastSegment(op.Path) // checked by applySplice
		if entries, err = edit(entries, c.object, op, seg); err != nil {
			return nil, err
		}
	}
	n := len(doc) - (e - s) + 2
	for _, en := range entries {
		n += len(en.rawKey) + len(en.value) + 2
	}
	res := buffer(dst, n)
	res = append(res, doc[:s]...)
	open, close := byte('['), byte(']')
	if c.object {
		open, close = '{', '}'
	}
	// The edited container's members as they are in res, when out wants
	// them: where the bytes go is known while writing them.
	var items []item
	if out != nil {
		items = make([]item, 0, len(entries))
	}
	res = append(res, open)
	for i := range entries {
		en := &entries[i]
		if i > 0 {
			res = append(res, ',')
		}
		var it item
		if c.object {
			it.ks = len(res)
			res = append(res, en.rawKey...)
			it.ke = len(res)
			res = append(res, ':')
		}
		it.vs = len(res)
		res = append(res, en.value...)
		it.ve = len(res)
		if out != nil {
			if c.object {
				it.key = en.itemKey()
			}
			if en.op { // a valid JSON value, perhaps with space around it
				it.vs = jsonscan.SkipSpace(res, it.vs)
				for it.ve > it.vs && jsonscan.IsSpace(res[it.ve-1]) {
					it.ve--
				}
			}
			items = append(items, it)
		}
	}
	res = append(res, close)
	res = append(res, doc[e:]...)
	if out != nil {
		edited := container{object: c.object, start: s, end: len(res) - (len(doc) - e), data: res, items: items}
		out.carry(rc, loc, &edited, e, res)
	}
	return res, nil
}

// buffer returns dst emptied when it has room for n bytes, else a new
// buffer with that room.
func buffer(dst []byte, n int) []byte {
	if cap(dst) >= n {
		return dst[:0]
	}
	return make([]byte, 0, n)
}

// appended is what appendRun made: the document and the edited array in
// it.
type appended struct {
	doc    []byte
	edited container
}

// appendRun is applyRun for its most common run, the one a mutator adding
// to a list makes: only "add" operations at "-" of an array written
// without space (as the API server writes objects). It inserts their
// values before the array's "]", which gives the bytes applyRun's general
// path writes (the elements joined by commas) without listing the
// elements; locate says whether the edited array's elements are wanted
// (for ApplyIndexed's Index). ok is false for any other run.
func appendRun(dst, doc []byte, c *container, ops []Op, locate bool) (_ appended, ok bool) {
	if c.object {
		return appended{}, false
	}
	n := len(c.items) + 1 // the array's bytes when compact: "[", "]" and the commas
	for _, it := range c.items {
		n += it.ve - it.vs
	}
	if len(c.items) == 0 {
		n = 2
	}
	if c.end-c.start != n {
		return appended{}, false
	}
	add := 0
	for i := range ops {
		if ops[i].Op != "add" || !strings.HasSuffix(ops[i].Path, "/-") {
			return appended{}, false
		}
		add += len(ops[i].Value) + 1
	}
	close := c.end - 1
	res := buffer(dst, len(doc)+add)
	res = append(res, doc[:close]...)
	var items []item
	if locate {
		items = append(make([]item, 0, len(c.items)+len(ops)), c.items...)
	}
	for i := range ops {
		if len(c.items) > 0 || i > 0 {
			res = append(res, ',')
		}
		vs := len(res)
		res = append(res, ops[i].Value...)
		if locate { // a valid JSON value, perhaps with space around it
			it := item{vs: jsonscan.SkipSpace(res, vs), ve: len(res)}
			for it.ve > it.vs && jsonscan.IsSpace(res[it.ve-1]) {
				it.ve--
			}
			items = append(items, it)
		}
	}
	res = append(res, doc[close:]...)
	return appended{doc: res, edited: container{start: c.start, end: c.end + len(res) - len(doc), data: res, items: items}}, true
}

// edit applies one operation on the member or element seg of a container
// whose entries are given, with RFC 6902's rules: add sets a member (or
// inserts an element, "-" appending), replace and remove need it to exist.
// A repeated member name counts as one member, the last (as the library
// reads it): setting keeps only the last, removing removes all.
func edit(entries []entry, object bool, op Op, seg string) ([]entry, error) {
	if object {
		at := -1
		for i := len(entries) - 1; i >= 0; i-- {
			if entries[i].keyIs(seg) {
				at = i
				break
			}
		}
		switch {
		case at < 0 && op.Op == "add":
			return append(entries, entry{rawKey: AppendString(nil, seg), key: seg, added: true, value: op.Value, op: true}), nil
		case at < 0:
			return nil, errSplice
		case op.Op == "remove":
			return slices.DeleteFunc(entries, func(en entry) bool { return en.keyIs(seg) }), nil
		}
		entries[at].value, entries[at].op = op.Value, true
		kept := entries[at]
		entries = slices.DeleteFunc(entries, func(en entry) bool { return en.keyIs(seg) })
		return slices.Insert(entries, min(at, len(entries)), kept), nil
	}
	if seg == "-" {
		if op.Op != "add" {
			return nil, errSplice
		}
		return append(entries, entry{value: op.Value, op: true}), nil
	}
	i, ok := index(seg)
	if !ok {
		return nil, errSplice
	}
	switch {
	case op.Op == "add" && i <= len(entries):
		return slices.Insert(entries, i, entry{value: op.Value, op: true}), nil
	case i >= len(entries):
		return nil, errSplice
	case op.Op == "remove":
		return slices.Delete(entries, i, i+1), nil
	}
	entries[i].value, entries[i].op = op.Value, true
	return entries, nil
}
