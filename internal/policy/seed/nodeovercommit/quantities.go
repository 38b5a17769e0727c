package nodeovercommit

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/kadmit/kadmit/internal/jsonedit"
	"github.com/kadmit/kadmit/internal/quantity"
)

// maxListMembers bounds the members decodeList reads without reflection; a
// longer list (a node has a few dozen resources) goes through
// encoding/json, which has the same result at a higher cost.
const maxListMembers = 64

// decodeList is json.Unmarshal(raw, &l) for a quantity.List l, with the same
// result and the same errors (a *quantity.FieldError naming the first bad
// resource in name order), for raw that is valid JSON, as jsonedit.Doc.Get
// and admission.DecodeFields return it. It reads the object's members with
// jsonedit's scanner instead of reflection, and falls back to
// encoding/json for anything unusual (not an object, escaped keys, many
// members) so that unusual input gets encoding/json's own answer.
func decodeList(raw []byte) (quantity.List, error) {
	type member struct {
		name  corev1.ResourceName
		value []byte
	}
	var buf [16]member
	ms, ok := buf[:0], len(raw) > 0 && raw[0] == '{'
	i := jsonedit.SkipSpace(raw, 1)
	for ok && i < len(raw) && raw[i] != '}' {
		ke := jsonedit.ScanString(raw, i)
		if ke < 0 || bytes.IndexByte(raw[i:ke], '\\') >= 0 || len(ms) == maxListMembers {
			ok = false
			break
		}
		name := raw[i+1 : ke-1]
		vs := jsonedit.SkipSpace(raw, jsonedit.SkipSpace(raw, ke)+1)
		ve := jsonedit.ScanValue(raw, vs, 2)
		if ve < 0 {
			ok = false
			break
		}
		// A repeated name: the last one counts, as in a decoded map.
		at := slices.IndexFunc(ms, func(m member) bool { return string(m.name) == string(name) })
		if at >= 0 {
			ms[at].value = raw[vs:ve]
		} else {
			ms = append(ms, member{corev1.ResourceName(name), raw[vs:ve]})
		}
		if i = jsonedit.SkipSpace(raw, ve); i < len(raw) && raw[i] == ',' {
			i = jsonedit.SkipSpace(raw, i+1)
		}
	}
	if !ok {
		var l quantity.List
		if err := json.Unmarshal(raw, &l); err != nil {
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
