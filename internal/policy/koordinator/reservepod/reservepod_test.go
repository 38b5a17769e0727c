package reservepod

import (
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kadmit/kadmit/internal/admission"
)

// TestValidate carries over TestClusterReservationValidatingPod
// (koordinator v1.8.0 pkg/webhook/pod/validating/verify_annotations_test.go:37-104),
// plus UPDATE, other annotations, subresources and a malformed object.
func TestValidate(t *testing.T) {
	const reason = `annotations.scheduling.koordinator.sh/reserve-pod: Forbidden: cannot set in annotations`
	for _, c := range []struct {
		name        string
		op          admissionv1.Operation
		subresource string
		pod         string
		code        int32 // 0: allowed
		message     string
	}{
		{"forbidden resources annotations", admissionv1.Create, "", `{"metadata":{"annotations":{"scheduling.koordinator.sh/reserve-pod":""}}}`, 400, reason},
		{"any value, on UPDATE", admissionv1.Update, "", `{"metadata":{"annotations":{"scheduling.koordinator.sh/reserve-pod":"true"}}}`, 400, reason},
		{"other annotations", admissionv1.Create, "", `{"metadata":{"annotations":{"scheduling.koordinator.sh/reservation-affinity":"{}"}}}`, 0, ""},
		{"no annotations", admissionv1.Create, "", `{"metadata":{"name":"p"}}`, 0, ""},
		{"DELETE is not checked", admissionv1.Delete, "", `{"metadata":{"annotations":{"scheduling.koordinator.sh/reserve-pod":""}}}`, 0, ""},
		{"a subresource is not checked", admissionv1.Update, "status", `{"metadata":{"annotations":{"scheduling.koordinator.sh/reserve-pod":""}}}`, 0, ""},
		{"annotations not an object", admissionv1.Create, "", `{"metadata":{"annotations":[]}}`, 400, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			v := Validate(&admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
				Operation: c.op, SubResource: c.subresource, Object: runtime.RawExtension{Raw: []byte(c.pod)},
			}})
			if c.code == 0 {
				if !v.Allowed {
					t.Fatalf("denied: %+v", v)
				}
				return
			}
			if v.Allowed || v.Code != c.code || (c.message != "" && v.Message != c.message) {
				t.Fatalf("verdict %+v; want %d %q", v, c.code, c.message)
			}
		})
	}
}
