package lifespan

import (
	"bytes"
	"encoding/json"
	"strconv"

	corev1 "k8s.io/api/core/v1"

	"github.com/kadmit/kadmit/internal/jsonedit"
)

// maxFastTolerations bounds the tolerations readTolerations reads itself;
// a longer list goes through the decoder (same result, higher cost).
const maxFastTolerations = 256

// readTolerations reads spec.tolerations, the valid JSON raw (an array, as
// jsonedit.Doc.Get returns it), as the decoder reads it into
// []corev1.Toleration, for the fields hasToleration compares (key,
// operator, value, effect) and checking tolerationSeconds' type, without
// reflection. ok is false, and the caller decodes with jsonedit.Doc.Decode,
// for anything the decoder might read differently or refuse: a non-array,
// an element that is not an object, a member that is not one of the five
// fields, a null or escaped string, a tolerationSeconds that is not a plain
// int64, or more than maxFastTolerations elements.
func readTolerations(raw []byte, dst []corev1.Toleration) (_ []corev1.Toleration, ok bool) {
	if len(raw) == 0 || raw[0] != '[' {
		return nil, false
	}
	i := jsonedit.SkipSpace(raw, 1)
	if i < len(raw) && raw[i] == ']' {
		return dst, true
	}
	for {
		if len(dst) == maxFastTolerations || i >= len(raw) || raw[i] != '{' {
			return nil, false
		}
		var t corev1.Toleration
		if i, ok = readToleration(raw, i, &t); !ok {
			return nil, false
		}
		dst = append(dst, t)
		i = jsonedit.SkipSpace(raw, i)
		if i < len(raw) && raw[i] == ']' {
			return dst, true
		}
		if i >= len(raw) || raw[i] != ',' {
			return nil, false
		}
		i = jsonedit.SkipSpace(raw, i+1)
	}
}

// readToleration reads the object at raw[i] into t and returns the index
// past it.
func readToleration(raw []byte, i int, t *corev1.Toleration) (int, bool) {
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
		ve := jsonedit.ScanValue(raw, vs, 3)
		if ve < 0 {
			return 0, false
		}
		v := raw[vs:ve]
		var dst *string
		switch string(key) {
		case "key":
			dst = &t.Key
		case "operator":
			dst = (*string)(&t.Operator)
		case "value":
			dst = &t.Value
		case "effect":
			dst = (*string)(&t.Effect)
		case "tolerationSeconds":
			if v[0] == 'n' {
				t.TolerationSeconds = nil
				break
			}
			n, err := strconv.ParseInt(string(v), 10, 64)
			if err != nil {
				return 0, false
			}
			t.TolerationSeconds = &n
		default:
			return 0, false
		}
		if dst != nil {
			if v[0] != '"' || bytes.IndexByte(v, '\\') >= 0 {
				return 0, false
			}
			*dst = string(v[1 : len(v)-1])
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

// appendToleration appends t as json.Marshal writes a corev1.Toleration
// (fields in declaration order, each omitted when empty), strings escaped
// by jsonedit.AppendString (no HTML escaping, as every value a Doc writes).
func appendToleration(b []byte, t corev1.Toleration) json.RawMessage {
	b = append(b, '{')
	sep := false
	field := func(name, v string) {
		if v == "" {
			return
		}
		if sep {
			b = append(b, ',')
		}
		sep = true
		b = append(b, '"')
		b = append(b, name...)
		b = append(b, '"', ':')
		b = jsonedit.AppendString(b, v)
	}
	field("key", t.Key)
	field("operator", string(t.Operator))
	field("value", t.Value)
	field("effect", string(t.Effect))
	if t.TolerationSeconds != nil {
		if sep {
			b = append(b, ',')
		}
		b = strconv.AppendInt(append(b, `"tolerationSeconds":`...), *t.TolerationSeconds, 10)
	}
	return append(b, '}')
}
