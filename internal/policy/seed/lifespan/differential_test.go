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

// TestMutateExistingTolerations: tolerations the pod has count as the
// typed comparison counts them (an empty operator is Equal; values are
// strings, so "05" is not day 5; the effect must be NoSchedule), through
// the fast reader and through the decoder it falls back to.
func TestMutateExistingTolerations(t *testing.T) {
	p, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	list := `{"key":"acme.com/lifespan-remaining","value":"05","effect":"NoSchedule"},` +
		`{"key":"acme.com/lifespan-remaining","operator":"","value":"6","effect":"NoSchedule"},` +
		`{"key":"acme.com/lifespan-remaining","operator":"Equal","value":"7","effect":"NoExecute"},` +
		`{"key":"acme.com/lifespan-remaining","operator":"Equal","value":"14","effect":"NoSchedule","tolerationSeconds":5},` +
		`{"key":"acme.com/lifespan-remaining","operator":"Equal","value":"2","effect":"NoSchedule"}`
	for name, extra := range map[string]string{"fast reader": "", "decoder": `,{"key":"x","value":"a\"b"}`} {
		for _, label := range []string{`"3"`, ``} {
			labels := ""
			if label != "" {
				labels = `,"labels":{"` + LabelRequested + `":` + label + `}`
			}
			pod := `{"metadata":{"name":"p"` + labels + `},"spec":{"tolerations":[` + list + extra +
				`,{"key":"acme.com/lifespan-remaining","operator":"Exists","effect":"NoSchedule"}]}}`
			t.Run(name+" "+label, func(t *testing.T) {
				ops, v := p.Mutate(context.Background(), podRequestRaw(pod))
				if !v.Allowed {
					t.Fatalf("denied: %+v", v)
				}
				policytest.Check(t, []byte(pod), ops, slow(t, p.cfg.Max))
				if label != "" && len(ops) != 12-2 { // 3..14 less 6 and 14
					t.Errorf("%d operations, want 10: %v", len(ops), ops)
				}
				if label == "" && len(ops) != 0 {
					t.Errorf("the Exists toleration is there: %v", ops)
				}
			})
		}
	}
}

func TestDay(t *testing.T) {
	for v, want := range map[string]int{"0": 0, "3": 3, "14": 14, "1000": 1000, "03": -1, "": -1, "-1": -1, "+1": -1, "15": -1, "10000": -1, "1a": -1} {
		got, ok := day([]byte(v), 14)
		if v == "1000" {
			got, ok = day([]byte(v), 1000)
		}
		if (want < 0) != !ok || (ok && got != want) {
			t.Errorf("day(%q) = %d, %v; want %d", v, got, ok, want)
		}
	}
}
