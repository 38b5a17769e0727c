package nodeovercommit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"

	"gomodules.xyz/jsonpatch/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/kadmit/kadmit/internal/admission"
)

// RawValues is the content of the kadmit.io/raw-allocatable annotation: the
// kubelet's own values of the amplified resources, as Quantity strings, e.g.
// {"allocatable":{"cpu":"3500m"},"capacity":{"cpu":"4"}}.
type RawValues struct {
	Allocatable map[corev1.ResourceName]string `json:"allocatable"`
	Capacity    map[corev1.ResourceName]string `json:"capacity"`
}

// rawQuantities is RawValues parsed.
type rawQuantities struct {
	allocatable, capacity map[corev1.ResourceName]resource.Quantity
}

func parseRawValues(s string) (rawQuantities, error) {
	var v RawValues
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		return rawQuantities{}, fmt.Errorf("decode %s: %w", AnnotationRaw, err)
	}
	out := rawQuantities{allocatable: map[corev1.ResourceName]resource.Quantity{}, capacity: map[corev1.ResourceName]resource.Quantity{}}
	for field, m := range map[string]map[corev1.ResourceName]string{"allocatable": v.Allocatable, "capacity": v.Capacity} {
		dst := out.allocatable
		if field == "capacity" {
			dst = out.capacity
		}
		for name, q := range m {
			parsed, err := resource.ParseQuantity(q)
			if err != nil {
				return rawQuantities{}, fmt.Errorf("decode %s: %s.%s: %w", AnnotationRaw, field, name, err)
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
// Mutate returns nil bytes when nothing changes, which makes it idempotent.
//
// The mutated JSON is produced by editing the generic object, touching only
// metadata.annotations and the configured status.allocatable and
// status.capacity keys, so the patch contains nothing else. A body that is not
// a node JSON gets 400.
//
// Limitation: the check relies on the current ratio. If the ratio changes (in
// the configuration or the override annotation) and a status write that is not
// the kubelet's carries the previously amplified values, those are taken as
// raw and amplified again, until the kubelet's next status post (which carries
// real raw values) repairs the node.
func (p *Policy) Mutate(_ context.Context, req *admission.Request) ([]byte, admission.Verdict) {
	pl, v := p.plan(req)
	if pl == nil {
		return nil, v
	}
	obj, err := decodeGeneric(req.Object.Raw)
	if err != nil {
		return nil, admission.Invalid("%s: cannot parse the node: %v", Name, err)
	}
	if pl.rewrite {
		annotations, err := childObject(obj, "metadata", "annotations")
		if err != nil {
			return nil, admission.Invalid("%s: cannot edit the node: %v", Name, err)
		}
		if pl.newRaw == nil {
			delete(annotations, AnnotationRaw)
		} else {
			annotations[AnnotationRaw] = *pl.newRaw
		}
	}
	for _, c := range pl.changes {
		for field, q := range map[string]resource.Quantity{"allocatable": c.allocatable, "capacity": c.capacity} {
			m, err := childObject(obj, "status", field)
			if err != nil {
				return nil, admission.Invalid("%s: cannot edit the node: %v", Name, err)
			}
			m[string(c.name)] = q.String()
		}
	}
	out, err := encodeGeneric(obj)
	if err != nil {
		return nil, admission.Errored(0, fmt.Errorf("%s: %w", Name, err)).WithWarnings(pl.warnings...)
	}
	return out, v
}

// MutatePatch is Mutate stated as a JSONPatch against req.Object.Raw, for
// when node-overcommit is the only mutator on its path: one operation for
// the raw-values annotation and one per amplified quantity, without decoding
// or re-encoding the rest of the node (its images, conditions...). It
// declines (ok false) when the node spells metadata, annotations, status,
// allocatable or capacity other than exactly so, or twice.
func (p *Policy) MutatePatch(_ context.Context, req *admission.Request) (_ []jsonpatch.Operation, _ admission.Verdict, ok bool) {
	pl, v := p.plan(req)
	if pl == nil {
		return nil, v, true
	}
	if !pl.canonical {
		return nil, admission.Verdict{}, false
	}
	var ops []jsonpatch.Operation
	if pl.rewrite {
		key := "/metadata/annotations/" + escapePointer(AnnotationRaw)
		switch {
		case pl.newRaw == nil: // rewrite without raw values means the annotation is there
			ops = append(ops, jsonpatch.Operation{Operation: "remove", Path: key})
		case pl.node.Metadata != nil && pl.node.Metadata.Annotations != nil:
			ops = append(ops, jsonpatch.Operation{Operation: "add", Path: key, Value: *pl.newRaw})
		case pl.node.Metadata != nil:
			ops = append(ops, jsonpatch.Operation{Operation: "add", Path: "/metadata/annotations", Value: map[string]any{AnnotationRaw: *pl.newRaw}})
		default:
			ops = append(ops, jsonpatch.Operation{Operation: "add", Path: "/metadata", Value: map[string]any{"annotations": map[string]any{AnnotationRaw: *pl.newRaw}}})
		}
	}
	// A change exists only for a resource present in both maps, so both
	// are objects in the node and each quantity is set in place.
	for _, c := range pl.changes {
		name := escapePointer(string(c.name))
		ops = append(ops,
			jsonpatch.Operation{Operation: "add", Path: "/status/allocatable/" + name, Value: c.allocatable.String()},
			jsonpatch.Operation{Operation: "add", Path: "/status/capacity/" + name, Value: c.capacity.String()})
	}
	return ops, v, true
}

// escapePointer escapes a key for a JSON pointer (RFC 6901): "~" as "~0",
// "/" as "~1".
func escapePointer(key string) string {
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(key)
}

type change struct {
	name                  corev1.ResourceName
	capacity, allocatable resource.Quantity
}

// mutation is what Mutate changes on one node.
type mutation struct {
	node      nodeFields
	canonical bool
	rewrite   bool    // the raw-values annotation changes
	newRaw    *string // its new value; nil removes it
	changes   []change
	warnings  []string
}

// plan decodes what Mutate reads and returns the change to make, or nil and
// the final verdict when nothing changes or the node is refused.
func (p *Policy) plan(req *admission.Request) (*mutation, admission.Verdict) {
	var node nodeFields
	canonical, err := admission.DecodeFields(req.Object.Raw, nodeFieldsKeep, &node)
	if err != nil {
		return nil, admission.Invalid("%s: cannot parse the node: %v", Name, err)
	}
	var warnings []string
	ratios := p.ratios
	annotations := node.annotations()
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
		if err != nil {
			warnings = append(warnings, fmt.Sprintf("annotation %s is unreadable, recorded the incoming values as raw: %v", AnnotationRaw, err))
		} else {
			recorded = &r
		}
	}

	raw := rawQuantities{allocatable: map[corev1.ResourceName]resource.Quantity{}, capacity: map[corev1.ResourceName]resource.Quantity{}}
	var changes []change
	for _, name := range p.resources {
		inAlloc, okA := node.Status.Allocatable[name]
		inCap, okC := node.Status.Capacity[name]
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
	return &mutation{node: node, canonical: canonical, rewrite: rewrite, newRaw: newRaw, changes: changes, warnings: warnings}, admission.Allow(warnings...)
}

// nodeFields is the part of a node Mutate reads, with corev1's types so that
// wrongly typed annotations or quantities are still a 400; decoding only it
// skips the node's images, conditions and the rest.
type nodeFields struct {
	// Metadata is nil when the node has none (or null).
	Metadata *struct {
		Annotations map[string]string `json:"annotations"`
	} `json:"metadata"`
	Status struct {
		Capacity    corev1.ResourceList `json:"capacity"`
		Allocatable corev1.ResourceList `json:"allocatable"`
	} `json:"status"`
}

func (n *nodeFields) annotations() map[string]string {
	if n.Metadata == nil {
		return nil
	}
	return n.Metadata.Annotations
}

var nodeFieldsKeep = admission.Keep{
	"metadata": {"annotations": nil},
	"status":   {"capacity": nil, "allocatable": nil},
}

func encodeRawValues(r rawQuantities) (string, error) {
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

// decodeGeneric decodes an object keeping numbers as written, so that
// re-encoding it leaves the fields the policy does not edit byte-for-byte
// equivalent.
func decodeGeneric(raw []byte) (map[string]any, error) {
	var obj map[string]any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&obj); err != nil {
		return nil, err
	}
	if obj == nil {
		return nil, errors.New("object is null")
	}
	return obj, nil
}

func encodeGeneric(obj map[string]any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(obj); err != nil {
		return nil, fmt.Errorf("encode node: %w", err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// childObject returns obj[path[0]][path[1]]..., creating missing or null
// objects on the way; it fails when a step holds something else.
func childObject(obj map[string]any, path ...string) (map[string]any, error) {
	cur := obj
	for i, key := range path {
		switch next := cur[key].(type) {
		case map[string]any:
			cur = next
		case nil:
			m := map[string]any{}
			cur[key] = m
			cur = m
		default:
			return nil, fmt.Errorf("%s is a %T, not an object", strings.Join(path[:i+1], "."), next)
		}
	}
	return cur, nil
}
