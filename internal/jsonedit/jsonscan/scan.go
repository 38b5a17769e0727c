// Package jsonscan is the JSON syntax scanner under package jsonedit and
// kadmit's AdmissionReview wire codec (package admission: the envelope
// decoder, the pruner behind DecodeFields, the response encoder). Nothing
// else may import it (hack/check-jsonlayer.sh, run by `make vet`, fails
// otherwise): policies read JSON through jsonedit's API (Doc, EachMember,
// EachElement), so there is one scanner, one object-member loop (Members)
// and one key-matching rule.
//
// encoding/json scans every byte of its input at least twice (checkValid,
// then decode or skip), about 80 MB/s on the benchmark machine; a 4.6 KB pod
// went through it four to six times per request. The scanner below checks
// the same grammar in one tight pass, so that callers can locate the few
// hundred bytes they actually decode or edit.
//
// It accepts exactly what encoding/json's scanner accepts (RFC 8259 syntax,
// no UTF-8 check, nesting up to MaxDepth); whenever it reports an error,
// callers decode the original input with the decoder instead so that the
// error message is the decoder's own. FuzzValid checks the agreement with
// json.Valid.
package jsonscan

import (
	"encoding/binary"
	"errors"
	"math/bits"
)

// MaxDepth is encoding/json's nesting limit (and sigs.k8s.io/json's, a fork
// of it); deeper input is an error there.
const MaxDepth = 10000

// ErrSyntax is returned for input that is not valid JSON.
var ErrSyntax = errors.New("invalid JSON")

// strSafe[c] is true for bytes that need no attention inside a string.
var strSafe = func() (t [256]bool) {
	for c := 0x20; c < 256; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// IsSpace reports whether c is JSON whitespace.
func IsSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// SkipSpace returns the index of the first non-whitespace byte of d at or
// after i, or len(d). The API server sends compact JSON, so the first test
// (every JSON whitespace byte is <= ' ') usually ends the loop at once.
func SkipSpace(d []byte, i int) int {
	for i < len(d) && d[i] <= ' ' && IsSpace(d[i]) {
		i++
	}
	return i
}

// ScanValue returns the index just past the JSON value starting at d[i]
// (d[i] is not whitespace), or -1 when it is not valid JSON. depth is the
// nesting depth of the value (0 for a document); a value nested deeper than
// MaxDepth is invalid, as for encoding/json.
func ScanValue(d []byte, i, depth int) int {
	if i >= len(d) {
		return -1
	}
	switch c := d[i]; {
	case c == '"':
		return ScanString(d, i)
	case c == '{':
		return Members(d, i, depth, nil)
	case c == '[':
		return Elements(d, i, depth, nil)
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

// Members is the one object-member loop of kadmit: every reader of an
// object's members (the scanner itself, jsonedit's containers and Index,
// jsonedit.EachMember for policies, the envelope decoder, the pruner) walks
// them through it.
//
// It walks the object starting at d[i] (d[i] == '{'; depth is its nesting
// depth, 0 for a document) and calls member(ks, ke, vs) for each member in
// document order: d[ks:ke] is the key's JSON string, quotes included and
// escapes kept (checked by ScanString), and vs the index of the first byte
// of the value (whitespace skipped). member returns the index just past the
// value, which it read or scanned itself (ScanValue(d, vs, depth+1) when it
// only needs to skip it), or a negative number to stop the walk. A nil
// member skips every value with ScanValue.
//
// Members returns the index just past the object, or -1 when the object is
// not valid JSON, nests deeper than MaxDepth, or member stopped. It
// allocates nothing; member is never retained, so a closure passed as
// member stays on the caller's stack.
func Members(d []byte, i, depth int, member func(ks, ke, vs int) int) int {
	if i >= len(d) || d[i] != '{' || depth >= MaxDepth {
		return -1
	}
	i = SkipSpace(d, i+1)
	if i < len(d) && d[i] == '}' {
		return i + 1
	}
	for {
		if i >= len(d) || d[i] != '"' {
			return -1
		}
		ks := i
		ke := ScanString(d, i)
		if ke < 0 {
			return -1
		}
		i = SkipSpace(d, ke)
		if i >= len(d) || d[i] != ':' {
			return -1
		}
		vs := SkipSpace(d, i+1)
		if member == nil {
			i = ScanValue(d, vs, depth+1)
		} else {
			i = member(ks, ke, vs)
		}
		if i < 0 {
			return -1
		}
		i = SkipSpace(d, i)
		if i >= len(d) {
			return -1
		}
		if d[i] == '}' {
			return i + 1
		}
		if d[i] != ',' {
			return -1
		}
		i = SkipSpace(d, i+1)
	}
}

// Elements is Members for the array starting at d[i] (d[i] == '['):
// element(vs) is called with the index of each element's first byte and
// returns the index past it, or a negative number to stop; a nil element
// skips each with ScanValue. It returns the index past the array, or -1.
func Elements(d []byte, i, depth int, element func(vs int) int) int {
	if i >= len(d) || d[i] != '[' || depth >= MaxDepth {
		return -1
	}
	i = SkipSpace(d, i+1)
	if i < len(d) && d[i] == ']' {
		return i + 1
	}
	for {
		if element == nil {
			i = ScanValue(d, i, depth+1)
		} else {
			i = element(i)
		}
		if i < 0 {
			return -1
		}
		i = SkipSpace(d, i)
		if i >= len(d) {
			return -1
		}
		if d[i] == ']' {
			return i + 1
		}
		if d[i] != ',' {
			return -1
		}
		i = SkipSpace(d, i+1)
	}
}

// ScanString returns the index past the string starting at d[i] == '"',
// or -1 when it is not a valid JSON string.
//
// It looks at eight bytes at a time (SWAR: one 64-bit word, no assembly)
// until one of them is '"', '\\' or a control character, then reads that
// byte: a pod's strings are mostly plain label values, image names and
// paths, and this is the scanner's hottest loop.
func ScanString(d []byte, i int) int {
	i++
	for {
		for i+8 <= len(d) {
			if m := special(binary.LittleEndian.Uint64(d[i:])); m != 0 {
				i += bits.TrailingZeros64(m) >> 3
				break
			}
			i += 8
		}
		for i < len(d) && strSafe[d[i]] {
			i++
		}
		if i >= len(d) {
			return -1
		}
		switch d[i] {
		case '"':
			return i + 1
		case '\\':
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
}

const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

// special returns x (eight bytes, the first in the low bits) with the high
// bit set in each byte that is '"', '\\' or below 0x20, and clear in the
// others up to the first such byte (bytes past it may be flagged wrongly:
// a borrow can carry into them, which is why callers use only the lowest
// flag). Zero means all eight are plain string bytes. This is the
// "determine if a word has a byte less than n" bit hack, with n = 0x20,
// and the zero-byte test on x XOR '"' and x XOR '\\'.
func special(x uint64) uint64 {
	q := x ^ (lsb * '"')
	b := x ^ (lsb * '\\')
	return ((q-lsb)&^q | (b-lsb)&^b | (x-lsb*0x20)&^x) & msb
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

// HasLiteral reports whether d[i:] starts with lit (null, true, false).
func HasLiteral(d []byte, i int, lit string) bool {
	return len(d)-i >= len(lit) && string(d[i:i+len(lit)]) == lit
}

// Valid reports whether d is one JSON value with optional surrounding
// whitespace: json.Valid, faster.
func Valid(d []byte) bool {
	i := ScanValue(d, SkipSpace(d, 0), 0)
	return i >= 0 && SkipSpace(d, i) == len(d)
}
