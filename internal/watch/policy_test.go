package watch

import (
	"strings"
	"testing"
	"time"

	"github.com/kadmit/kadmit/internal/testkit"

	"github.com/prometheus/client_golang/prometheus/testutil"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A ValidatingAdmissionPolicyBinding naming a policy that does not exist
// (KD901) is a kadmit_watch_policy_findings series and a Warning Event on
// the binding, like a webhook's finding.
func TestPolicyFindingsReported(t *testing.T) {
	b := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: "orphan-binding", UID: "uid-b"},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: "gone", ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}}}
	r := startController(t, nil, b)
	m := r.c.Metrics()
	testkit.Eventually(t, 10*time.Second, "KD901 series", func() bool {
		return testutil.ToFloat64(m.policyFindings.WithLabelValues("ValidatingAdmissionPolicyBinding", "orphan-binding", "KD901", "warning")) == 1
	})
	testkit.Eventually(t, 5*time.Second, "Warning KD901 on the binding", func() bool {
		return strings.Contains(strings.Join(peek(r), "\n"), "Warning KD901 ValidatingAdmissionPolicyBinding orphan-binding: ")
	})
	if n := seriesOf(t, m, "webhook="); n != 0 {
		t.Fatalf("%d per-webhook series with an empty webhook label", n)
	}
}
