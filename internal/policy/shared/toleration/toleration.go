// Package toleration reads and writes a pod's tolerations in its raw JSON
// without reflection: the two mutators that add tolerations (lifespan and
// colocation) read the list the pod has, to add only what is missing, and
// write the ones they add. One reader and one writer, each checked against
// encoding/json by its tests, so both policies read a pod alike.
package toleration

import (
	"bytes"
	"encoding/json"
	"strconv"

	corev1 "k8s.io/api/core/v1"

	"github.com/kadmit/kadmit/internal/jsonedit"
)

// Of reads the tolerations list at path in doc (nil when absent or null)
// as the decoder reads it into []corev1.Toleration: with Read when it can,
// else with doc.Decode, whose error (naming the path) it returns.
func Of(doc *jsonedit.Doc, path ...string) ([]corev1.Toleration, error) {
	raw, err := doc.Get(path...)
	if err != nil || raw == nil || raw[0] == 'n' {
		return nil, err
	}
	if have, ok := Read(raw, make([]corev1.Toleration, 0, 4)); ok {
		return have, nil
	}
	var have []corev1.Toleration
	_, err = doc.Decode(&have, path...)
	return have, err
}

// MaxRead bounds the tolerations Read and ScanList read themselves; a longer list goes
// through the decoder (same result, higher cost), so a hostile pod cannot
// make Read's fast path grow without bound.
const MaxRead = 256

// Read reads a tolerations list, the valid JSON raw (an array, as
// jsonedit.Doc.Get returns it), appending to dst exactly what
// sigs.k8s.io/json's case-sensitive decoder reads into []corev1.Toleration
// (key, operator, value, effect, tolerationSeconds), without reflection.
// ok is false, and the caller decodes with jsonedit.Doc.Decode (Of does),
// for anything the decoder might read differently or refuse: a non-array,
// an element that is not an object, a member that is not one of the five
// fields, a null or escaped string, a tolerationSeconds that is not a plain
// int64, or more than MaxRead elements.
func Read(raw []byte, dst []corev1.Toleration) (_ []corev1.Toleration, ok bool) {
	ok = ScanList(raw, func(r Raw) {
		t := corev1.Toleration{Key: string(r.Key), Operator: corev1.TolerationOperator(r.Operator),
			Value: string(r.Value), Effect: corev1.TaintEffect(r.Effect)}
		if r.HasSeconds {
			n := r.Seconds
			t.TolerationSeconds = &n
		}
		dst = append(dst, t)
	})
	if !ok {
		return nil, false
	}
	return dst, true
}

// Raw is one element of a tolerations list as its bytes spell it: the
// strings' contents (never escaped: ScanList refuses escapes) and
// tolerationSeconds. Its slices point into the list's bytes and are valid
// only during the ScanList callback.
type Raw struct {
	Key, Operator, Value, Effect []byte
	HasSeconds                   bool // tolerationSeconds is a number, not null or absent
	Seconds                      int64
}

// Equal reports whether r decodes to a toleration equal to t, field by
// field (TolerationSeconds by value).
func (r *Raw) Equal(t corev1.Toleration) bool {
	return string(r.Key) == t.Key && string(r.Operator) == string(t.Operator) && string(r.Value) == t.Value &&
		string(r.Effect) == string(t.Effect) &&
		r.HasSeconds == (t.TolerationSeconds != nil) && (!r.HasSeconds || r.Seconds == *t.TolerationSeconds)
}

// ScanList calls f for each element of the tolerations list raw (valid
// JSON, as jsonedit.Doc.Get returns it), in order, without allocating.
// It returns false, possibly after calling f for the elements before it,
// for anything Read refuses (see Read): the caller then decodes instead.
// The one reader of tolerations: Read builds corev1.Tolerations from it,
// colocation asks whether a toleration is in a pod's list without building
// any. It walks the list and each element's members with
// jsonedit.EachElement and jsonedit.EachMember (the JSON layer's one
// member loop), matching member names exactly, as the decoder does.
func ScanList(raw []byte, f func(Raw)) bool {
	if len(raw) == 0 || raw[0] != '[' {
		return false
	}
	return jsonedit.EachElement(raw, elements(f))
}

// elements returns the element reader of ScanList and ScanAt: it reads
// each element into a Raw for f, and stops (false) at the MaxRead+1th, at
// an element that is not an object, or at one readObject refuses.
func elements(f func(Raw)) func(v []byte) bool {
	n := 0
	return func(v []byte) bool {
		if n == MaxRead || v[0] != '{' {
			return false
		}
		n++
		var r Raw
		if !readObject(v, &r) {
			return false
		}
		f(r)
		return true
	}
}

// KeysAbsent reports whether no element of the tolerations list raw (valid
// JSON, as jsonedit.Doc.Get returns it) can decode to a toleration whose
// key is one of ts' keys: raw is an array, no key of ts is empty (an
// empty key equals an element without one) and, for each key,
// jsonedit.MayHoldString is sure raw spells it nowhere (no backslash in
// raw, the key printable ASCII found nowhere between quotes). A pod's list
// and a profile's keys are both short: this is a pass over raw per key,
// where ScanList reads every member of every element.
//
// True says nothing of the rest of the list: an element the decoder
// refuses (a string tolerationSeconds, an unknown member) goes unnoticed.
func KeysAbsent(raw []byte, ts []corev1.Toleration) bool {
	if len(raw) == 0 || raw[0] != '[' {
		return false
	}
	for _, t := range ts {
		if t.Key == "" || jsonedit.MayHoldString(raw, t.Key) {
			return false
		}
	}
	return true
}

// ScanAt is ScanList for the list at path in doc, its elements located
// through the Doc (jsonedit.Doc.EachElement): a list an earlier mutator
// wrote (lifespan's tolerations, before colocation reads them) or one the
// envelope's scan recorded is not scanned twice. A missing or null list
// has no elements (true). err is doc.Get's.
func ScanAt(doc *jsonedit.Doc, path []string, f func(Raw)) (bool, error) {
	return doc.EachElement(path, elements(f))
}

// readObject reads the toleration object v into r. A repeated member
// counts last, as the decoder takes it; an escaped or unknown name, a
// null or escaped string, or a tolerationSeconds that is not a plain int64
// refuses.
func readObject(v []byte, r *Raw) bool {
	return jsonedit.EachMember(v, func(key, val []byte) bool {
		var dst *[]byte
		switch string(key) {
		case "key":
			dst = &r.Key
		case "operator":
			dst = &r.Operator
		case "value":
			dst = &r.Value
		case "effect":
			dst = &r.Effect
		case "tolerationSeconds":
			if val[0] == 'n' {
				r.HasSeconds = false
				return true
			}
			n, err := strconv.ParseInt(string(val), 10, 64)
			if err != nil {
				return false
			}
			r.HasSeconds, r.Seconds = true, n
			return true
		default:
			return false
		}
		if val[0] != '"' || bytes.IndexByte(val, '\\') >= 0 {
			return false
		}
		*dst = val[1 : len(val)-1]
		return true
	})
}

// AppendJSON appends t as json.Marshal writes a corev1.Toleration
// (fields in declaration order, each omitted when empty), strings escaped
// by jsonedit.AppendString (no HTML escaping, as every value a Doc writes).
func AppendJSON(b []byte, t corev1.Toleration) json.RawMessage {
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

// Encode returns ts as AppendJSON writes them, each a slice of one shared
// buffer (one allocation for the bytes), ready for jsonedit.Doc.AppendJSON.
func Encode(ts []corev1.Toleration) []json.RawMessage {
	out := make([]json.RawMessage, len(ts))
	buf := make([]byte, 0, 96*len(ts))
	for i, t := range ts {
		start := len(buf)
		buf = AppendJSON(buf, t)
		out[i] = buf[start:len(buf):len(buf)]
	}
	return out
}
