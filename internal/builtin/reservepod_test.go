package builtin

import (
	"context"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/policy"
)

// TestReservePodBanWithEachKoordinatorPodPolicy: Koordinator runs the
// reserve-pod annotation ban in its always-on pod validation
// (pkg/webhook/pod/validating/validating_handler.go, v1.8.0), so an install
// with any one Koordinator pod policy refuses the annotation as
// koord-manager does; allowReservePod is kadmit's switch, per policy.
func TestReservePodBanWithEachKoordinatorPodPolicy(t *testing.T) {
	const reason = `annotations.scheduling.koordinator.sh/reserve-pod: Forbidden: cannot set in annotations`
	for _, c := range []struct {
		name, policies string
		deny           bool
	}{
		{"colocation only", `colocation: {enabled: true}`, true},
		{"elastic-quota only", `elasticQuota: {enabled: true}`, true},
		{"reservation only", `reservation: {enabled: true}`, true},
		{"colocation, switched off", `colocation: {enabled: true, allowReservePod: true}`, false},
		{"elastic-quota, switched off", `elasticQuota: {enabled: true, allowReservePod: true}`, false},
		{"colocation switched off, elastic-quota not", "colocation: {enabled: true, allowReservePod: true}\n  elasticQuota: {enabled: true}", true},
		{"colocation without its pod validation", `colocation: {enabled: true, disableValidation: true}`, false},
		{"seed profile (no Koordinator policy)", `podName: {enabled: true}`, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := Config.Parse([]byte("apiVersion: kadmit.io/v1alpha1\nkind: Configuration\npolicies:\n  " + c.policies + "\n"))
			if err != nil {
				t.Fatal(err)
			}
			whs, err := Webhooks(cfg, policy.Env{})
			if err != nil {
				t.Fatal(err)
			}
			for _, op := range []admissionv1.Operation{admissionv1.Create, admissionv1.Update} {
				allowed, code, msg := true, int32(200), ""
				for _, wh := range whs {
					if wh.Path != "/validate-pod" {
						continue
					}
					raw := []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"ns","annotations":{"scheduling.koordinator.sh/reserve-pod":"true"}},"spec":{"containers":[{"name":"c","image":"i"}]}}`)
					r := &admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
						UID: "u", Operation: op, Namespace: "ns", Name: "p",
						Kind:     metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
						Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
						Object:   runtime.RawExtension{Raw: raw},
					}}
					if op == admissionv1.Update {
						r.OldObject = runtime.RawExtension{Raw: raw}
					}
					out, err := wh.Review(context.Background(), r)
					if err != nil {
						t.Fatal(err)
					}
					if !out.Response.Allowed {
						allowed, code, msg = false, out.Response.Result.Code, out.Response.Result.Message
					}
				}
				if c.deny && (allowed || code != 400 || msg != reason) {
					t.Errorf("%s: allowed=%v code=%d message=%q; want denied 400 %q", op, allowed, code, msg, reason)
				}
				if !c.deny && !allowed {
					t.Errorf("%s: denied %d %q; want allowed", op, code, msg)
				}
			}
		})
	}
}
