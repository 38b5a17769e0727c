// Package resourceflavor implements the resource-flavor policy, kadmit's
// version of Kueue's ResourceFlavor webhook (kubernetes-sigs/kueue v0.13.0,
// pkg/webhooks/resourceflavor_webhook.go) for kueue.x-k8s.io/v1beta1
// resourceflavors: the defaulter adds the resource-in-use finalizer, the
// validator checks node labels, taints and toleration keys (403, field
// errors as Kueue returns them). The flavor CRD's own schema rules
// (apis/kueue/v1beta1/resourceflavor_types.go), which the API server
// applies before any webhook, are repeated and answered as the API server
// answers them (422), so that `kadmit review` catches them too.
//
// Kueue's Go types are not imported (they pull in Kueue's whole controller
// tree); the object is decoded into structs with the same field names.
package resourceflavor

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"slices"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metavalidation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	kjson "sigs.k8s.io/json"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/jsonedit"
)

// The policy states its change as JSONPatch operations.
var _ admission.Mutator = (*Policy)(nil)

// Name is the policy's name (policies.resourceFlavor in the configuration).
const Name = "resource-flavor"

// Paths of the hooks, as Kueue names them.
const (
	MutatePath   = "/mutate-kueue-x-k8s-io-v1beta1-resourceflavor"
	ValidatePath = "/validate-kueue-x-k8s-io-v1beta1-resourceflavor"
)

// Limits of Kueue's ResourceFlavor CRD (MaxProperties / MaxItems,
// resourceflavor_types.go:59,78,92 at v0.13.0).
const (
	MaxNodeLabels  = 8
	MaxNodeTaints  = 8
	MaxTolerations = 8
)

// ResourceInUseFinalizer is the finalizer Kueue's defaulting adds so that a
// flavor still referenced by a ClusterQueue is not deleted under it.
const ResourceInUseFinalizer = "kueue.x-k8s.io/resource-in-use"

// groupKind names the flavor in the API server's Invalid errors.
var groupKind = schema.GroupKind{Group: "kueue.x-k8s.io", Kind: "ResourceFlavor"}

// Config is the resource-flavor policy's configuration (policies.resourceFlavor).
type Config struct {
	// AddFinalizer: the mutating hook adds ResourceInUseFinalizer on
	// CREATE, as Kueue's defaulter does (resourceflavor_webhook.go:52-61).
	// Default true; false (a kadmit difference) is for clusters without
	// Kueue's controller, which alone removes the finalizer: there deleting
	// a flavor would hang.
	AddFinalizer *bool `json:"addFinalizer,omitempty"`
}

// DefaultConfig is Kueue v0.13.0's behaviour (the finalizer is added).
func DefaultConfig() Config { return Config{} }

// Validate reports the first problem as "<field>: <problem>".
func (c Config) Validate() error { return nil }

// Flavor is the part of a ResourceFlavor the policy reads.
type Flavor struct {
	Metadata struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec Spec `json:"spec"`
}

// Spec mirrors Kueue's ResourceFlavorSpec.
type Spec struct {
	NodeLabels   map[string]string   `json:"nodeLabels,omitempty"`
	NodeTaints   []corev1.Taint      `json:"nodeTaints,omitempty"`
	Tolerations  []corev1.Toleration `json:"tolerations,omitempty"`
	TopologyName *string             `json:"topologyName,omitempty"`
}

// present records which optional fields of each taint and toleration are
// present: the CRD's CEL rules test has(), which a decoded empty string
// cannot tell from an absent field.
type present struct {
	Spec struct {
		NodeLabels  map[string]string            `json:"nodeLabels"`
		NodeTaints  []map[string]json.RawMessage `json:"nodeTaints"`
		Tolerations []map[string]json.RawMessage `json:"tolerations"`
	} `json:"spec"`
}

// Policy is the resource-flavor policy.
type Policy struct{ addFinalizer bool }

// New validates cfg and builds the policy.
func New(cfg Config) (*Policy, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Policy{addFinalizer: cfg.AddFinalizer == nil || *cfg.AddFinalizer}, nil
}

// Hooks returns the mutating hook (CREATE) and the validating hook (CREATE,
// UPDATE) for kueue.x-k8s.io/v1beta1 resourceflavors, failurePolicy Fail,
// as Kueue registers them (resourceflavor_webhook.go:47,63).
func (p *Policy) Hooks() []admission.Hook {
	fp := admissionregistrationv1.Fail
	rule := func(ops ...admissionregistrationv1.OperationType) []admissionregistrationv1.RuleWithOperations {
		return []admissionregistrationv1.RuleWithOperations{{Operations: ops, Rule: admissionregistrationv1.Rule{
			APIGroups: []string{"kueue.x-k8s.io"}, APIVersions: []string{"v1beta1"}, Resources: []string{"resourceflavors"}}}}
	}
	return []admission.Hook{
		{Policy: Name, Path: MutatePath, Type: admission.Mutating, Rules: rule(admissionregistrationv1.Create),
			FailurePolicy: fp, Mutator: p},
		{Policy: Name, Path: ValidatePath, Type: admission.Validating, Rules: rule(admissionregistrationv1.Create, admissionregistrationv1.Update),
			FailurePolicy: fp, Validator: admission.ValidatorFunc(p.Validate)},
	}
}

// Mutate is Kueue's ResourceFlavorWebhook.Default
// (resourceflavor_webhook.go:52-61 at v0.13.0): the resource-in-use
// finalizer is appended unless present (or AddFinalizer is off). One
// JSONPatch operation on the flavor as sent; none when nothing changes.
func (p *Policy) Mutate(_ context.Context, req *admission.Request) ([]jsonedit.Op, admission.Verdict) {
	if !p.addFinalizer {
		return nil, admission.Allow()
	}
	doc := req.ObjectDoc()
	var finalizers []string
	if _, err := doc.Decode(&finalizers, "metadata", "finalizers"); err != nil {
		return nil, admission.Invalid("%s: cannot parse the ResourceFlavor: %v", Name, err)
	}
	if slices.Contains(finalizers, ResourceInUseFinalizer) {
		return nil, admission.Allow()
	}
	if err := doc.Append([]string{"metadata", "finalizers"}, ResourceInUseFinalizer); err != nil {
		return nil, admission.Invalid("%s: cannot edit the ResourceFlavor: %v", Name, err)
	}
	return doc.Ops(), admission.Allow()
}

// Validate first applies the CRD's schema rules (SchemaErrors), answering
// 422 Invalid as the API server does; then Kueue's ValidateCreate /
// ValidateUpdate (resourceflavor_webhook.go:68-97), which check the new
// flavor alone on both operations, answering 403 with the field errors as
// apimachinery's ErrorList.ToAggregate joins them. No spec field is
// immutable except as the CRD says: once topologyName is set.
func (p *Policy) Validate(_ context.Context, req *admission.Request) admission.Verdict {
	var f Flavor
	var pres present
	if err := json.Unmarshal(req.Object.Raw, &f); err != nil {
		return admission.Invalid("%s: cannot parse the ResourceFlavor: %v", Name, err)
	}
	if err := json.Unmarshal(req.Object.Raw, &pres); err != nil {
		return admission.Invalid("%s: cannot parse the ResourceFlavor: %v", Name, err)
	}
	var oldSpec []byte
	if req.Operation == admissionv1.Update && len(req.OldObject.Raw) > 0 {
		var raw struct {
			Spec json.RawMessage `json:"spec"`
		}
		if err := json.Unmarshal(req.OldObject.Raw, &raw); err != nil {
			return admission.Invalid("%s: cannot parse the old ResourceFlavor: %v", Name, err)
		}
		oldSpec = raw.Spec
		if len(oldSpec) == 0 {
			oldSpec = []byte("{}")
		}
	}
	if errs := SchemaErrors(&f.Spec, &pres, req.Object.Raw, oldSpec); len(errs) > 0 {
		st := apierrors.NewInvalid(groupKind, f.Metadata.Name, errs).Status()
		return admission.Verdict{Code: st.Code, Reason: st.Reason, Message: st.Message}
	}
	if errs := ValidateResourceFlavor(&f.Spec); len(errs) > 0 {
		return admission.Deny("%s", errs.ToAggregate().Error())
	}
	return admission.Allow()
}

// ValidateResourceFlavor is Kueue's ValidateResourceFlavor
// (resourceflavor_webhook.go:88-97 at v0.13.0): nodeLabels as metadata
// labels (ValidateLabels), nodeTaints (validateNodeTaints, :100-129: key a
// label name, value a label value, unique by key and effect), tolerations
// (validateTolerations, workload_webhook.go:212-222: a non-empty key is a
// label name).
func ValidateResourceFlavor(s *Spec) field.ErrorList {
	spec := field.NewPath("spec")
	errs := metavalidation.ValidateLabels(s.NodeLabels, spec.Child("nodeLabels"))
	errs = append(errs, validateNodeTaints(s.NodeTaints, spec.Child("nodeTaints"))...)
	for i, t := range s.Tolerations {
		if len(t.Key) > 0 {
			errs = append(errs, metavalidation.ValidateLabelName(t.Key, spec.Child("tolerations").Index(i).Child("key"))...)
		}
	}
	return errs
}

func validateNodeTaints(taints []corev1.Taint, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	unique := map[corev1.TaintEffect]sets.Set[string]{}
	for i, t := range taints {
		idx := path.Index(i)
		errs = append(errs, metavalidation.ValidateLabelName(t.Key, idx.Child("key"))...)
		if e := validation.IsValidLabelValue(t.Value); len(e) != 0 {
			errs = append(errs, field.Invalid(idx.Child("value"), t.Value, strings.Join(e, ";")))
		}
		if unique[t.Effect].Has(t.Key) {
			dup := field.Duplicate(idx, t)
			dup.Detail = "taints must be unique by key and effect pair"
			errs = append(errs, dup)
			continue
		}
		if unique[t.Effect] == nil {
			unique[t.Effect] = sets.New[string]()
		}
		unique[t.Effect].Insert(t.Key)
	}
	return errs
}

// Messages of the CRD's CEL rules (resourceflavor_types.go:44-45,79,93-97
// at v0.13.0).
const (
	msgTopologyLabels = "at least one nodeLabel is required when topology is set"
	msgTopologyFrozen = "resourceFlavorSpec are immutable when topologyName is set"
	msgEffect         = "supported taint effect values: 'NoSchedule', 'PreferNoSchedule', 'NoExecute'"
	msgEmptyKey       = "operator must be Exists when 'key' is empty, which means 'match all values and all keys'"
	msgSeconds        = "effect must be 'NoExecute' when 'tolerationSeconds' is set"
	msgOperator       = "supported toleration values: 'Equal'(default), 'Exists'"
	msgExistsValue    = "a value must be empty when 'operator' is 'Exists'"
)

// SchemaErrors applies the ResourceFlavor CRD's structural and CEL rules
// (resourceflavor_types.go:44-98 at v0.13.0): at most 8 nodeLabels, 8
// nodeTaints (key and effect required, effect NoSchedule,
// PreferNoSchedule or NoExecute) and 8 tolerations (an absent key needs
// operator Exists, tolerationSeconds needs effect NoExecute, operator Equal
// or Exists, Exists has no value, a known effect); topologyName needs a
// node label; and, on UPDATE (oldSpec non-nil), a spec whose old version
// has topologyName cannot change. Each CEL rule is reported once, on the
// list, as the API server reports it.
func SchemaErrors(s *Spec, pres *present, raw, oldSpec []byte) field.ErrorList {
	spec := field.NewPath("spec")
	var errs field.ErrorList
	if n := len(s.NodeLabels); n > MaxNodeLabels {
		errs = append(errs, field.TooMany(spec.Child("nodeLabels"), n, MaxNodeLabels))
	}
	taints := spec.Child("nodeTaints")
	if n := len(s.NodeTaints); n > MaxNodeTaints {
		errs = append(errs, field.TooMany(taints, n, MaxNodeTaints))
	}
	badEffect := false
	for i, t := range pres.Spec.NodeTaints {
		if _, ok := t["key"]; !ok {
			errs = append(errs, field.Required(taints.Index(i).Child("key"), ""))
		}
		if _, ok := t["effect"]; !ok {
			errs = append(errs, field.Required(taints.Index(i).Child("effect"), ""))
		} else if !knownEffect(s.NodeTaints[i].Effect) {
			badEffect = true
		}
	}
	if badEffect {
		errs = append(errs, field.Invalid(taints, "array", msgEffect))
	}
	tols := spec.Child("tolerations")
	if n := len(s.Tolerations); n > MaxTolerations {
		errs = append(errs, field.TooMany(tols, n, MaxTolerations))
	}
	var emptyKey, seconds, operator, existsValue, effect bool
	for i, t := range pres.Spec.Tolerations {
		tol := s.Tolerations[i]
		_, hasKey := t["key"]
		_, hasOp := t["operator"]
		_, hasValue := t["value"]
		_, hasEffect := t["effect"]
		_, hasSeconds := t["tolerationSeconds"]
		emptyKey = emptyKey || (!hasKey && tol.Operator != corev1.TolerationOpExists)
		seconds = seconds || (hasSeconds && tol.Effect != corev1.TaintEffectNoExecute)
		operator = operator || (hasOp && tol.Operator != corev1.TolerationOpEqual && tol.Operator != corev1.TolerationOpExists)
		existsValue = existsValue || (hasOp && tol.Operator == corev1.TolerationOpExists && hasValue)
		effect = effect || (hasEffect && !knownEffect(tol.Effect))
	}
	for _, r := range []struct {
		failed bool
		msg    string
	}{{emptyKey, msgEmptyKey}, {seconds, msgSeconds}, {operator, msgOperator}, {existsValue, msgExistsValue}, {effect, msgEffect}} {
		if r.failed {
			errs = append(errs, field.Invalid(tols, "array", r.msg))
		}
	}
	if s.TopologyName != nil && len(pres.Spec.NodeLabels) == 0 {
		errs = append(errs, field.Invalid(spec, "object", msgTopologyLabels))
	}
	if oldSpec != nil {
		var old struct {
			TopologyName *string `json:"topologyName"`
		}
		if err := json.Unmarshal(oldSpec, &old); err == nil && old.TopologyName != nil && !sameJSON(oldSpec, specOf(raw)) {
			errs = append(errs, field.Invalid(spec, "object", msgTopologyFrozen))
		}
	}
	return errs
}

func knownEffect(e corev1.TaintEffect) bool {
	return e == corev1.TaintEffectNoSchedule || e == corev1.TaintEffectPreferNoSchedule || e == corev1.TaintEffectNoExecute
}

func specOf(raw []byte) []byte {
	var o struct {
		Spec json.RawMessage `json:"spec"`
	}
	if json.Unmarshal(raw, &o) != nil || len(o.Spec) == 0 {
		return []byte("{}")
	}
	return o.Spec
}

// sameJSON is the CRD rule's self == oldSelf on spec (CEL equality as the
// API server evaluates it): key order and spacing do not matter, lists
// compare in order, and numbers compare by value exactly. The API server
// decodes integers as int64 (sigs.k8s.io/json's PreserveInts) and hands an
// "integer" field to CEL as an int (k8s.io/apiserver v0.37.1
// pkg/cel/common/valuesunstructured.go:185-196); the spec's one numeric
// field, tolerations[].tolerationSeconds, is an int64. So 2^53+1 and 2^53
// differ; decoding both into float64 would call them equal and admit an
// update the rule refuses. An int64 equals a float64 only when the float is
// that integer exactly.
func sameJSON(a, b []byte) bool {
	var va, vb any
	if kjson.UnmarshalCaseSensitivePreserveInts(a, &va) != nil || kjson.UnmarshalCaseSensitivePreserveInts(b, &vb) != nil {
		return bytes.Equal(a, b)
	}
	return celEqual(va, vb)
}

// celEqual compares two trees decoded by sigs.k8s.io/json (maps, slices,
// strings, bools, nil, int64, float64) as CEL's == does.
func celEqual(a, b any) bool {
	switch x := a.(type) {
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for k, v := range x {
			w, ok := y[k]
			if !ok || !celEqual(v, w) {
				return false
			}
		}
		return true
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !celEqual(x[i], y[i]) {
				return false
			}
		}
		return true
	case int64:
		switch y := b.(type) {
		case int64:
			return x == y
		case float64:
			return intEqualsFloat(x, y)
		}
		return false
	case float64:
		switch y := b.(type) {
		case float64:
			return x == y
		case int64:
			return intEqualsFloat(y, x)
		}
		return false
	default: // string, bool, nil
		return a == b
	}
}

// intEqualsFloat is exact: f must be integral, inside int64's range, and
// convert back to i without rounding (float64(i) alone rounds 2^53+1).
func intEqualsFloat(i int64, f float64) bool {
	if f != math.Trunc(f) || f < -(1<<63) || f >= 1<<63 {
		return false
	}
	return int64(f) == i
}

// BoundedReview marks the policy admission.Bounded, so its hooks run on
// the request's goroutine: it reads the object it is given and nothing else.
func (*Policy) BoundedReview() {}
