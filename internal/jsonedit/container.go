package jsonedit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"unicode/utf8"

	"github.com/kadmit/kadmit/internal/jsonedit/jsonscan"
)

// container is an object or array value of a document, with its members
// (or elements) located in the document's bytes.
type container struct {
	object     bool
	start, end int    // the value's bytes: d[start] is '{' or '['
	data       []byte // the document the offsets are in
	items      []item
}

// item is one member of an object or element of an array. A key without
// escapes is read from the document's bytes when needed, so locating the
// members of an object allocates no string per key.
type item struct {
	// key is the decoded key when its bytes decode to something else
	// (escapes, or invalid UTF-8, which decodes to U+FFFD), else "" (such
	// a key is never empty: every escape or invalid byte stands for a
	// character).
	key    string
	ks, ke int // the key's bytes, quotes included (objects only)
	vs, ve int // the value's bytes
}

// keyOf returns the unescaped key of member i (a new string when the key
// has no escapes).
func (c *container) keyOf(i int) string {
	it := &c.items[i]
	if it.key != "" {
		return it.key
	}
	return string(c.data[it.ks+1 : it.ke-1])
}

// keyIs reports whether member i's unescaped key is key, without allocating.
func (c *container) keyIs(i int, key string) bool {
	it := &c.items[i]
	if it.key != "" {
		return it.key == key
	}
	return string(c.data[it.ks+1:it.ke-1]) == key
}

// parseContainer locates the members of the object or array at d[i]; depth
// is its nesting depth; ext, when not nil, holds where containers of d
// end (an Index's, bound to d). It fails on invalid JSON.
func parseContainer(d []byte, i, depth int, ext *extents) (*container, error) {
	// The members are located into a scratch array on the stack and then
	// copied once, at their number: a pod's spec (twenty-odd members) would
	// otherwise grow its slice three times.
	var scratch [32]item
	c := &container{}
	items, _, err := c.parse(d, i, depth, -1, scratch[:0], skipper{x: ext})
	if err != nil {
		return nil, err
	}
	if len(items) > 0 {
		c.items = slices.Clone(items)
	}
	return c, nil
}

// parse locates the object or array at d[i] (depth is its nesting depth)
// into c and its members, appended to items, into out (c.items is left
// alone: the caller sets it, so that items may be a scratch array that
// does not escape); it fails on invalid JSON. With max >= 0, it records at
// most max members: past that it still checks the rest of the value but
// reports complete false and out holds the first max. The members are
// walked by jsonscan.Members (elements by jsonscan.Elements), the one loop
// every reader of an object uses, and each value is skipped by skip.
func (c *container) parse(d []byte, i, depth, max int, items []item, skip skipper) (out []item, complete bool, err error) {
	c.object, c.start, c.data = d[i] == '{', i, d
	complete = true
	add := func(it item) {
		if complete && max >= 0 && len(items) == max {
			complete = false
		}
		if complete {
			items = append(items, it)
		}
	}
	if c.object {
		c.end = jsonscan.Members(d, i, depth, func(ks, ke, vs int) int {
			it := item{ks: ks, ke: ke, vs: vs}
			if complete && needsUnquote(d[ks+1:ke-1]) {
				key, kerr := unquote(d[ks:ke])
				if kerr != nil {
					err = kerr
					return -1
				}
				it.key = key
			}
			if it.ve = skip.value(d, vs, depth+1); it.ve < 0 {
				return -1
			}
			add(it)
			return it.ve
		})
	} else {
		c.end = jsonscan.Elements(d, i, depth, func(vs int) int {
			it := item{vs: vs, ve: skip.value(d, vs, depth+1)}
			if it.ve >= 0 {
				add(it)
			}
			return it.ve
		})
	}
	if c.end < 0 {
		if err == nil {
			err = ErrSyntax
		}
		return nil, false, err
	}
	return items, complete, nil
}

// unquote returns the value of the JSON string q (quotes included), as
// encoding/json decodes it.
func unquote(q []byte) (string, error) {
	if !needsUnquote(q[1 : len(q)-1]) {
		return string(q[1 : len(q)-1]), nil
	}
	var s string
	if err := json.Unmarshal(q, &s); err != nil {
		return "", fmt.Errorf("%w: %v", ErrSyntax, err)
	}
	return s, nil
}

// needsUnquote reports whether the bytes of a JSON string (without quotes)
// decode to something else: escapes, or invalid UTF-8, which encoding/json
// replaces with U+FFFD.
func needsUnquote(b []byte) bool {
	return bytes.IndexByte(b, '\\') >= 0 || !utf8.Valid(b)
}

// member returns the index of the member key of an object, the last one
// when the key is repeated (as encoding/json and the API server's JSONPatch
// library read it), or -1.
func (c *container) member(key string) int {
	for i := len(c.items) - 1; i >= 0; i-- {
		if c.keyIs(i, key) {
			return i
		}
	}
	return -1
}

// index parses an array index segment as RFC 6901 spells it: decimal
// digits, no sign, no leading zero.
func index(seg string) (int, bool) {
	if seg == "" || len(seg) > 9 || (seg[0] == '0' && len(seg) > 1) {
		return 0, false
	}
	for i := 0; i < len(seg); i++ {
		if seg[i] < '0' || seg[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.Atoi(seg)
	return n, err == nil
}

// kindName names the JSON type of the value starting with c, for messages.
func kindName(c byte) string {
	switch c {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "a number"
}
