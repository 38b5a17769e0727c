package nodeovercommit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/jsonedit"
	"github.com/kadmit/kadmit/internal/policy/shared/rawallocatable"
	"github.com/kadmit/kadmit/internal/quantity"
)

// The policy states its change as JSONPatch operations.
var _ admission.Mutator = (*Policy)(nil)

// RawValues is the content of the kadmit.io/raw-allocatable annotation
// (package rawallocatable, which node-amplification reads too).
type RawValues = rawallocatable.Values

// rawQuantities is RawValues parsed.
type rawQuantities struct {
	allocatable, capacity map[corev1.ResourceName]resource.Quantity
}

// maxRawValues bounds the entries of the raw-values annotation: kadmit writes
// one per configured resource and field, and a node has a few dozen resources.
const maxRawValues = 256

// parseRawValues decodes the raw-values annotation with jsonedit.Unmarshal
// (member names matched case-sensitively, as every reader in kadmit and
// the API server match them); every quantity goes
// through quantity.Parse, so an out-of-range one is an error naming it
// ("allocatable.cpu: quantity 1e9999999 is out of range (...)") before any
// big-number arithmetic.
func parseRawValues(s string) (rawQuantities, error) {
	var v RawValues
	if err := jsonedit.Unmarshal([]byte(s), &v); err != nil {
		return rawQuantities{}, fmt.Errorf("decode %s: %w", AnnotationRaw, err)
	}
	out := rawQuantities{allocatable: map[corev1.ResourceName]resource.Quantity{}, capacity: map[corev1.ResourceName]resource.Quantity{}}
	if len(v.Allocatable)+len(v.Capacity) > maxRawValues {
		return rawQuantities{}, fmt.Errorf("decode %s: more than %d values", AnnotationRaw, maxRawValues)
	}
	for _, field := range []string{"allocatable", "capacity"} {
		m, dst := v.Allocatable, out.allocatable
		if field == "capacity" {
			m, dst = v.Capacity, out.capacity
		}
		for _, name := range slices.Sorted(maps.Keys(m)) {
			parsed, err := quantity.Parse(m[name])
			if err != nil {
				return rawQuantities{}, fmt.Errorf("decode %s: %w", AnnotationRaw, &quantity.FieldError{Field: field + "." + string(name), Err: err})
			}
			dst[name] = parsed
		}
	}
	return out, nil
}

func sameQuantities(a, b map[corev1.ResourceName]resource.Quantity) bool {
	return maps.EqualFunc(a, b, func(x, y resource.Quantity) bool { return x.Cmp(y) == 0 })
}

// Mutate amplifies status.allocatable and status.capacity of the configured
// resources with Amplify, using the node's kadmit.io/overcommit-ratio
// annotation for the resources it names and the configured ratios for the
// others (an override that ParseOverride refuses is ignored with a warning:
// the validating hook reports it, and refusing here would block kubelets;
// resources it names that are not configured are ignored).
//
// The amplification is always computed from raw values. For each configured
// resource present in both allocatable and capacity: when the
// kadmit.io/raw-allocatable annotation holds raw values for it and amplifying
// them yields exactly the incoming values, the incoming values are kept (the
// object was already amplified: a reinvocation, or a status write that did not
// come from the kubelet); otherwise the incoming values are new raw values from
// the kubelet and are amplified. The annotation is then rewritten to hold the
// raw values of the resources present (removed when there are none). An
// annotation that cannot be parsed counts as absent and draws a warning.
// Mutate returns no operations when nothing changes, which makes it
// idempotent.
//
// The operations touch only the raw-values annotation and the configured
// keys of status.allocatable and status.capacity: one "add" (or "remove")
// each; the rest of the node is neither decoded nor re-encoded. A body that
// is not a node JSON gets 400.
//
// Limitation: the check relies on the current ratio. If the ratio changes (in
// the configuration or the override annotation) and a status write that is not
// the kubelet's carries the previously amplified values, those are taken as
// raw and amplified again, until the kubelet's next status post (which carries
// real raw values) repairs the node.
func (p *Policy) Mutate(_ context.Context, req *admission.Request) ([]jsonedit.Op, admission.Verdict) {
	doc := req.ObjectDoc()
	pl, v := p.plan(doc)
	if pl == nil {
		return nil, v
	}
	var err error
	if pl.rewrite {
		path := []string{"metadata", "annotations", AnnotationRaw}
		if pl.newRaw == nil {
			err = doc.Remove(path...)
		} else {
			err = doc.Set(*pl.newRaw, path...)
		}
	}
	// A change exists only for a resource present in both maps, so both
	// are objects in the node and each quantity is set in place.
	for _, field := range []string{"allocatable", "capacity"} {
		for _, c := range pl.changes {
			q := c.allocatable
			if field == "capacity" {
				q = c.capacity
			}
			if err == nil {
				err = doc.Set(q.String(), "status", field, string(c.name))
			}
		}
	}
	if err != nil {
		return nil, admission.Invalid("%s: cannot edit the node: %v", Name, err)
	}
	return doc.Ops(), v
}

type change struct {
	name                  corev1.ResourceName
	capacity, allocatable resource.Quantity
}

// mutation is what Mutate changes on one node.
type mutation struct {
	rewrite  bool    // the raw-values annotation changes
	newRaw   *string // its new value; nil removes it
	changes  []change
	warnings []string
}

// plan decodes what Mutate reads and returns the change to make, or nil and
// the final verdict when nothing changes or the node is refused.
func (p *Policy) plan(doc *jsonedit.Doc) (*mutation, admission.Verdict) {
	var node nodeFields
	if _, err := doc.Decode(&node.annotations, "metadata", "annotations"); err != nil {
		return nil, admission.Invalid("%s: cannot parse the node: %v", Name, err)
	}
	for _, f := range []struct {
		l     *quantity.List
		field string
	}{{&node.capacity, "capacity"}, {&node.allocatable, "allocatable"}} {
		if err := decodeStatusList(doc, f.field, f.l); err != nil {
			return nil, admission.Invalid("%s: cannot parse the node: %v", Name, err)
		}
	}
	var warnings []string
	ratios := p.ratios
	annotations := node.annotations
	if v, ok := annotations[AnnotationRatio]; ok {
		override, err := p.ParseOverride(v)
		if err != nil {
			warnings = append(warnings, fmt.Sprintf("annotation %s ignored: %v", AnnotationRatio, err))
		} else {
			ratios = maps.Clone(p.ratios)
			for name, r := range override {
				if _, ok := ratios[name]; ok {
					ratios[name] = r
				}
			}
		}
	}

	rawText, hadRaw := annotations[AnnotationRaw]
	var recorded *rawQuantities
	if hadRaw {
		r, err := parseRawValues(rawText)
		var fe *quantity.FieldError
		switch {
		case err != nil && errors.As(err, &fe) && errors.Is(err, quantity.ErrOutOfRange):
			// Short enough for MaxWarningLength; the validating hook's
			// denial carries the value and the bound.
			warnings = append(warnings, fmt.Sprintf("annotation %s ignored: %s is out of range", AnnotationRaw, fe.Field))
		case err != nil:
			warnings = append(warnings, fmt.Sprintf("annotation %s is unreadable, recorded the incoming values as raw: %v", AnnotationRaw, err))
		default:
			recorded = &r
		}
	}

	raw := rawQuantities{allocatable: map[corev1.ResourceName]resource.Quantity{}, capacity: map[corev1.ResourceName]resource.Quantity{}}
	var changes []change
	for _, name := range p.resources {
		inAlloc, okA := node.allocatable[name]
		inCap, okC := node.capacity[name]
		if !okA || !okC {
			continue
		}
		ratio := ratios[name]
		if recorded != nil {
			rAlloc, okA := recorded.allocatable[name]
			rCap, okC := recorded.capacity[name]
			if okA && okC {
				c, a, err := Amplify(rCap, rAlloc, ratio, name)
				if err == nil && c.Cmp(inCap) == 0 && a.Cmp(inAlloc) == 0 {
					raw.allocatable[name], raw.capacity[name] = rAlloc, rCap
					continue
				}
			}
		}
		c, a, err := Amplify(inCap, inAlloc, ratio, name)
		if err == nil {
			// Inputs below the bound times a ratio of at most 10^12 can
			// still leave the int64 milli-unit range.
			if err = quantity.Check(c); err == nil {
				err = quantity.Check(a)
			}
			if err != nil {
				err = fmt.Errorf("amplified: %w", err)
			}
		}
		if err != nil {
			// Ratios are validated when loaded; this is a bug, but not
			// one worth blocking a kubelet for.
			warnings = append(warnings, fmt.Sprintf("%s left as is: %v", name, err))
			continue
		}
		raw.allocatable[name], raw.capacity[name] = inAlloc, inCap
		if c.Cmp(inCap) != 0 || a.Cmp(inAlloc) != 0 {
			changes = append(changes, change{name: name, capacity: c, allocatable: a})
		}
	}

	var newRaw *string // nil: remove the annotation
	if len(raw.allocatable) > 0 {
		s, err := encodeRawValues(raw)
		if err != nil {
			return nil, admission.Errored(0, fmt.Errorf("%s: %w", Name, err)).WithWarnings(warnings...)
		}
		newRaw = &s
	}
	rewrite := false
	switch {
	case newRaw == nil:
		rewrite = hadRaw
	case recorded == nil:
		rewrite = true
	default:
		rewrite = !sameQuantities(recorded.allocatable, raw.allocatable) || !sameQuantities(recorded.capacity, raw.capacity)
	}
	if len(changes) == 0 && !rewrite {
		return nil, admission.Allow(warnings...)
	}
	return &mutation{rewrite: rewrite, newRaw: newRaw, changes: changes, warnings: warnings}, admission.Allow(warnings...)
}

// nodeFields is the part of a node Mutate reads. Status quantities decode
// through quantity.List, so an out-of-range or malformed one is a 400 naming
// the field ("status.allocatable.cpu: quantity 1e9999999 is out of range
// (...)") before any big-number arithmetic, as a wrongly typed field always
// was; decoding only these fields skips the node's images, conditions and the
// rest.
type nodeFields struct {
	annotations           map[string]string
	capacity, allocatable quantity.List
}

// encodeRawValues renders r as json.Marshal renders RawValues (keys sorted,
// HTML-escaped), by hand when no name or value needs escaping.
func encodeRawValues(r rawQuantities) (string, error) {
	if s, ok := appendRawValues(r); ok {
		return s, nil
	}
	v := RawValues{Allocatable: map[corev1.ResourceName]string{}, Capacity: map[corev1.ResourceName]string{}}
	for name, q := range r.allocatable {
		v.Allocatable[name] = q.String()
	}
	for name, q := range r.capacity {
		v.Capacity[name] = q.String()
	}
	b, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("encode %s: %w", AnnotationRaw, err)
	}
	return string(b), nil
}

// decodeStatusList decodes status.<field> into l as doc.Decode would (l
// untouched when missing or null), through decodeList; a bad quantity's error
// names it from the root ("status.allocatable.cpu: ...").
func decodeStatusList(doc *jsonedit.Doc, field string, l *quantity.List) error {
	raw, err := doc.Get("status", field)
	if err != nil || raw == nil || raw[0] == 'n' {
		return err
	}
	v, err := decodeList(raw)
	if err != nil {
		var fe *quantity.FieldError
		if errors.As(err, &fe) {
			return quantity.Prefix("status."+field, fe)
		}
		return fmt.Errorf("/status/%s: %w", field, err)
	}
	*l = v
	return nil
}

// appendRawValues is encodeRawValues without encoding/json; ok is false when
// a string needs escaping (then encoding/json decides how).
func appendRawValues(r rawQuantities) (string, bool) {
	b := make([]byte, 0, 128)
	for i, f := range []struct {
		name string
		m    map[corev1.ResourceName]resource.Quantity
	}{{"allocatable", r.allocatable}, {"capacity", r.capacity}} {
		if i > 0 {
			b = append(b, ',')
		} else {
			b = append(b, '{')
		}
		b = append(append(append(b, '"'), f.name...), `":{`...)
		for j, name := range slices.Sorted(maps.Keys(f.m)) {
			q := f.m[name]
			v := q.String()
			if !plainJSON(string(name)) || !plainJSON(v) {
				return "", false
			}
			if j > 0 {
				b = append(b, ',')
			}
			b = append(append(append(append(append(b, '"'), name...), `":"`...), v...), '"')
		}
		b = append(b, '}')
	}
	return string(append(b, '}')), true
}

// plainJSON reports whether s is printable ASCII that encoding/json writes
// as it is (no quote, backslash or HTML character).
func plainJSON(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

// BoundedReview marks the policy admission.Bounded, so its hooks run on
// the request's goroutine: it reads the node it is given and nothing else.
func (*Policy) BoundedReview() {}
