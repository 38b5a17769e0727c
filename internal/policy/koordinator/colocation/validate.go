package colocation

import (
	"bytes"
	"context"
	"fmt"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/jsonedit"
	"github.com/kadmit/kadmit/internal/policy/koordinator/reservepod"
	"github.com/kadmit/kadmit/internal/policy/shared/podrequest"
)

// podMeta is what the validation reads of every pod.
type podMeta struct {
	labels   map[string]string
	priority *int32
}

// readMeta reads the labels and priority of the pod in doc and returns doc.
func readMeta(doc *jsonedit.Doc) (podMeta, *jsonedit.Doc, error) {
	var m podMeta
	if _, err := doc.Decode(&m.labels, "metadata", "labels"); err != nil {
		return m, nil, err
	}
	if _, err := doc.Decode(&m.priority, "spec", "priority"); err != nil {
		return m, nil, err
	}
	return m, doc, nil
}

// Validate runs, unless allowReservePod, Koordinator's reserve-pod
// annotation ban (package reservepod), which upstream's pod validation runs
// first, then clusterColocationProfileValidatingPod
// (pkg/webhook/pod/validating/cluster_colocation_profile.go:37-73), run on
// every pod CREATE and UPDATE whether or not a profile matched it. On
// UPDATE the QoS label, the priority class and (unless
// skipValidatingPriority) the koordinator.sh/priority label are immutable;
// always, batch resources need QoS BE, BE cannot go with no or the prod
// priority class, LSR not with none, mid, batch or free, and an LSR or LSE
// pod must request a whole number of CPUs. Errors are upstream's
// field.ErrorList, aggregated the same way, with status 400
// (validating_handler.go:139-145).
func (p *Policy) Validate(_ context.Context, req *admission.Request) admission.Verdict {
	if req.SubResource != "" || (req.Operation != admissionv1.Create && req.Operation != admissionv1.Update) {
		return admission.Allow()
	}
	if !p.cfg.AllowReservePod {
		if v := reservepod.Validate(req); !v.Allowed {
			return v
		}
	}
	newPod, doc, err := readMeta(req.ObjectDoc())
	if err != nil {
		return admission.Invalid("%v", err)
	}
	var errs field.ErrorList
	if req.Operation == admissionv1.Update {
		oldPod, _, err := readMeta(jsonedit.NewDoc(req.OldObject.Raw))
		if err != nil {
			return admission.Invalid("%v", err)
		}
		errs = append(errs, apivalidation.ValidateImmutableField(qosRaw(newPod.labels), qosRaw(oldPod.labels), field.NewPath("labels", LabelPodQoS))...)
		errs = append(errs, apivalidation.ValidateImmutableField(priorityRaw(newPod.labels, newPod.priority),
			priorityRaw(oldPod.labels, oldPod.priority), field.NewPath("spec.priority"))...)
		if !p.cfg.SkipValidatingPriority {
			errs = append(errs, apivalidation.ValidateImmutableField(newPod.labels[LabelPodPriority], oldPod.labels[LabelPodPriority],
				field.NewPath("labels", LabelPodPriority))...)
		}
	}
	qos, pc := qosRaw(newPod.labels), priorityRaw(newPod.labels, newPod.priority)
	var requests corev1.ResourceList
	needRequests := qos == QoSLSR || qos == QoSLSE
	if !needRequests && qos != QoSBE {
		// Only batch resources matter here: skip decoding the spec unless
		// its text can name one (a backslash could escape the name).
		spec, err := doc.Get("spec")
		if err != nil {
			return admission.Invalid("%v", err)
		}
		needRequests = bytes.Contains(spec, []byte("batch-")) || bytes.IndexByte(spec, '\\') >= 0
	}
	if needRequests {
		if requests, err = podRequests(doc); err != nil {
			return admission.Invalid("%v", err)
		}
	}
	// validateRequiredQoSClass (lines 75-88).
	if bc, bm := requests[BatchCPU], requests[BatchMemory]; (!bc.IsZero() || !bm.IsZero()) && qos != QoSBE {
		errs = append(errs, field.Required(field.NewPath("labels", LabelPodQoS), "must specify koordinator QoS BE with koordinator colocation resources"))
	}
	// forbidSpecialQoSClassAndPriorityClass (lines 62-63, 108-125).
	for _, f := range []struct {
		qos       QoSClass
		forbidden []PriorityClass
	}{
		{QoSBE, []PriorityClass{PriorityNone, PriorityProd}},
		{QoSLSR, []PriorityClass{PriorityNone, PriorityMid, PriorityBatch, PriorityFree}},
	} {
		if qos != f.qos {
			continue
		}
		for _, v := range f.forbidden {
			if pc == v {
				errs = append(errs, field.Forbidden(field.NewPath("Pod"),
					fmt.Sprintf("%s=%s and priorityClass=%s cannot be used in combination", LabelPodQoS, qos, pc)))
				break
			}
		}
	}
	// validateResources (lines 127-140).
	if qos == QoSLSR || qos == QoSLSE {
		cpu := requests[corev1.ResourceCPU]
		path := field.NewPath("pod.spec.containers[*].resources.requests")
		if cpu.IsZero() {
			errs = append(errs, field.Required(path, "LSR Pod must declare the requested CPUs"))
		} else if cpu.Value()*1000 != cpu.MilliValue() {
			errs = append(errs, field.Invalid(path, cpu.String(), "the requested CPUs of LSR Pod must be integer"))
		}
	}
	if err := errs.ToAggregate(); err != nil {
		return admission.Invalid("%s", err.Error())
	}
	return admission.Allow()
}

// podRequests is util.GetPodRequest (pkg/util/pod_resources_utils.go:49-55,
// component-helpers' PodRequests): requests only, no limit standing in.
func podRequests(doc *jsonedit.Doc) (corev1.ResourceList, error) {
	raw, err := doc.Get("spec")
	if err != nil {
		return nil, err
	}
	spec, err := podrequest.DecodeSpec(raw, "spec")
	if err != nil {
		return nil, err
	}
	for _, cs := range [][]corev1.Container{spec.InitContainers, spec.Containers} {
		for i := range cs {
			cs[i].Resources.Limits = nil
		}
	}
	return podrequest.Effective(spec), nil
}
