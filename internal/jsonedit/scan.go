package jsonedit

import (
	"bytes"

	"github.com/kadmit/kadmit/internal/jsonedit/jsonscan"
	k8sjson "sigs.k8s.io/json"
)

// This file is jsonedit's reading API for code outside the JSON layer:
// policies walk an object's members or an array's elements here, and
// decode with Unmarshal, never with the scanner (package jsonscan, which
// only jsonedit and the wire codec may import).
//
// Key matching. Every reader in kadmit matches member names as the API
// server decodes objects and AdmissionReviews: case-sensitively, by exact
// name after unescaping, the last of repeated members winning
// (sigs.k8s.io/json's UnmarshalCaseSensitivePreserveInts, which
// k8s.io/apimachinery v0.37.1 pkg/runtime/serializer/json/json.go's
// Serializer.unmarshal calls for every non-strict JSON decode: objects the
// API server reads, and AdmissionReview responses from webhooks, which
// k8s.io/apiserver v0.37.1 pkg/util/webhook/client.go decodes with a
// serializer.NewCodecFactory(...).LegacyCodec).
// The fast paths compare raw key bytes; anything they do not handle the
// same way by construction (an escaped key, a repeated member merged into
// an earlier one, an unexpected type) makes them decline, and the caller
// decodes with Unmarshal, so the answer and error are the API server's.
//
// The one documented fallback: JSON carried as a string inside an object
// (an annotation's value, a ConfigMap's data key) is not the API server's
// to decode but its owner's. Where kadmit re-creates an upstream webhook
// that reads such a value, it decodes it as upstream does (Koordinator's
// annotations and slo-controller-config keys with encoding/json, whose
// member names match case-insensitively), and says so where it does.

// ErrSyntax is returned for input that is not valid JSON.
var ErrSyntax = jsonscan.ErrSyntax

// Valid reports whether d is one JSON value with optional surrounding
// whitespace: json.Valid, faster.
func Valid(d []byte) bool { return jsonscan.Valid(d) }

// Unmarshal decodes the JSON data into v as the API server decodes objects:
// sigs.k8s.io/json's UnmarshalCaseSensitivePreserveInts (member names
// matched case-sensitively, integers in interface values kept as int64).
// Errors are that decoder's.
func Unmarshal(data []byte, v any) error {
	return k8sjson.UnmarshalCaseSensitivePreserveInts(data, v)
}

// EachMember calls fn for each member of the JSON object raw, in document
// order: key is the member name's bytes between the quotes, still escaped
// (a caller comparing names must decline, and decode with Unmarshal, when
// key holds a '\\'), value the member's value, exactly as it is spelled.
// fn returns false to stop. EachMember reports whether it walked the
// whole object: false when raw is not one JSON object (whitespace around it
// allowed), is not valid JSON, or fn stopped. It allocates nothing; built
// on jsonscan.Members, the one member loop.
func EachMember(raw []byte, fn func(key, value []byte) bool) bool {
	i := jsonscan.SkipSpace(raw, 0)
	end := jsonscan.Members(raw, i, 0, func(ks, ke, vs int) int {
		ve := jsonscan.ScanValue(raw, vs, 1)
		if ve < 0 || !fn(raw[ks+1:ke-1], raw[vs:ve]) {
			return -1
		}
		return ve
	})
	return end >= 0 && jsonscan.SkipSpace(raw, end) == len(raw)
}

// EachElement is EachMember for the elements of the JSON array raw.
func EachElement(raw []byte, fn func(value []byte) bool) bool {
	i := jsonscan.SkipSpace(raw, 0)
	end := jsonscan.Elements(raw, i, 0, func(vs int) int {
		ve := jsonscan.ScanValue(raw, vs, 1)
		if ve < 0 || !fn(raw[vs:ve]) {
			return -1
		}
		return ve
	})
	return end >= 0 && jsonscan.SkipSpace(raw, end) == len(raw)
}

// MayHoldString reports whether the valid JSON text raw may hold a string
// (a member name or a value, at any depth) whose decoded value is s,
// without scanning raw: a policy that needs one member or element of a
// long value asks this before parsing it. It is false only when that is
// certain: s is non-empty printable ASCII without a quote or a backslash
// (JSON spells it as its own bytes), raw holds no backslash (so every
// string in it decodes to its own bytes, or, for invalid UTF-8, to one
// holding U+FFFD, which s cannot), and raw nowhere spells s between
// quotes. One pass over raw for the backslash, one for s.
func MayHoldString(raw []byte, s string) bool {
	if s == "" {
		return true
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' {
			return true
		}
	}
	if bytes.IndexByte(raw, '\\') >= 0 {
		return true
	}
	// The quoted s; one longer than the array moves it to the heap.
	var buf [72]byte
	return bytes.Contains(raw, append(append(append(buf[:0], '"'), s...), '"'))
}
