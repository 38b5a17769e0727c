// Package nodeamplification implements the node-amplification policy:
// Koordinator's node resource amplification (pkg/webhook/node/plugins/
// resourceamplification/resource_amplification.go, v1.8.0). A node whose
// node.koordinator.sh/resource-amplification-ratio annotation asks for it
// reports cpu and memory allocatable multiplied by the ratio; the kubelet's
// own values are kept in node.koordinator.sh/raw-allocatable.
//
// It sits next to kadmit's node-overcommit policy on /mutate-node-status
// and runs after it. A resource node-overcommit amplified on this node
// (named in its kadmit.io/raw-allocatable annotation) is left to it: the
// ratio annotation is ignored for that resource, with a warning, so no
// resource is ever amplified twice.
package nodeamplification

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/jsonedit"
	"github.com/kadmit/kadmit/internal/policy/shared/rawallocatable"
	"github.com/kadmit/kadmit/internal/quantity"
)

// Name is the policy's name (policies.nodeAmplification).
const Name = "node-amplification"

// Path is upstream's path (pkg/webhook/node/mutating/webhooks.go:27).
const Path = "/mutate-node-status"

// The annotations, from apis/extension/node_resource_amplification.go:30-34
// (v1.8.0).
const (
	// AnnotationRatio is a JSON object of resource name to a number, e.g.
	// {"cpu":1.5,"memory":1.2}; only cpu and memory above 1 amplify.
	AnnotationRatio = "node.koordinator.sh/resource-amplification-ratio"
	// AnnotationRawAllocatable is the un-amplified allocatable of cpu and
	// memory, a JSON resource list such as {"cpu":"4","memory":"8Gi"}.
	AnnotationRawAllocatable = "node.koordinator.sh/raw-allocatable"
)

// supported are the resources upstream amplifies, in its order
// (resource_amplification.go:33-39).
var supported = []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory}

// Config is the node-amplification policy's configuration: upstream's
// webhook has no settings (the ratio is per node, in its annotation).
type Config struct{}

// DefaultConfig is the empty configuration.
func DefaultConfig() Config { return Config{} }

// Validate has nothing to check.
func (Config) Validate() error { return nil }

// Policy is the node-amplification policy.
type Policy struct{}

// New builds the policy.
func New(Config) (*Policy, error) { return &Policy{}, nil }

var _ admission.Mutator = (*Policy)(nil)

// Hooks returns the mutating hook: nodes/status CREATE and UPDATE on
// /mutate-node-status, failurePolicy Ignore, as upstream registers it
// (pkg/webhook/node/mutating/webhooks.go:27). Upstream has no validating
// rule for the annotations: its /validate-node runs only the
// slo-controller-config conflict check (policy slo-config).
func (p *Policy) Hooks() []admission.Hook {
	return []admission.Hook{{
		Policy: Name, Path: Path, Type: admission.Mutating,
		Rules: []admissionregistrationv1.RuleWithOperations{{
			Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
			Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"nodes/status"}},
		}},
		FailurePolicy: admissionregistrationv1.Ignore,
		Mutator:       p,
	}}
}

// nodeFields is what Mutate reads of a node.
type nodeFields struct {
	annotations map[string]string
	allocatable quantity.List
}

func decodeNode(doc *jsonedit.Doc) (nodeFields, error) {
	var n nodeFields
	if _, err := doc.Decode(&n.annotations, "metadata", "annotations"); err != nil {
		return n, fmt.Errorf("metadata.annotations: %w", err)
	}
	if _, err := doc.Decode(&n.allocatable, "status", "allocatable"); err != nil {
		var fe *quantity.FieldError
		if errors.As(err, &fe) {
			return n, quantity.Prefix("status.allocatable", fe)
		}
		return n, fmt.Errorf("status.allocatable: %w", err)
	}
	return n, nil
}

// Mutate is upstream's Admit (resource_amplification.go:60-165) on a
// nodes/status UPDATE (CREATE changes nothing):
//
//  1. no ratio annotation, or an empty one: remove raw-allocatable;
//  2. no status.allocatable: nothing;
//  3. raw-allocatable absent, or cpu/memory allocatable differs from the
//     old object's (the kubelet posted new values): record the incoming
//     cpu and memory allocatable as raw-allocatable; otherwise read the
//     recorded raw values (unreadable: 500, as upstream);
//  4. for cpu and memory with a ratio above 1 and a raw value:
//     allocatable = raw × ratio, as upstream's util.MultiplyMilliQuant
//     (milli-value × ratio truncated to an integer, the raw value's
//     format); an unreadable ratio annotation is 500, as upstream.
//
// Differences: a resource node-overcommit amplified on this node is left
// out of steps 3 and 4 (a warning says so when the ratio names it); a
// product of 2^63 milli-units or more is left as is with a warning
// (upstream's float-to-int conversion overflows); quantities are parsed
// with internal/quantity's bounds (a 400 names one out of range).
func (p *Policy) Mutate(_ context.Context, req *admission.Request) ([]jsonedit.Op, admission.Verdict) {
	if req.Resource.Resource != "nodes" || req.SubResource != "status" || req.Operation != admissionv1.Update {
		return nil, admission.Allow()
	}
	doc := req.ObjectDoc()
	node, err := decodeNode(doc)
	if err != nil {
		return nil, admission.Invalid("%s: cannot parse the node: %v", Name, err)
	}
	if node.annotations[AnnotationRatio] == "" {
		if _, ok := node.annotations[AnnotationRawAllocatable]; ok {
			if err := doc.Remove("metadata", "annotations", AnnotationRawAllocatable); err != nil {
				return nil, admission.Invalid("%s: cannot edit the node: %v", Name, err)
			}
		}
		return doc.Ops(), admission.Allow()
	}
	if node.allocatable == nil {
		return nil, admission.Allow()
	}
	var warnings []string
	owned := overcommitted(node.annotations)
	resources := make([]corev1.ResourceName, 0, len(supported))
	for _, r := range supported {
		if !owned[r] {
			resources = append(resources, r)
		}
	}

	original := corev1.ResourceList{}
	_, hasRaw := node.annotations[AnnotationRawAllocatable]
	changed := false
	if hasRaw {
		old, err := decodeNode(jsonedit.NewDoc(req.OldObject.Raw))
		if err != nil {
			return nil, admission.Invalid("%s: cannot parse the old node: %v", Name, err)
		}
		changed = resourcesChanged(resources, old.allocatable, node.allocatable)
	}
	if !hasRaw || changed {
		for _, r := range resources {
			if q, ok := node.allocatable[r]; ok {
				original[r] = q
			}
		}
		if len(original) > 0 {
			b, err := json.Marshal(original)
			if err != nil {
				return nil, admission.Errored(0, fmt.Errorf("%s: encode %s: %w", Name, AnnotationRawAllocatable, err))
			}
			if cur, ok := node.annotations[AnnotationRawAllocatable]; !ok || cur != string(b) {
				if err := doc.Set(string(b), "metadata", "annotations", AnnotationRawAllocatable); err != nil {
					return nil, admission.Invalid("%s: cannot edit the node: %v", Name, err)
				}
			}
		}
	} else {
		var raw quantity.List
		if err := json.Unmarshal([]byte(node.annotations[AnnotationRawAllocatable]), &raw); err != nil {
			return nil, admission.Errored(http500, fmt.Errorf("failed to unmarshal node raw allocatable: %w", err))
		}
		if raw == nil {
			// "null": upstream's GetNodeRawAllocatable returns nil, nil
			// and Admit returns without change (:126-130).
			return nil, admission.Allow()
		}
		for _, r := range resources {
			if q, ok := raw[r]; ok {
				original[r] = q
			}
		}
	}

	var ratios map[corev1.ResourceName]float64
	if err := json.Unmarshal([]byte(node.annotations[AnnotationRatio]), &ratios); err != nil {
		return nil, admission.Errored(http500, fmt.Errorf("failed to unmarshal node resource amplification ratio: %w", err))
	}
	for _, r := range supported {
		ratio, ok := ratios[r]
		if !ok || ratio <= 1 {
			continue
		}
		if owned[r] {
			warnings = append(warnings, fmt.Sprintf("%s: %s is amplified by node-overcommit; ratio ignored", AnnotationRatio, r))
			continue
		}
		orig, ok := original[r]
		if !ok {
			continue
		}
		amplified, ok := multiplyMilli(orig, ratio)
		if !ok {
			warnings = append(warnings, fmt.Sprintf("%s left as is: %s × %g is out of range", r, orig.String(), ratio))
			continue
		}
		cur := node.allocatable[r]
		if amplified.String() == cur.String() {
			continue
		}
		if err := doc.Set(amplified.String(), "status", "allocatable", string(r)); err != nil {
			return nil, admission.Invalid("%s: cannot edit the node: %v", Name, err)
		}
	}
	return doc.Ops(), admission.Allow(warnings...)
}

const http500 = 500

// multiplyMilli is upstream's util.MultiplyMilliQuant (pkg/util/
// resource.go:49-54, v1.8.0): int64(float64(milli) × factor) milli-units in
// q's format; false when the product leaves the int64 range.
func multiplyMilli(q resource.Quantity, factor float64) (resource.Quantity, bool) {
	v := float64(q.MilliValue()) * factor
	if math.IsNaN(v) || v >= math.MaxInt64 || v <= math.MinInt64 {
		return resource.Quantity{}, false
	}
	out := resource.NewMilliQuantity(int64(v), q.Format)
	if quantity.Check(*out) != nil {
		return resource.Quantity{}, false
	}
	return *out, true
}

// resourcesChanged is upstream's isSupportedResourceChanged (:73-91): the
// numeric values of the resources differ between the old and new
// allocatable (one present and not the other counts as a change).
func resourcesChanged(resources []corev1.ResourceName, old, cur quantity.List) bool {
	for _, r := range resources {
		a, okA := old[r]
		b, okB := cur[r]
		if okA != okB || (okA && a.Cmp(b) != 0) {
			return true
		}
	}
	return false
}

// overcommitted returns the resources node-overcommit has amplified on the
// node, read from its raw-values annotation (the chain has already run
// node-overcommit on this request when both policies are enabled). An
// unreadable annotation names none: node-overcommit itself reports it.
func overcommitted(annotations map[string]string) map[corev1.ResourceName]bool {
	s, ok := annotations[rawallocatable.Annotation]
	if !ok || !strings.HasPrefix(strings.TrimSpace(s), "{") {
		return nil
	}
	var v rawallocatable.Values
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		return nil
	}
	out := map[corev1.ResourceName]bool{}
	for _, r := range supported {
		if _, ok := v.Allocatable[r]; ok {
			out[r] = true
		}
	}
	return out
}

// BoundedReview marks the policy admission.Bounded, so its hooks run on
// the request's goroutine: it reads the node it is given and nothing else.
func (*Policy) BoundedReview() {}
