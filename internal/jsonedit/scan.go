package jsonedit

import "errors"

// This file holds a small JSON syntax scanner for the admission hot path.
// encoding/json scans every byte of its input at least twice (checkValid,
// then decode or skip), about 80 MB/s on the benchmark machine; a 4.6 KB pod
// went through it four to six times per request. The scanner below checks
// the same grammar in one tight pass, so that callers can locate the few
// hundred bytes they actually decode or edit.
//
// It accepts exactly what encoding/json's scanner accepts (RFC 8259 syntax,
// no UTF-8 check, nesting up to MaxDepth); whenever it reports an error,
// callers decode the original input with encoding/json instead so that the
// error message is encoding/json's own. FuzzValid checks the agreement with
// json.Valid.

// MaxDepth is encoding/json's limit; deeper input is an error there.
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

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// SkipSpace returns the index of the first non-whitespace byte of d at or
// after i, or len(d).
func SkipSpace(d []byte, i int) int {
	for i < len(d) && isSpace(d[i]) {
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
		if depth >= MaxDepth {
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
			if i = ScanString(d, i); i < 0 {
				return -1
			}
			i = SkipSpace(d, i)
			if i >= len(d) || d[i] != ':' {
				return -1
			}
			if i = ScanValue(d, SkipSpace(d, i+1), depth+1); i < 0 {
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
	case c == '[':
		if depth >= MaxDepth {
			return -1
		}
		i = SkipSpace(d, i+1)
		if i < len(d) && d[i] == ']' {
			return i + 1
		}
		for {
			if i = ScanValue(d, i, depth+1); i < 0 {
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

// ScanString returns the index past the string starting at d[i] == '"',
// or -1 when it is not a valid JSON string.
func ScanString(d []byte, i int) int {
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

// Valid reports whether d is one JSON value with optional surrounding
// whitespace: json.Valid, faster.
func Valid(d []byte) bool {
	i := ScanValue(d, SkipSpace(d, 0), 0)
	return i >= 0 && SkipSpace(d, i) == len(d)
}
