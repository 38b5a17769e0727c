package admission

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
)

// This file holds a small JSON syntax scanner for the admission hot path.
// encoding/json scans every byte of its input at least twice (checkValid,
// then decode or skip), about 80 MB/s on the benchmark machine; a 4.6 KB pod
// went through it four to six times per request. The scanner below checks
// the same grammar in one tight pass so the envelope and the policies can
// hand encoding/json only the few hundred bytes they actually decode.
//
// It accepts exactly what encoding/json's scanner accepts (RFC 8259 syntax,
// no UTF-8 check, nesting up to maxNestingDepth); whenever it reports an
// error, callers decode the original input with encoding/json instead so
// that the error message is encoding/json's own. FuzzScanValid checks the
// agreement with json.Valid.

// maxNestingDepth is encoding/json's limit; deeper input is an error there.
const maxNestingDepth = 10000

var errSyntax = errors.New("invalid JSON")

// strSafe[c] is true for bytes that need no attention inside a string.
var strSafe = func() (t [256]bool) {
	for c := 0x20; c < 256; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func skipSpace(d []byte, i int) int {
	for i < len(d) && isSpace(d[i]) {
		i++
	}
	return i
}

// scanValue returns the index just past the JSON value starting at d[i]
// (d[i] is not whitespace), or -1 when it is not valid JSON.
func scanValue(d []byte, i, depth int) int {
	if i >= len(d) {
		return -1
	}
	switch c := d[i]; {
	case c == '"':
		return scanString(d, i)
	case c == '{':
		if depth >= maxNestingDepth {
			return -1
		}
		i = skipSpace(d, i+1)
		if i < len(d) && d[i] == '}' {
			return i + 1
		}
		for {
			if i >= len(d) || d[i] != '"' {
				return -1
			}
			if i = scanString(d, i); i < 0 {
				return -1
			}
			i = skipSpace(d, i)
			if i >= len(d) || d[i] != ':' {
				return -1
			}
			if i = scanValue(d, skipSpace(d, i+1), depth+1); i < 0 {
				return -1
			}
			i = skipSpace(d, i)
			if i >= len(d) {
				return -1
			}
			if d[i] == '}' {
				return i + 1
			}
			if d[i] != ',' {
				return -1
			}
			i = skipSpace(d, i+1)
		}
	case c == '[':
		if depth >= maxNestingDepth {
			return -1
		}
		i = skipSpace(d, i+1)
		if i < len(d) && d[i] == ']' {
			return i + 1
		}
		for {
			if i = scanValue(d, i, depth+1); i < 0 {
				return -1
			}
			i = skipSpace(d, i)
			if i >= len(d) {
				return -1
			}
			if d[i] == ']' {
				return i + 1
			}
			if d[i] != ',' {
				return -1
			}
			i = skipSpace(d, i+1)
		}
	case c == '-' || (c >= '0' && c <= '9'):
		return scanNumber(d, i)
	case c == 't':
		return scanLiteral(d, i, "true")
	case c == 'f':
		return scanLiteral(d, i, "false")
	case c == 'n':
		return scanLiteral(d, i, "null")
	}
	return -1
}

// scanString returns the index past the string starting at d[i] == '"'.
func scanString(d []byte, i int) int {
	i++
	for i < len(d) {
		c := d[i]
		if strSafe[c] {
			i++
			continue
		}
		switch {
		case c == '"':
			return i + 1
		case c == '\\':
			if i+1 >= len(d) {
				return -1
			}
			switch d[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(d) {
					return -1
				}
				for _, h := range d[i+2 : i+6] {
					if !isHex(h) {
						return -1
					}
				}
				i += 6
			default:
				return -1
			}
		default: // a control character
			return -1
		}
	}
	return -1
}

func isHex(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func scanNumber(d []byte, i int) int {
	if d[i] == '-' {
		i++
	}
	switch {
	case i < len(d) && d[i] == '0':
		i++
	case i < len(d) && d[i] >= '1' && d[i] <= '9':
		for i < len(d) && isDigit(d[i]) {
			i++
		}
	default:
		return -1
	}
	if i < len(d) && d[i] == '.' {
		i++
		if i >= len(d) || !isDigit(d[i]) {
			return -1
		}
		for i < len(d) && isDigit(d[i]) {
			i++
		}
	}
	if i < len(d) && (d[i] == 'e' || d[i] == 'E') {
		i++
		if i < len(d) && (d[i] == '+' || d[i] == '-') {
			i++
		}
		if i >= len(d) || !isDigit(d[i]) {
			return -1
		}
		for i < len(d) && isDigit(d[i]) {
			i++
		}
	}
	return i
}

func scanLiteral(d []byte, i int, lit string) int {
	if len(d)-i < len(lit) || string(d[i:i+len(lit)]) != lit {
		return -1
	}
	return i + len(lit)
}

// validJSON reports whether d is one JSON value with optional surrounding
// whitespace: json.Valid, faster.
func validJSON(d []byte) bool {
	i := scanValue(d, skipSpace(d, 0), 0)
	return i >= 0 && skipSpace(d, i) == len(d)
}

// Keep names the members of a JSON object that Prune keeps. A nil Keep keeps
// a whole value; a non-nil one keeps only the object members whose key
// matches one of its keys and prunes each of them with the Keep it maps to.
type Keep map[string]Keep

// Prune returns a copy of the JSON document d with, at every object level
// keep describes, only the members keep names: a policy that reads a few
// fields of a 4.6 KB pod then decodes a few hundred bytes. Decoding the
// result with encoding/json into a struct that has only fields named by keep
// yields the same values and the same type errors as decoding d itself,
// because Prune keeps every member encoding/json could match to such a field:
// keys are compared case-insensitively (as encoding/json matches fields), a
// key with an escape sequence is always kept, and duplicate keys stay in
// order. A value that keep expects to be an object but is not is kept whole.
// Prune returns an error when d is not valid JSON (as json.Valid); callers
// then decode d itself to report encoding/json's message.
func Prune(d []byte, keep Keep) ([]byte, error) {
	out, _, err := pruneDoc(d, keep)
	return out, err
}

// pruneDoc is Prune that also reports whether the kept members are
// canonical: every key matched exactly (same case, no escapes) and at most
// once per object.
func pruneDoc(d []byte, keep Keep) ([]byte, bool, error) {
	p := pruner{d: d, out: make([]byte, 0, 256), canonical: true}
	end := p.prune(skipSpace(d, 0), keep, 0)
	if end < 0 || skipSpace(d, end) != len(d) {
		return nil, false, errSyntax
	}
	return p.out, p.canonical, nil
}

type pruner struct {
	d, out    []byte
	canonical bool
}

// prune appends the pruned value at d[i] to p.out and returns the index
// past the value, or -1 on a syntax error.
func (p *pruner) prune(i int, keep Keep, depth int) int {
	d := p.d
	if keep == nil || i >= len(d) || d[i] != '{' {
		end := scanValue(d, i, depth)
		if end < 0 {
			return -1
		}
		p.out = append(p.out, d[i:end]...)
		return end
	}
	if depth >= maxNestingDepth {
		return -1
	}
	p.out = append(p.out, '{')
	first := true
	var seen []string // kept keys at this level, to spot duplicates
	i = skipSpace(d, i+1)
	if i < len(d) && d[i] == '}' {
		p.out = append(p.out, '}')
		return i + 1
	}
	for {
		if i >= len(d) || d[i] != '"' {
			return -1
		}
		ks := i
		ke := scanString(d, i)
		if ke < 0 {
			return -1
		}
		i = skipSpace(d, ke)
		if i >= len(d) || d[i] != ':' {
			return -1
		}
		i = skipSpace(d, i+1)
		name, sub, ok := matchKey(d[ks+1:ke-1], keep)
		if ok {
			if name == "" || name != string(d[ks+1:ke-1]) || slices.Contains(seen, name) {
				p.canonical = false
			}
			seen = append(seen, name)
			if !first {
				p.out = append(p.out, ',')
			}
			first = false
			p.out = append(p.out, d[ks:ke]...)
			p.out = append(p.out, ':')
			i = p.prune(i, sub, depth+1)
		} else {
			i = scanValue(d, i, depth+1)
		}
		if i < 0 {
			return -1
		}
		i = skipSpace(d, i)
		if i >= len(d) {
			return -1
		}
		if d[i] == '}' {
			p.out = append(p.out, '}')
			return i + 1
		}
		if d[i] != ',' {
			return -1
		}
		i = skipSpace(d, i+1)
	}
}

// matchKey reports whether the raw (still escaped) key matches a key of
// keep as encoding/json would match a struct field, with that key's name and
// sub-Keep. A key with escapes is kept whole, with name "": it might
// unescape to a kept name.
func matchKey(raw []byte, keep Keep) (string, Keep, bool) {
	for _, c := range raw {
		if c == '\\' {
			return "", nil, true
		}
	}
	if sub, ok := keep[string(raw)]; ok {
		return string(raw), sub, true
	}
	for k, sub := range keep {
		if strings.EqualFold(k, string(raw)) {
			return k, sub, true
		}
	}
	return "", nil, false
}

// DecodeFields decodes into v (a struct whose fields are only those keep
// names) the members of the JSON document raw that keep names:
// json.Unmarshal(Prune(raw, keep), v), so a policy that reads a pod's name
// never decodes its spec. When raw is not valid JSON it returns
// json.Unmarshal(raw, v)'s error, so messages are encoding/json's own.
//
// canonical reports that every member keep names appeared at most once, under
// its exact name and without escapes: what the API server always sends. A
// policy that builds a JSONPatch from the fields it decoded needs that (the
// patch addresses members by exact name), and otherwise lets the chain diff.
func DecodeFields(raw []byte, keep Keep, v any) (canonical bool, err error) {
	pruned, canonical, err := pruneDoc(raw, keep)
	if err != nil {
		return false, json.Unmarshal(raw, v)
	}
	return canonical, json.Unmarshal(pruned, v)
}
