// Package jsonedit reads and edits JSON documents as bytes, and states every
// edit as a JSONPatch (RFC 6902) operation.
//
// Admission mutators use it to change an object without decoding it into
// map[string]any and encoding it again: the parts they do not edit stay as
// the API server sent them, so integers above 2^53 keep every digit, no
// string is HTML-escaped and unknown fields survive. A Doc reads fields by
// JSON pointer with the API server's decoding rules (case-sensitive keys,
// the last of duplicate keys wins) and collects Ops; Apply applies Ops to a
// document by splicing bytes, falling back to the JSONPatch library the API
// server itself uses (gopkg.in/evanphx/json-patch.v4) for what it does not
// handle.
package jsonedit

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"
)

// Op is one JSONPatch (RFC 6902) operation. Op is "add", "remove" or
// "replace" for operations a Doc builds; Apply accepts every RFC 6902
// operation. Path is a JSON pointer (RFC 6901), escaped, e.g.
// "/metadata/labels/app.kubernetes.io~1name". Value is the operation's value
// as JSON, kept byte for byte; nil for remove.
type Op struct {
	Op    string          `json:"op"`
	Path  string          `json:"path"`
	From  string          `json:"from,omitempty"`
	Value json.RawMessage `json:"value,omitempty"`

	// checked is Value as the Doc that built the op made it: bytes the Doc
	// wrote itself (encoding/json's or AppendString's output, or a copy of
	// a value it checked), valid JSON that nobody else holds. While Value
	// is still exactly those bytes (same address and length), AppendPatch
	// and Apply do not scan it again; an Op made or changed elsewhere is
	// checked. Values must not be changed in place: assign a new one.
	checked []byte
}

// newOp is an operation a Doc built; owned marks value as bytes the Doc
// made and checked (see checked).
func newOp(op, path string, value []byte, owned bool) Op {
	o := Op{Op: op, Path: path, Value: value}
	if owned && len(value) > 0 {
		o.checked = value
	}
	return o
}

// validValue reports whether op.Value is valid JSON, without scanning it
// when it is the value its Doc made.
func (op *Op) validValue() bool {
	if len(op.checked) > 0 && len(op.Value) == len(op.checked) && &op.Value[0] == &op.checked[0] {
		return true
	}
	return Valid(op.Value)
}

// String renders op as its JSON form.
func (op Op) String() string {
	b, err := AppendPatch(nil, []Op{op})
	if err != nil {
		return fmt.Sprintf("%s %s (%v)", op.Op, op.Path, err)
	}
	return string(b[1 : len(b)-1])
}

// MarshalJSON encodes op as a JSONPatch operation, values as they are, with
// no HTML escaping. It fails when Value is not valid JSON.
func (op Op) MarshalJSON() ([]byte, error) {
	b, err := AppendPatch(nil, []Op{op})
	if err != nil {
		return nil, err
	}
	return b[1 : len(b)-1], nil
}

// AppendPatch appends the JSONPatch document for the operations of runs,
// in order (a JSON array; "[]" when there are none), to dst: a mutating
// chain's patch is its mutators' runs of operations, encoded without
// first being copied into one slice. Values are copied as they are, so
// numbers keep their spelling, and strings are not HTML-escaped. It fails
// when a Value is not valid JSON, so that a broken operation never reaches
// the API server inside an otherwise valid response (a value a Doc made is
// known valid and not scanned again).
func AppendPatch(dst []byte, runs ...[]Op) ([]byte, error) {
	// Grown once to what the patch takes without escapes: a pod's dozen
	// tolerations would otherwise regrow it three or four times.
	n := 2
	for _, ops := range runs {
		for i := range ops {
			op := &ops[i]
			n += len(op.Op) + len(op.Path) + len(op.From) + len(op.Value) + len(`{"op":"","path":"","from":"","value":},`)
		}
	}
	dst = slices.Grow(dst, n)
	dst = append(dst, '[')
	first := true
	for _, ops := range runs {
		for i := range ops {
			op := &ops[i]
			if !first {
				dst = append(dst, ',')
			}
			first = false
			dst = append(dst, `{"op":`...)
			dst = AppendString(dst, op.Op)
			dst = append(dst, `,"path":`...)
			dst = AppendString(dst, op.Path)
			if op.From != "" {
				dst = append(dst, `,"from":`...)
				dst = AppendString(dst, op.From)
			}
			if op.Value != nil {
				if !op.validValue() {
					return nil, fmt.Errorf("JSONPatch operation %s %s: value is not valid JSON", op.Op, op.Path)
				}
				dst = append(dst, `,"value":`...)
				dst = append(dst, op.Value...)
			}
			dst = append(dst, '}')
		}
	}
	return append(dst, ']'), nil
}

// AppendString appends s to dst as a JSON string, escaping what JSON
// requires (quote, backslash, control characters; invalid UTF-8 becomes
// U+FFFD as with encoding/json) and, unlike encoding/json's default, not
// <, > and &. U+2028 and U+2029 are escaped, as encoding/json does.
func AppendString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hex[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// Pointer returns the JSON pointer (RFC 6901) of the member or element
// named by segments, in order from the document root: each segment has "~"
// escaped as "~0" and "/" as "~1". Pointer() is "", the whole document.
func Pointer(segments ...string) string {
	n := 0
	for _, s := range segments {
		n += 1 + len(s)
	}
	var b strings.Builder
	b.Grow(n + 4)
	for _, s := range segments {
		b.WriteByte('/')
		if !strings.ContainsAny(s, "~/") {
			b.WriteString(s)
			continue
		}
		for i := 0; i < len(s); i++ {
			switch s[i] {
			case '~':
				b.WriteString("~0")
			case '/':
				b.WriteString("~1")
			default:
				b.WriteByte(s[i])
			}
		}
	}
	return b.String()
}

// ParsePointer splits a JSON pointer into its unescaped segments: "" is the
// whole document (no segments), "/a~1b/~0" is ["a/b", "~"]. It fails when
// the pointer does not start with "/" or has a "~" not followed by 0 or 1.
func ParsePointer(p string) ([]string, error) {
	if p == "" {
		return nil, nil
	}
	if p[0] != '/' {
		return nil, fmt.Errorf("JSON pointer %q does not start with /", p)
	}
	segs := strings.Split(p[1:], "/")
	for i, s := range segs {
		seg, ok := unescapeSegment(s)
		if !ok {
			return nil, fmt.Errorf("JSON pointer %q: ~ must be followed by 0 or 1", p)
		}
		segs[i] = seg
	}
	return segs, nil
}

// unescapeSegment returns the segment of a JSON pointer s stands for ("~1"
// is "/", "~0" is "~"), s itself when it has no "~"; ok is false when a
// "~" is not followed by 0 or 1.
func unescapeSegment(s string) (_ string, ok bool) {
	if !strings.Contains(s, "~") {
		return s, true
	}
	var b strings.Builder
	for j := 0; j < len(s); j++ {
		if s[j] != '~' {
			b.WriteByte(s[j])
			continue
		}
		if j+1 >= len(s) || (s[j+1] != '0' && s[j+1] != '1') {
			return "", false
		}
		if s[j+1] == '0' {
			b.WriteByte('~')
		} else {
			b.WriteByte('/')
		}
		j++
	}
	return b.String(), true
}
