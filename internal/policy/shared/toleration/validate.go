package toleration

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Validate applies the core API's toleration rules (what the API server
// checks on a pod's tolerations: k8s.io/kubernetes
// pkg/apis/core/validation/validation.go ValidateTolerations, one at a time)
// and returns "<field>: <problem>", e.g. `operator: must be Equal or
// Exists, got "In"`. The colocation policy checks the tolerations of its
// profiles with it, so that a profile cannot make every pod it matches
// invalid.
func Validate(t corev1.Toleration) error {
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
