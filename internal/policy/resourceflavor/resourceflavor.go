// Package resourceflavor implements the resource-flavor policy: defaulting
// and validation of Kueue ResourceFlavors (kueue.x-k8s.io/v1beta1
// resourceflavors), the node labels, taints and tolerations that describe a
// kind of node a ClusterQueue hands out. A flavor with a bad label or taint
// makes every workload using it unschedulable, so it is refused up front.
//
// Kueue's Go types are not imported (they pull in Kueue's whole controller
// tree); the object is decoded into a struct with the same field names.
package resourceflavor

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strconv"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/util/validation"

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

// Limits of Kueue's ResourceFlavor API (MaxProperties / MaxItems in its CRD).
const (
	MaxNodeLabels  = 8
	MaxNodeTaints  = 8
	MaxTolerations = 8
)

// ResourceInUseFinalizer is the finalizer Kueue's defaulting adds so that a
// flavor still referenced by a ClusterQueue is not deleted under it.
const ResourceInUseFinalizer = "kueue.x-k8s.io/resource-in-use"

// Config is the resource-flavor policy's configuration (policies.resourceFlavor).
type Config struct {
	// AddFinalizer makes the mutating hook add ResourceInUseFinalizer on
	// CREATE, as Kueue's webhook does. Default false: the finalizer is only
	// safe when Kueue's controller runs to remove it, else deleting the
	// flavor hangs.
	AddFinalizer bool `json:"addFinalizer,omitempty"`
}

// DefaultConfig is the seed profile: disabled, no finalizer.
func DefaultConfig() Config { return Config{} }

// Validate reports the first problem as "<field>: <problem>".
func (c Config) Validate() error {
	return nil
}

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

// Policy is the resource-flavor policy.
type Policy struct{ cfg Config }

// New validates cfg and builds the policy.
func New(cfg Config) (*Policy, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Policy{cfg: cfg}, nil
}

// Hooks returns the mutating hook (CREATE) and the validating hook (CREATE,
// UPDATE) for kueue.x-k8s.io/v1beta1 resourceflavors, failurePolicy Fail.
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

// Mutate defaults a new flavor: a toleration with a key and no operator
// gets operator Equal (the API's documented default, spelled out so that
// the immutability check compares like with like), and the resource-in-use
// finalizer is added when configured. Each is one JSONPatch operation on
// the flavor as sent; it returns none when nothing changes.
func (p *Policy) Mutate(_ context.Context, req *admission.Request) ([]jsonedit.Op, admission.Verdict) {
	doc := jsonedit.NewDoc(req.Object.Raw)
	var tols []corev1.Toleration
	var finalizers []string
	if _, err := doc.Decode(&tols, "spec", "tolerations"); err != nil {
		return nil, admission.Invalid("%s: cannot parse the ResourceFlavor: %v", Name, err)
	}
	if _, err := doc.Decode(&finalizers, "metadata", "finalizers"); err != nil {
		return nil, admission.Invalid("%s: cannot parse the ResourceFlavor: %v", Name, err)
	}
	var err error
	for i, t := range tols {
		if t.Operator == "" && t.Key != "" && err == nil {
			err = doc.Set(corev1.TolerationOpEqual, "spec", "tolerations", strconv.Itoa(i), "operator")
		}
	}
	if p.cfg.AddFinalizer && !slices.Contains(finalizers, ResourceInUseFinalizer) && err == nil {
		err = doc.Append([]string{"metadata", "finalizers"}, ResourceInUseFinalizer)
	}
	if err != nil {
		return nil, admission.Invalid("%s: cannot edit the ResourceFlavor: %v", Name, err)
	}
	return doc.Ops(), admission.Allow()
}

// Validate denies with 400 a flavor whose spec is malformed (ValidateSpec's
// message) and with 403 an UPDATE that changes the spec: Kueue caches
// flavors in admitted workloads' node selectors and taints, so a changed
// flavor would silently disagree with workloads already running on it.
func (p *Policy) Validate(_ context.Context, req *admission.Request) admission.Verdict {
	var f Flavor
	if err := json.Unmarshal(req.Object.Raw, &f); err != nil {
		return admission.Invalid("%s: cannot parse the ResourceFlavor: %v", Name, err)
	}
	if err := ValidateSpec(&f.Spec); err != nil {
		return admission.Invalid("ResourceFlavor %s: %v", f.Metadata.Name, err)
	}
	if req.Operation == admissionv1.Update && len(req.OldObject.Raw) > 0 {
		var old Flavor
		if err := json.Unmarshal(req.OldObject.Raw, &old); err != nil {
			return admission.Invalid("%s: cannot parse the old ResourceFlavor: %v", Name, err)
		}
		for _, d := range []struct {
			field string
			same  bool
		}{
			{"nodeLabels", equality.Semantic.DeepEqual(emptyMap(old.Spec.NodeLabels), emptyMap(f.Spec.NodeLabels))},
			{"nodeTaints", equality.Semantic.DeepEqual(emptySlice(old.Spec.NodeTaints), emptySlice(f.Spec.NodeTaints))},
			{"tolerations", equality.Semantic.DeepEqual(emptySlice(old.Spec.Tolerations), emptySlice(f.Spec.Tolerations))},
			{"topologyName", equality.Semantic.DeepEqual(old.Spec.TopologyName, f.Spec.TopologyName)},
		} {
			if !d.same {
				return admission.Deny("ResourceFlavor %s: spec.%s is immutable; create a new flavor instead", f.Metadata.Name, d.field)
			}
		}
	}
	return admission.Allow()
}

func emptyMap(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

func emptySlice[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// ValidateSpec returns the first problem of s as "spec.<field>: <problem>":
// at most 8 nodeLabels with qualified-name keys and valid label values; at
// most 8 nodeTaints, each with a qualified-name key, a label-value value, an
// effect NoSchedule, PreferNoSchedule or NoExecute, and no two with the same
// key and effect; at most 8 tolerations, each as the core API validates them
// (key syntax, operator Exists or Equal, Exists with an empty value, an
// empty key only with Exists, a known effect, tolerationSeconds only with
// NoExecute).
func ValidateSpec(s *Spec) error {
	if len(s.NodeLabels) > MaxNodeLabels {
		return fmt.Errorf("spec.nodeLabels: must have at most %d labels, has %d", MaxNodeLabels, len(s.NodeLabels))
	}
	keys := make([]string, 0, len(s.NodeLabels))
	for k := range s.NodeLabels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return fmt.Errorf("spec.nodeLabels: key %q: %s", k, errs[0])
		}
		if errs := validation.IsValidLabelValue(s.NodeLabels[k]); len(errs) > 0 {
			return fmt.Errorf("spec.nodeLabels[%s]: value %q: %s", k, s.NodeLabels[k], errs[0])
		}
	}
	if len(s.NodeTaints) > MaxNodeTaints {
		return fmt.Errorf("spec.nodeTaints: must have at most %d taints, has %d", MaxNodeTaints, len(s.NodeTaints))
	}
	seen := map[string]bool{}
	for i, t := range s.NodeTaints {
		path := fmt.Sprintf("spec.nodeTaints[%d]", i)
		if errs := validation.IsQualifiedName(t.Key); len(errs) > 0 {
			return fmt.Errorf("%s.key: %q: %s", path, t.Key, errs[0])
		}
		if errs := validation.IsValidLabelValue(t.Value); len(errs) > 0 {
			return fmt.Errorf("%s.value: %q: %s", path, t.Value, errs[0])
		}
		if !validEffect(t.Effect) || t.Effect == "" {
			return fmt.Errorf("%s.effect: must be NoSchedule, PreferNoSchedule or NoExecute, got %q", path, t.Effect)
		}
		if id := t.Key + ":" + string(t.Effect); seen[id] {
			return fmt.Errorf("%s: duplicate taint with key %q and effect %s", path, t.Key, t.Effect)
		}
		seen[t.Key+":"+string(t.Effect)] = true
	}
	if len(s.Tolerations) > MaxTolerations {
		return fmt.Errorf("spec.tolerations: must have at most %d tolerations, has %d", MaxTolerations, len(s.Tolerations))
	}
	for i, t := range s.Tolerations {
		if err := ValidateToleration(t); err != nil {
			return fmt.Errorf("spec.tolerations[%d].%w", i, err)
		}
	}
	return nil
}

// ValidateToleration applies the core API's toleration rules and returns
// "<field>: <problem>".
func ValidateToleration(t corev1.Toleration) error {
	if t.Key != "" {
		if errs := validation.IsQualifiedName(t.Key); len(errs) > 0 {
			return fmt.Errorf("key: %q: %s", t.Key, errs[0])
		}
	}
	switch t.Operator {
	case corev1.TolerationOpEqual, "":
		if t.Key == "" {
			return fmt.Errorf("operator: must be Exists when key is empty, got %q", t.Operator)
		}
		if errs := validation.IsValidLabelValue(t.Value); len(errs) > 0 {
			return fmt.Errorf("value: %q: %s", t.Value, errs[0])
		}
	case corev1.TolerationOpExists:
		if t.Value != "" {
			return fmt.Errorf("value: must be empty when operator is Exists, got %q", t.Value)
		}
	default:
		return fmt.Errorf("operator: must be Equal or Exists, got %q", t.Operator)
	}
	if !validEffect(t.Effect) {
		return fmt.Errorf("effect: must be empty, NoSchedule, PreferNoSchedule or NoExecute, got %q", t.Effect)
	}
	if t.TolerationSeconds != nil && t.Effect != corev1.TaintEffectNoExecute {
		return fmt.Errorf("tolerationSeconds: only allowed with effect NoExecute, effect is %q", t.Effect)
	}
	return nil
}

func validEffect(e corev1.TaintEffect) bool {
	switch e {
	case "", corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute:
		return true
	}
	return false
}
