package jsonedit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/kadmit/kadmit/internal/jsonedit/jsonscan"
	k8sjson "sigs.k8s.io/json"
)

// Doc is a JSON document being edited: it reads fields of the document as
// given and collects the JSONPatch operations that make the edits asked of
// it, without ever re-encoding the document.
//
// Paths are lists of unescaped segments from the root: object member names,
// or decimal indexes into arrays. Reads follow the API server's decoding:
// member names match case-sensitively and, when a name is repeated, the
// last member counts. Get and Decode always read the document as given;
// edits change only what later edits see (Set under an object an earlier
// Set created adds to it rather than creating it again). Elements added by
// Append cannot be addressed by index in the same Doc.
//
// A Doc is not safe for concurrent use. Its cost is one scan of the
// document plus one of each object or array a path goes through.
type Doc struct {
	raw         []byte
	parsed      bool
	root, rootE int // the root value's bytes
	err         error
	memo        memo
	ops         []Op
	// written holds the value of each path an operation wrote (nil for
	// removed), latest last: what later edits see there.
	written []written
}

type written struct {
	path []string
	raw  []byte
}

// NewDoc returns a Doc over raw, which it does not modify or copy; raw must
// not change while the Doc is in use.
func NewDoc(raw []byte) *Doc { return &Doc{raw: raw} }

// Ops returns the operations the edits so far amount to, in order: applied
// to the document as given (with Apply, or by the API server), they yield
// the edited document.
func (d *Doc) Ops() []Op { return d.ops }

// Get returns the raw JSON of the value at path in the document as given
// (the whole document for an empty path), or nil when there is none: a
// missing member, an index past the end, or a null on the way. It fails
// when the document is not valid JSON or a value on the way is not an
// object or array (or an array is addressed by a name).
func (d *Doc) Get(path ...string) ([]byte, error) {
	s, e, err := d.locate(path)
	if err != nil || s < 0 {
		return nil, err
	}
	return d.raw[s:e], nil
}

// Decode decodes the value at path into v as the API server decodes
// objects (sigs.k8s.io/json: case-sensitive member names, integers kept
// exact in interface values). found is false, and v untouched, when there is
// no value or it is null. Errors are Get's, or the decoding error with the
// path.
func (d *Doc) Decode(v any, path ...string) (found bool, err error) {
	s, e, err := d.locate(path)
	if err != nil || s < 0 || d.raw[s] == 'n' {
		return false, err
	}
	if d.decodeFast(s, e, len(path), v) {
		return true, nil
	}
	if err := k8sjson.UnmarshalCaseSensitivePreserveInts(d.raw[s:e], v); err != nil {
		return false, fmt.Errorf("%s: %w", display(path), err)
	}
	return true, nil
}

// decodeFast decodes the valid JSON d.raw[s:e] (at nesting depth depth)
// into v for the two shapes mutators read most, a string and an object of
// strings (labels, annotations), as the decoder would; it returns false,
// leaving v alone, for anything else. An object's members are located
// through the memo, so a later Set or Doc on the same bytes finds them.
func (d *Doc) decodeFast(s, e, depth int, v any) bool {
	raw := d.raw[s:e]
	switch v := v.(type) {
	case *string:
		if raw[0] != '"' {
			return false
		}
		str, err := unquote(raw)
		if err != nil {
			return false
		}
		*v = str
		return true
	case *map[string]string:
		if raw[0] != '{' {
			return false
		}
		c, err := d.memo.container(d.raw, s, depth)
		if err != nil {
			return false
		}
		for _, it := range c.items {
			if d.raw[it.vs] != '"' {
				return false
			}
		}
		// Keys and values without escapes are substrings of one string
		// holding their bytes: one allocation instead of two per member.
		n := 0
		for _, it := range c.items {
			n += it.ve - it.vs + it.ke - it.ks
		}
		var b strings.Builder
		b.Grow(n)
		for _, it := range c.items {
			b.Write(d.raw[it.ks+1 : it.ke-1])
			b.Write(d.raw[it.vs+1 : it.ve-1])
		}
		all, at := b.String(), 0
		sub := func(raw []byte) string {
			at += len(raw)
			return all[at-len(raw) : at]
		}
		m := make(map[string]string, len(c.items))
		for _, it := range c.items {
			key, val := sub(d.raw[it.ks+1:it.ke-1]), sub(d.raw[it.vs+1:it.ve-1])
			if it.key != "" {
				key = it.key
			}
			if needsUnquote(d.raw[it.vs+1 : it.ve-1]) {
				var err error
				if val, err = unquote(d.raw[it.vs:it.ve]); err != nil {
					return false
				}
			}
			m[key] = val
		}
		*v = m
		return true
	}
	return false
}

// EachElement calls fn with each element of the array at path in the
// document as given, in order, until fn returns false; it reports whether
// fn saw them all. Unlike the package's EachElement over the array's
// bytes, it locates the elements through the Doc: an array the Doc, its
// Index or the edit that made it (ApplyIndexed) already located is not
// scanned again, and one the envelope's scan recorded skips its elements'
// contents. A missing or null value has no elements (true); any other
// non-array value is false. Errors are Get's.
func (d *Doc) EachElement(path []string, fn func(value []byte) bool) (bool, error) {
	s, _, err := d.locate(path)
	if err != nil {
		return false, err
	}
	if s < 0 || d.raw[s] == 'n' {
		return true, nil
	}
	if d.raw[s] != '[' {
		return false, nil
	}
	c, err := d.memo.container(d.raw, s, len(path))
	if err != nil {
		return false, err
	}
	for _, it := range c.items {
		if !fn(d.raw[it.vs:it.ve]) {
			return false, nil
		}
	}
	return true, nil
}

// Set sets the value at path (at least one segment) to value, encoded as
// JSON without HTML escaping (a json.RawMessage is used as it is): a
// "replace" of a member or element that is there, else an "add" of the
// member. Missing
// or null objects on the way are created, with one "add" of the outermost.
// It fails when the document is not an object, or a value on the way is
// neither an object, an array, null nor missing.
func (d *Doc) Set(value any, path ...string) error {
	raw, err := Marshal(value)
	if err != nil {
		return fmt.Errorf("set %s: %w", display(path), err)
	}
	_, caller := value.(json.RawMessage)
	return d.set(raw, path, !caller)
}

// set records the operations setting path to raw, valid JSON; owned says
// that raw is bytes the Doc made (nobody else holds them), so its ops can
// be marked as checked (see Op.checked).
func (d *Doc) set(raw []byte, path []string, owned bool) error {
	if len(path) == 0 {
		return fmt.Errorf("set: the path is empty; the whole document cannot be replaced")
	}
	if d.ops == nil {
		// Room for a mutator's few edits (an Op is 96 bytes, so not many
		// more: Append grows it to what it adds).
		d.ops = make([]Op, 0, 4)
	}
	if op, ok := d.setFast(raw, path); ok {
		d.ops = append(d.ops, newOp(op, Pointer(path...), raw, owned))
		d.write(path, raw)
		return nil
	}
	if k, err := d.kind(nil); err != nil {
		return err
	} else if k != '{' {
		return fmt.Errorf("set %s: the document is %s, not an object", display(path), kindName(k))
	}
	// The first segment whose value is missing or null, if any.
	missing := -1
	for i := 0; i < len(path)-1; i++ {
		k, err := d.kind(path[:i+1])
		if err != nil {
			return fmt.Errorf("set %s: %w", display(path), err)
		}
		if k == 0 || k == 'n' {
			missing = i
			break
		}
		if k != '{' && k != '[' {
			return fmt.Errorf("set %s: %s is %s, not an object", display(path), display(path[:i+1]), kindName(k))
		}
	}
	if missing < 0 {
		missing = len(path) - 1
	}
	parent, err := d.kind(path[:missing])
	if err != nil {
		return fmt.Errorf("set %s: %w", display(path), err)
	}
	op := "add"
	if missing == len(path)-1 {
		// Say "replace" for a member that is there, as a diff would.
		if k, err := d.kind(path); err == nil && k != 0 {
			op = "replace"
		}
	}
	if parent == '[' {
		// Only existing elements can be set; "add" would insert.
		if k, err := d.kind(path[:missing+1]); err != nil || k == 0 || missing != len(path)-1 {
			return fmt.Errorf("set %s: %s has no element %s", display(path), display(path[:missing]), path[missing])
		}
		op = "replace"
	}
	for j := len(path) - 1; j > missing; j-- {
		raw = append(append(append(AppendString([]byte{'{'}, path[j]), ':'), raw...), '}')
	}
	// raw was wrapped into new bytes unless missing is the last segment.
	d.ops = append(d.ops, newOp(op, Pointer(path[:missing+1]...), raw, owned || missing < len(path)-1))
	d.write(path[:missing+1], raw)
	return nil
}

// setFast finds the operation setting path to raw needs in the common case
// of a member of an object that is in the document as given, untouched by
// earlier edits: "add", or "replace" when the member is there. ok is false
// in every other case, which set then works out step by step.
func (d *Doc) setFast(raw []byte, path []string) (op string, ok bool) {
	for _, w := range d.written {
		if len(w.path) <= len(path) && slices.Equal(w.path, path[:len(w.path)]) {
			return "", false
		}
	}
	s, _, err := d.locate(path[:len(path)-1])
	if err != nil || s < 0 || d.raw[s] != '{' {
		return "", false
	}
	c, err := d.memo.container(d.raw, s, len(path)-1)
	if err != nil {
		return "", false
	}
	if c.member(path[len(path)-1]) >= 0 {
		return "replace", true
	}
	return "add", true
}

// Remove removes the member or element at path (at least one segment) if
// there is one. It fails as Get does.
func (d *Doc) Remove(path ...string) error {
	if len(path) == 0 {
		return fmt.Errorf("remove: the path is empty; the whole document cannot be removed")
	}
	k, err := d.kind(path)
	if err != nil {
		return fmt.Errorf("remove %s: %w", display(path), err)
	}
	if k == 0 {
		return nil
	}
	d.ops = append(d.ops, Op{Op: "remove", Path: Pointer(path...)})
	d.write(path, nil)
	return nil
}

// Append appends values, each encoded as Set encodes, to the array at path:
// one "add" of path/- each, or, when the array is missing or null, one Set
// of the array of values. It fails when the value at path is something
// else, or as Set does.
func (d *Doc) Append(path []string, values ...any) error {
	if len(values) == 0 {
		return nil
	}
	raws := make([][]byte, len(values))
	owned := true
	for i, v := range values {
		raw, err := Marshal(v)
		if err != nil {
			return fmt.Errorf("append to %s: %w", display(path), err)
		}
		if _, caller := v.(json.RawMessage); caller {
			owned = false
		}
		raws[i] = raw
	}
	return d.appendRaw(path, raws, owned)
}

// AppendJSON is Append for values already encoded: each must be valid JSON
// (checked) and is used byte for byte (copied, in one buffer, so that the
// patch never needs checking again). It saves a mutator that writes its
// values itself the boxing and encoding Append does.
func (d *Doc) AppendJSON(path []string, values ...json.RawMessage) error {
	if len(values) == 0 {
		return nil
	}
	n := 0
	for _, v := range values {
		if !Valid(v) {
			return fmt.Errorf("append to %s: %w: raw value", display(path), ErrSyntax)
		}
		n += len(v)
	}
	buf := make([]byte, 0, n)
	raws := make([][]byte, len(values))
	for i, v := range values {
		s := len(buf)
		buf = append(buf, v...)
		raws[i] = buf[s:len(buf):len(buf)]
	}
	return d.appendRaw(path, raws, true)
}

// Fragment is a JSON value checked once, when it is made, for a mutator
// that writes the same values into many objects (lifespan's tolerations,
// encoded at start): AppendFragments neither checks nor copies it again.
// Its bytes are its own (NewFragment copies them) and never change, so the
// operations of every Doc it is appended to may share them. The zero
// Fragment is no value.
type Fragment struct{ raw []byte }

// NewFragment returns a copy of v as a Fragment, or an error wrapping
// ErrSyntax when v is not one valid JSON value.
func NewFragment(v []byte) (Fragment, error) {
	if !Valid(v) {
		return Fragment{}, fmt.Errorf("%w: fragment %.40q", ErrSyntax, v)
	}
	return Fragment{raw: bytes.Clone(v)}, nil
}

// AppendFragments is AppendJSON for values checked when they were made:
// the operations use the fragments' bytes as they are, without checking
// or copying them. It fails as AppendJSON does, or on a zero Fragment.
func (d *Doc) AppendFragments(path []string, values ...Fragment) error {
	if len(values) == 0 {
		return nil
	}
	raws := make([][]byte, len(values))
	for i, v := range values {
		if v.raw == nil {
			return fmt.Errorf("append to %s: %w: a zero Fragment", display(path), ErrSyntax)
		}
		raws[i] = v.raw
	}
	return d.appendRaw(path, raws, true)
}

func (d *Doc) appendRaw(path []string, raws [][]byte, owned bool) error {
	k, err := d.kind(path)
	if err != nil {
		return fmt.Errorf("append to %s: %w", display(path), err)
	}
	switch k {
	case 0, 'n':
		arr := append([]byte{'['}, bytes.Join(raws, []byte{','})...)
		return d.set(append(arr, ']'), path, true)
	case '[':
		p := Pointer(path...) + "/-"
		d.ops = slices.Grow(d.ops, len(raws)) // once, not doubling per operation
		for _, raw := range raws {
			d.ops = append(d.ops, newOp("add", p, raw, owned))
		}
		return nil
	}
	return fmt.Errorf("append to %s: it is %s, not an array", display(path), kindName(k))
}

// write records what an operation wrote at path, and forgets what was
// recorded below it.
func (d *Doc) write(path []string, raw []byte) {
	d.written = slices.DeleteFunc(d.written, func(w written) bool {
		return len(w.path) >= len(path) && slices.Equal(w.path[:len(path)], path)
	})
	d.written = append(d.written, written{path: slices.Clone(path), raw: raw})
}

// kind returns the first byte of the value at path as edits so far left
// it ('{', '[', '"', 'n', 't', 'f' or a number's first byte), or 0 when
// there is none.
func (d *Doc) kind(path []string) (byte, error) {
	for n := len(path); n > 0 && len(d.written) > 0; n-- {
		i := slices.IndexFunc(d.written, func(w written) bool { return slices.Equal(w.path, path[:n]) })
		if i < 0 {
			continue
		}
		raw := d.written[i].raw
		if raw == nil {
			return 0, nil
		}
		// The rest of the path is inside a value an edit wrote.
		s, _, err := locateIn(raw, path[n:])
		if err != nil || s < 0 {
			return 0, err
		}
		return raw[s], nil
	}
	s, _, err := d.locate(path)
	if err != nil || s < 0 {
		return 0, err
	}
	return d.raw[s], nil
}

// locate returns the bytes of the value at path in the document as given,
// or -1 when there is none.
func (d *Doc) locate(path []string) (int, int, error) {
	if !d.parsed {
		d.parsed = true
		d.root = jsonscan.SkipSpace(d.raw, 0)
		d.rootE = -1
		if d.root < len(d.raw) && (d.raw[d.root] == '{' || d.raw[d.root] == '[') {
			// Locating the root's members scans, and so checks, it all.
			if c, err := parseContainer(d.raw, d.root, 0, nil); err == nil {
				d.memo.put(c)
				d.rootE = c.end
			}
		} else {
			d.rootE = jsonscan.ScanValue(d.raw, d.root, 0)
		}
		if d.rootE < 0 || jsonscan.SkipSpace(d.raw, d.rootE) != len(d.raw) {
			d.err = syntaxError(d.raw)
		}
	}
	if d.err != nil {
		return -1, -1, d.err
	}
	if len(path) == 0 {
		return d.root, d.rootE, nil
	}
	return walk(d.raw, d.root, path, &d.memo)
}

// memo caches the containers of a document by their start. A request
// reads a handful of containers (root, metadata, spec, a list or two), so a
// short list searched linearly beats a map, and its first entries need no
// allocation beyond the Doc's own (five keep a Doc in a 192-byte size
// class).
type memo struct {
	first [5]*container
	n     int // entries in first
	more  []*container
	// shared, when not nil, is the cache of the Index the Doc started
	// from: get looks there too, and put records there while it has room,
	// so that later Docs over the same bytes and ApplyIndexed find what
	// this one located.
	shared *located
}

// get returns the container starting at s, or nil; m may be nil.
func (m *memo) get(s int) *container {
	if m == nil {
		return nil
	}
	for _, c := range m.first[:m.n] {
		if c.start == s {
			return c
		}
	}
	for _, c := range m.more {
		if c.start == s {
			return c
		}
	}
	return m.shared.get(s)
}

// container returns the container starting at d[s] (depth: its nesting
// depth), from m when m holds it, else parsed (skipping what m's extents
// recorded) and recorded in m; m may be nil. It fails on invalid JSON.
func (m *memo) container(d []byte, s, depth int) (*container, error) {
	if c := m.get(s); c != nil {
		return c, nil
	}
	c, err := parseContainer(d, s, depth, m.extents())
	if err != nil {
		return nil, err
	}
	m.put(c)
	return c, nil
}

// extents returns where the containers of the bytes m caches end, or nil
// when m (which may be nil) is not an Index's.
func (m *memo) extents() *extents {
	if m == nil || m.shared == nil {
		return nil
	}
	return &m.shared.ext
}

// put records c, in the shared cache while it has room; m may be nil
// (nothing is cached).
func (m *memo) put(c *container) {
	if m == nil {
		return
	}
	if m.shared != nil && m.shared.put(c) {
		return
	}
	if m.n < len(m.first) {
		m.first[m.n] = c
		m.n++
		return
	}
	m.more = append(m.more, c)
}

// maxLocated bounds the containers an Index keeps for the Docs over its
// bytes (Index.located): a pod's mutators and validators read about ten
// (metadata, labels, annotations, spec, tolerations, containers and a
// container's resources); past that a Doc keeps what it locates to itself,
// so an Index stays the same size whatever a document or its policies do.
const maxLocated = 32

// located is the containers below the top level of an Index's bytes that
// Docs over them located. Its first three (what one mutator of a pod
// typically reads: metadata, labels, spec) need no allocation beyond the
// Index's own, which keeps the admission envelope that embeds an Index in
// its size class.
type located struct {
	first [3]*container // filled in order: the first nil ends them
	more  []*container
	// ext is where the containers below the top level end, as the
	// envelope's scan found them (ScanIndexed) and edits moved them
	// (Index.carry): parseContainer skips them instead of scanning.
	ext extents
}

// len returns how many containers l holds.
func (l *located) len() int {
	n := 0
	for n < len(l.first) && l.first[n] != nil {
		n++
	}
	return n + len(l.more)
}

// get returns the container starting at s, or nil; l may be nil.
func (l *located) get(s int) *container {
	if l == nil {
		return nil
	}
	for _, c := range l.first {
		if c == nil {
			return nil
		}
		if c.start == s {
			return c
		}
	}
	for _, c := range l.more {
		if c.start == s {
			return c
		}
	}
	return nil
}

// put records c and reports true, or false when l holds maxLocated.
func (l *located) put(c *container) bool {
	for i := range l.first {
		if l.first[i] == nil {
			l.first[i] = c
			return true
		}
	}
	if len(l.first)+len(l.more) >= maxLocated {
		return false
	}
	l.more = append(l.more, c)
	return true
}

// each calls f with each container l holds; l may be nil.
func (l *located) each(f func(*container)) {
	if l == nil {
		return
	}
	for _, c := range l.first {
		if c == nil {
			return
		}
		f(c)
	}
	for _, c := range l.more {
		f(c)
	}
}

// locateIn is locate in a value an edit wrote (valid JSON).
func locateIn(raw []byte, path []string) (int, int, error) {
	return walk(raw, jsonscan.SkipSpace(raw, 0), path, nil)
}

// walk follows path from the valid JSON value at d[s]; memo, when not nil,
// caches the containers it parses by start.
func walk(d []byte, s int, path []string, memo *memo) (int, int, error) {
	e := -1
	for i, seg := range path {
		switch d[s] {
		case 'n':
			return -1, -1, nil
		case '{', '[':
		default:
			return -1, -1, fmt.Errorf("%s is %s, not an object or array", display(path[:i]), kindName(d[s]))
		}
		c, err := memo.container(d, s, i)
		if err != nil {
			return -1, -1, err
		}
		var at int
		if c.object {
			if at = c.member(seg); at < 0 {
				return -1, -1, nil
			}
		} else {
			n, ok := index(seg)
			if !ok {
				return -1, -1, fmt.Errorf("%s is an array and %q is not an index", display(path[:i]), seg)
			}
			if n >= len(c.items) {
				return -1, -1, nil
			}
			at = n
		}
		s, e = c.items[at].vs, c.items[at].ve
	}
	if e < 0 {
		if e = jsonscan.ScanValue(d, s, 0); e < 0 {
			return -1, -1, ErrSyntax
		}
	}
	return s, e, nil
}

// syntaxError is encoding/json's error for invalid JSON d.
func syntaxError(d []byte) error {
	var v any
	if err := json.Unmarshal(d, &v); err != nil {
		return fmt.Errorf("%w: %v", ErrSyntax, err)
	}
	return ErrSyntax
}

// display renders a path for messages: "spec.tolerations[2]"-like, as a
// JSON pointer to stay unambiguous, e.g. "/spec/tolerations/2"; the whole
// document is "the document".
func display(path []string) string {
	if len(path) == 0 {
		return "the document"
	}
	return Pointer(path...)
}

// Marshal encodes v as JSON without HTML escaping and without a trailing
// newline; a json.RawMessage is checked and used as it is.
func Marshal(v any) ([]byte, error) {
	if raw, ok := v.(json.RawMessage); ok {
		if !Valid(raw) {
			return nil, fmt.Errorf("%w: raw value", ErrSyntax)
		}
		return raw, nil
	}
	if s, ok := v.(string); ok {
		return AppendString(nil, s), nil
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte{'\n'}), nil
}
