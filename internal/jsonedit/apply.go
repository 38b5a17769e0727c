package jsonedit

import (
	"errors"
	"fmt"
	"slices"

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
	if out != nil {
		*out = Index{}
	}
	if len(ops) == 0 {
		return doc, nil
	}
	if res, err := applySplice(doc, ix, ops, out); err == nil {
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
// out, when not nil, receives the result's (see ApplyIndexed).
func applySplice(doc []byte, ix *Index, ops []Op, out *Index) ([]byte, error) {
	paths := make([][]string, len(ops))
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
		segs, err := ParsePointer(op.Path)
		if err != nil || len(segs) == 0 {
			return nil, errSplice
		}
		paths[i] = segs
	}
	for i := 0; i < len(ops); {
		parent := paths[i][:len(paths[i])-1]
		j := i + 1
		for j < len(ops) && slices.Equal(paths[j][:len(paths[j])-1], parent) {
			j++
		}
		if out == nil { // nobody reads the result's index: locate nothing
			var err error
			if doc, err = applyRun(doc, ix, parent, ops[i:j], paths[i:j], nil); err != nil {
				return nil, err
			}
			ix, i = nil, j
			continue
		}
		// The next run reads ix while this one fills next, so they are
		// two Indexes; copying next into out keeps it usable (Bind points
		// items at the copy's own array).
		var next Index
		var err error
		if doc, err = applyRun(doc, ix, parent, ops[i:j], paths[i:j], &next); err != nil {
			return nil, err
		}
		*out = next
		if out.bound && !out.Bind(doc) {
			*out = Index{}
		}
		ix = out
		i = j
	}
	return doc, nil
}

// entry is a member or element of the container a run edits: its key as
// spelled in the document (quotes included) and its value.
type entry struct {
	rawKey []byte
	key    string
	value  []byte
}

// applyRun applies ops, all on members of the container at parent, to doc;
// ix, when bound to doc, locates doc's top level; out, when not nil, is
// filled with the result's top level when it can be (see ApplyIndexed).
func applyRun(doc []byte, ix *Index, parent []string, ops []Op, paths [][]string, out *Index) ([]byte, error) {
	root := SkipSpace(doc, 0)
	if root >= len(doc) || (doc[root] != '{' && doc[root] != '[') {
		return nil, errSplice
	}
	var rc *container
	if ix.boundTo(doc) {
		rc = &ix.c // read only; an Index is built over valid JSON
	} else {
		var err error
		rc, err = parseContainer(doc, root, 0)
		if err != nil || SkipSpace(doc, rc.end) != len(doc) {
			return nil, errSplice
		}
	}
	m := &memo{}
	m.put(rc)
	s, e, err := walk(doc, root, parent, m)
	if err != nil || s < 0 || (doc[s] != '{' && doc[s] != '[') {
		return nil, errSplice
	}
	c := rc
	if s != root {
		if c, err = parseContainer(doc, s, len(parent)); err != nil {
			return nil, errSplice
		}
	}
	entries := make([]entry, len(c.items), len(c.items)+len(ops))
	for i, it := range c.items {
		entries[i] = entry{value: doc[it.vs:it.ve]}
		if c.object {
			entries[i].key, entries[i].rawKey = c.keyOf(i), doc[it.ks:it.ke]
		}
	}
	for k, op := range ops {
		seg := paths[k][len(paths[k])-1]
		if entries, err = edit(entries, c.object, op, seg); err != nil {
			return nil, err
		}
	}
	n := len(doc) - (e - s) + 2
	for _, en := range entries {
		n += len(en.rawKey) + len(en.value) + 2
	}
	res := make([]byte, 0, n)
	res = append(res, doc[:s]...)
	open, close := byte('['), byte(']')
	if c.object {
		open, close = '{', '}'
	}
	res = append(res, open)
	for i, en := range entries {
		if i > 0 {
			res = append(res, ',')
		}
		if c.object {
			res = append(append(res, en.rawKey...), ':')
		}
		res = append(res, en.value...)
	}
	res = append(res, close)
	res = append(res, doc[e:]...)
	if out != nil && s != root {
		out.shift(rc, s, e, len(res)-len(doc), res)
	}
	return res, nil
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
			if entries[i].key == seg {
				at = i
				break
			}
		}
		switch {
		case at < 0 && op.Op == "add":
			return append(entries, entry{rawKey: AppendString(nil, seg), key: seg, value: op.Value}), nil
		case at < 0:
			return nil, errSplice
		case op.Op == "remove":
			return slices.DeleteFunc(entries, func(en entry) bool { return en.key == seg }), nil
		}
		entries[at].value = op.Value
		kept := entries[at]
		entries = slices.DeleteFunc(entries, func(en entry) bool { return en.key == seg })
		return slices.Insert(entries, min(at, len(entries)), kept), nil
	}
	if seg == "-" {
		if op.Op != "add" {
			return nil, errSplice
		}
		return append(entries, entry{value: op.Value}), nil
	}
	i, ok := index(seg)
	if !ok {
		return nil, errSplice
	}
	switch {
	case op.Op == "add" && i <= len(entries):
		return slices.Insert(entries, i, entry{value: op.Value}), nil
	case i >= len(entries):
		return nil, errSplice
	case op.Op == "remove":
		return slices.Delete(entries, i, i+1), nil
	}
	entries[i].value = op.Value
	return entries, nil
}
