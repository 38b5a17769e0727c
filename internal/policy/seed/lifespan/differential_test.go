package lifespan

import (
	"context"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/policy/policytest"
	"github.com/kadmit/kadmit/internal/testkit"
)

func podRequestRaw(raw string) *admission.Request {
	return testkit.PodRequest(admissionv1.Create, raw, "", testkit.Namespace("shop"))
}

// slow is lifespan's change made on a typed pod: the tolerations it lacks,
// appended. It is the oracle of the differential tests.
func slow(t testing.TB, maxDays int) func(*corev1.Pod) {
	return func(pod *corev1.Pod) {
		var requested *string
		if v, ok := pod.Labels[LabelRequested]; ok {
			requested = &v
		}
		want, err := Tolerations(requested, maxDays)
		if err != nil {
			t.Fatal(err)
		}
		for _, tol := range want {
			if !hasToleration(pod.Spec.Tolerations, tol) {
				pod.Spec.Tolerations = append(pod.Spec.Tolerations, tol)
			}
		}
	}
}

// TestMutateDifferential: on every pod of the corpus, Mutate's operations
// applied by the API server's library give the typed round trip's pod, and
// change nothing else.
func TestMutateDifferential(t *testing.T) {
	p, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	for name, pod := range policytest.Pods(t) {
		t.Run(name, func(t *testing.T) {
			ops, v := p.Mutate(context.Background(), podRequestRaw(pod))
			if !v.Allowed {
				t.Fatalf("denied: %+v", v)
			}
			policytest.Check(t, []byte(pod), ops, slow(t, p.cfg.Max))
		})
	}
}

// hasToleration reports whether have holds t, comparing the fields that decide
// what a toleration tolerates: key, operator, value and effect.
func hasToleration(have []corev1.Toleration, t corev1.Toleration) bool {
	for _, h := range have {
		op := h.Operator
		if op == "" {
			op = corev1.TolerationOpEqual
		}
		if h.Key == t.Key && op == t.Operator && h.Value == t.Value && h.Effect == t.Effect {
			return true
		}
	}
	return false
}
