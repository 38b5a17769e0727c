// Package reservepod holds Koordinator's ban on the reserve-pod annotation
// (koordinator-sh/koordinator v1.8.0,
// pkg/webhook/pod/validating/verify_annotations.go:30-76): the scheduler
// marks its in-memory reserve pods with scheduling.koordinator.sh/reserve-pod,
// and no pod written through the API may carry it.
//
// Upstream runs the ban first in koord-manager's pod validating handler
// (pkg/webhook/pod/validating/validating_handler.go, clusterReservationValidatingPod
// before the colocation and quota checks), which is on whenever the
// PodValidatingWebhook feature gate is (default on), whether or not the
// Reservation feature is used. So in kadmit every Koordinator policy that
// has a /validate-pod hook (colocation, elastic-quota, reservation) runs it,
// each with its own allowReservePod switch (default false: upstream).
package reservepod

import (
	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/kadmit/kadmit/internal/admission"
)

// Annotation marks the scheduler's in-memory reserve pods
// (pkg/util/reservation/reservation.go:46); a user may not set it.
const Annotation = "scheduling.koordinator.sh/reserve-pod"

// Validate denies a pod CREATE or UPDATE (not a subresource) whose object
// carries Annotation, whatever its value, with upstream's field error and
// status 400 (validating_handler.go:139-145):
// `annotations.scheduling.koordinator.sh/reserve-pod: Forbidden: cannot set in annotations`.
// A pod whose annotations cannot be read is a 400 naming the problem. It
// reads only metadata.annotations[Annotation].
func Validate(req *admission.Request) admission.Verdict {
	if req.SubResource != "" || (req.Operation != admissionv1.Create && req.Operation != admissionv1.Update) {
		return admission.Allow()
	}
	raw, err := req.ObjectDoc().Get("metadata", "annotations", Annotation)
	if err != nil {
		return admission.Invalid("%v", err)
	}
	if raw != nil {
		errs := field.ErrorList{field.Forbidden(field.NewPath("annotations", Annotation), "cannot set in annotations")}
		return admission.Invalid("%s", errs.ToAggregate().Error())
	}
	return admission.Allow()
}
