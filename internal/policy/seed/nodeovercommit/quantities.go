package nodeovercommit

import (
	"bytes"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/kadmit/kadmit/internal/jsonedit"
	"github.com/kadmit/kadmit/internal/quantity"
)

// maxListMembers bounds the members decodeList reads without reflection; a
// longer list (a node has a few dozen resources) goes through
// jsonedit.Unmarshal, which has the same result at a higher cost.
const maxListMembers = 64

// decodeList is jsonedit.Unmarshal(raw, &l) for a quantity.List l, with
// the same result and the same errors (a *quantity.FieldError naming the
// first bad resource in name order), for raw that is valid JSON, as
// jsonedit.Doc.Get returns it. It reads the object's members with
// jsonedit.EachMember instead of reflection, and falls back to
// jsonedit.Unmarshal for anything unusual (not an object, escaped keys,
// more than maxListMembers members) so that unusual input gets the
// decoder's own answer.
func decodeList(raw []byte) (quantity.List, error) {
	type member struct {
		name  corev1.ResourceName
		value []byte
	}
	var buf [16]member
	ms := buf[:0]
	ok := len(raw) > 0 && raw[0] == '{' && jsonedit.EachMember(raw, func(name, value []byte) bool {
		if bytes.IndexByte(name, '\\') >= 0 {
			return false
		}
		// A repeated name: the last one counts, as in a decoded map.
		if at := slices.IndexFunc(ms, func(m member) bool { return string(m.name) == string(name) }); at >= 0 {
			ms[at].value = value
			return true
		}
		if len(ms) == maxListMembers {
			return false
		}
		ms = append(ms, member{corev1.ResourceName(name), value})
		return true
	})
	if !ok {
		var l quantity.List
		if err := jsonedit.Unmarshal(raw, &l); err != nil {
			return nil, err
		}
		return l, nil
	}
	slices.SortFunc(ms, func(a, b member) int { return strings.Compare(string(a.name), string(b.name)) })
	out := make(quantity.List, len(ms))
	for _, m := range ms {
		q, err := parseQuantityJSON(m.value)
		if err != nil {
			return nil, &quantity.FieldError{Field: string(m.name), Err: err}
		}
		out[m.name] = q
	}
	return out, nil
}

// parseQuantityJSON is quantity.ParseJSON for a value the scanner
// delimited, without encoding/json for a string that has no escapes.
func parseQuantityJSON(raw []byte) (resource.Quantity, error) {
	if len(raw) >= 2 && raw[0] == '"' && len(raw) <= quantity.MaxLen+2 && bytes.IndexByte(raw, '\\') < 0 {
		return quantity.Parse(string(raw[1 : len(raw)-1]))
	}
	return quantity.ParseJSON(raw)
}
