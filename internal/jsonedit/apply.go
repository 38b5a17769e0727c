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
	if len(ops) == 0 {
		return doc, nil
	}
	if out, err := applySplice(doc, ops); err == nil {
		return out, nil
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

func applySplice(doc []byte, ops []Op) ([]byte, error) {
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
		var err error
		if doc, err = applyRun(doc, parent, ops[i:j], paths[i:j]); err != nil {
			return nil, err
		}
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

// applyRun applies ops, all on members of the container at parent, to doc.
func applyRun(doc []byte, parent []string, ops []Op, paths [][]string) ([]byte, error) {
	root := SkipSpace(doc, 0)
	if root >= len(doc) || (doc[root] != '{' && doc[root] != '[') {
		return nil, errSplice
	}
	rc, err := parseContainer(doc, root, 0)
	if err != nil || SkipSpace(doc, rc.end) != len(doc) {
		return nil, errSplice
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
	out := make([]byte, 0, n)
	out = append(out, doc[:s]...)
	open, close := byte('['), byte(']')
	if c.object {
		open, close = '{', '}'
	}
	out = append(out, open)
	for i, en := range entries {
		if i > 0 {
			out = append(out, ',')
		}
		if c.object {
			out = append(append(out, en.rawKey...), ':')
		}
		out = append(out, en.value...)
	}
	out = append(out, close)
	return append(out, doc[e:]...), nil
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
