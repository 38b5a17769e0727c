package jobqueue

import (
	"encoding/json"
	"fmt"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kadmit/kadmit/internal/policy/shared/podrequest"
)

// jobView is what the policy reads of a job: metadata and the spec fields
// Kueue's Job webhook reads. The pod template is kept raw and decoded only
// by the quota check (podTemplate), so no quantity is parsed otherwise.
type jobView struct {
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Parallelism    *int32                  `json:"parallelism"`
		Completions    *int32                  `json:"completions"`
		CompletionMode *batchv1.CompletionMode `json:"completionMode"`
		Suspend        *bool                   `json:"suspend"`
		Template       struct {
			Spec json.RawMessage `json:"spec"`
		} `json:"template"`
	} `json:"spec"`
}

func decodeJob(raw []byte) (*jobView, error) {
	var j jobView
	if err := json.Unmarshal(raw, &j); err != nil {
		return nil, err
	}
	return &j, nil
}

// isSuspended is Kueue's Job.IsSuspended (job_controller.go:153-155 at
// v0.13.0): spec.suspend is true and the job is not being stopped.
func (j *jobView) isSuspended() bool {
	return j.Spec.Suspend != nil && *j.Spec.Suspend && j.Annotations[StoppingAnnotation] != "true"
}

// queueName is jobframework.QueueNameForObject (interface.go:179-185): the
// label, or the deprecated annotation when the label is empty.
func (j *jobView) queueName() string {
	if q := j.Labels[QueueLabel]; q != "" {
		return q
	}
	return j.Annotations[QueueAnnotation]
}

// parallelism is spec.parallelism, 1 when unset (the API server's default).
func (j *jobView) parallelism() int32 {
	if j.Spec.Parallelism == nil {
		return 1
	}
	return *j.Spec.Parallelism
}

// podsCount is Kueue's Job.podsCount (job_controller.go:342-349):
// parallelism, capped by completions.
func (j *jobView) podsCount() int32 {
	n := j.parallelism()
	if j.Spec.Completions != nil && *j.Spec.Completions < n {
		n = *j.Spec.Completions
	}
	return n
}

// podTemplate decodes the pod template's spec through podrequest.DecodeSpec,
// so an out-of-range request is refused naming its field
// ("spec.template.spec.containers[0].resources.requests.cpu: quantity ...")
// before any arithmetic.
func (j *jobView) podTemplate() (*corev1.PodSpec, error) {
	spec, err := podrequest.DecodeSpec(j.Spec.Template.Spec, "spec.template.spec")
	if err != nil {
		return nil, fmt.Errorf("cannot parse the job: %w", err)
	}
	return spec, nil
}
