package colocation

import (
	"bytes"
	"strconv"

	corev1 "k8s.io/api/core/v1"

	"github.com/kadmit/kadmit/internal/jsonedit"
)

// maxScanTolerations bounds the elements tolerationsHave reads; a longer
// list is read by toleration.Of (the same bound as its own fast path).
const maxScanTolerations = 256

// tolerationsHave returns the tolerations of the list at path in doc that
// equal one of ts (as sameToleration compares them), reading the list's
// bytes without decoding it: a pod's list, a dozen or more once lifespan
// has run, is not decoded to find the one or two a profile adds. The
// profiles need no more of the list: apply only asks whether a toleration
// is in it, and Write appends what is not.
//
// ok is false, and the caller reads the whole list with toleration.Of as
// before, unless every element is an object of only the members
// toleration.Read reads itself, each in the form it reads without falling
// back to the decoder (key, operator, value and effect: strings without
// escapes; tolerationSeconds: null or an integer strconv.ParseInt takes):
// then the list decodes, with toleration.Read and with the decoder, to
// exactly the fields compared here, so the answer is the one the decoded
// list gives and no decoding error is missed. err is doc.Get's, as
// toleration.Of returns it; a missing or null list has none.
func tolerationsHave(doc *jsonedit.Doc, path []string, ts []corev1.Toleration) (have []corev1.Toleration, ok bool, err error) {
	raw, err := doc.Get(path...)
	if err != nil {
		return nil, false, err
	}
	if raw == nil || raw[0] == 'n' {
		return nil, true, nil
	}
	if raw[0] != '[' {
		return nil, false, nil
	}
	i := jsonedit.SkipSpace(raw, 1)
	if i < len(raw) && raw[i] == ']' {
		return nil, true, nil
	}
	for n := 0; ; n++ {
		if n == maxScanTolerations || i >= len(raw) || raw[i] != '{' {
			return nil, false, nil
		}
		var e scannedToleration
		if i, ok = e.scan(raw, i); !ok {
			return nil, false, nil
		}
		for _, t := range ts {
			if e.is(t) {
				have = append(have, t)
				break
			}
		}
		i = jsonedit.SkipSpace(raw, i)
		if i < len(raw) && raw[i] == ']' {
			return have, true, nil
		}
		if i >= len(raw) || raw[i] != ',' {
			return nil, false, nil
		}
		i = jsonedit.SkipSpace(raw, i+1)
	}
}

// scannedToleration is one element of a tolerations list as its bytes
// spell it: the strings' contents (no escapes) and tolerationSeconds.
type scannedToleration struct {
	key, operator, value, effect []byte
	hasSeconds                   bool // tolerationSeconds is a number, not null or absent
	seconds                      int64
}

// scan reads the object at raw[i] (raw[i] == '{') and returns the index
// past it; ok is false for anything outside the form tolerationsHave
// accepts. A repeated member counts last, as both readers take it.
func (e *scannedToleration) scan(raw []byte, i int) (_ int, ok bool) {
	i = jsonedit.SkipSpace(raw, i+1)
	if i < len(raw) && raw[i] == '}' {
		return i + 1, true
	}
	for {
		if i >= len(raw) || raw[i] != '"' {
			return 0, false
		}
		ke := jsonedit.ScanString(raw, i)
		if ke < 0 {
			return 0, false
		}
		key := raw[i+1 : ke-1]
		vs := jsonedit.SkipSpace(raw, ke)
		if vs >= len(raw) || raw[vs] != ':' {
			return 0, false
		}
		vs = jsonedit.SkipSpace(raw, vs+1)
		// A string value without escapes, the form read, in one pass;
		// anything else is scanned as any value.
		ve := plainString(raw, vs)
		if ve < 0 {
			ve = jsonedit.ScanValue(raw, vs, 3)
		}
		if ve < 0 {
			return 0, false
		}
		v := raw[vs:ve]
		var dst *[]byte
		switch string(key) {
		case "key":
			dst = &e.key
		case "operator":
			dst = &e.operator
		case "value":
			dst = &e.value
		case "effect":
			dst = &e.effect
		case "tolerationSeconds":
			if v[0] == 'n' {
				if string(v) != "null" {
					return 0, false
				}
				e.hasSeconds = false
				break
			}
			n, err := strconv.ParseInt(string(v), 10, 64)
			if err != nil {
				return 0, false
			}
			e.hasSeconds, e.seconds = true, n
		default:
			return 0, false
		}
		if dst != nil {
			if v[0] != '"' || bytes.IndexByte(v, '\\') >= 0 {
				return 0, false
			}
			*dst = v[1 : len(v)-1]
		}
		i = jsonedit.SkipSpace(raw, ve)
		if i < len(raw) && raw[i] == '}' {
			return i + 1, true
		}
		if i >= len(raw) || raw[i] != ',' {
			return 0, false
		}
		i = jsonedit.SkipSpace(raw, i+1)
	}
}

// plainString returns the index past the string at raw[i] when it has no
// escape and no control character (what the scanner would check), else -1.
func plainString(raw []byte, i int) int {
	if i >= len(raw) || raw[i] != '"' {
		return -1
	}
	for j := i + 1; j < len(raw); j++ {
		switch c := raw[j]; {
		case c == '"':
			return j + 1
		case c == '\\' || c < 0x20:
			return -1
		}
	}
	return -1
}

// is reports whether the element decodes to a toleration equal to t.
func (e *scannedToleration) is(t corev1.Toleration) bool {
	return string(e.key) == t.Key && string(e.operator) == string(t.Operator) && string(e.value) == t.Value &&
		string(e.effect) == string(t.Effect) &&
		e.hasSeconds == (t.TolerationSeconds != nil) && (!e.hasSeconds || e.seconds == *t.TolerationSeconds)
}
