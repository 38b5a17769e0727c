package jobqueue

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	batchv1 "k8s.io/api/batch/v1"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/policy/shared/podrequest"
)

// Field paths of Kueue's errors (job_webhook.go:45-49,
// jobframework/validation.go:44-49 at v0.13.0).
var (
	labelsPath           = field.NewPath("metadata", "labels")
	annotationsPath      = field.NewPath("metadata", "annotations")
	queueNameLabelPath   = labelsPath.Key(QueueLabel)
	maxExecTimePath      = labelsPath.Key(MaxExecTimeSecondsLabel)
	priorityClassPath    = labelsPath.Key(WorkloadPriorityClassLabel)
	prebuiltPath         = labelsPath.Key(PrebuiltWorkloadLabel)
	minParallelismPath   = annotationsPath.Key(MinParallelismAnnotation)
	syncCompletionPath   = annotationsPath.Key(CompletionsEqualParallelismAnnotation)
	completionsPath      = field.NewPath("spec", "completions")
	parallelismPath      = field.NewPath("spec", "parallelism")
	immutableWhileActive = apivalidation.FieldImmutableErrorMsg + " while the job is not suspended"
)

// Validate is Kueue's JobWebhook.ValidateCreate / ValidateUpdate
// (job_webhook.go:128-229 at v0.13.0): every rule's field error is
// collected and a job with any is denied with 403 and the errors joined as
// apimachinery's ErrorList.ToAggregate formats them, as controller-runtime
// answers a CustomValidator's error. Then kadmit's additions, when
// configured: requireQueue (the queue is configured or a cached LocalQueue)
// and queue quotas (the job's total request fits), each 403; on UPDATE
// these are rechecked only when the queue, parallelism/completions or pod
// template changed, so a queue deleted later does not freeze its jobs.
func (p *Policy) Validate(_ context.Context, req *admission.Request) admission.Verdict {
	job, err := decodeJob(req.Object.Raw)
	if err != nil {
		return admission.Invalid("%s: cannot parse the job: %v", Name, err)
	}
	var old *jobView
	var errs field.ErrorList
	if req.Operation == admissionv1.Update && len(req.OldObject.Raw) > 0 {
		if old, err = decodeJob(req.OldObject.Raw); err != nil {
			return admission.Invalid("%s: cannot parse the old job: %v", Name, err)
		}
		if old.Namespace == "" {
			old.Namespace = req.Namespace
		}
		errs = p.validateUpdate(old, job)
	} else {
		errs = validateCreate(job)
	}
	if len(errs) > 0 {
		return admission.Deny("%s", errs.ToAggregate().Error())
	}
	return p.validateQueue(req, job, old)
}

// validateCreate is JobWebhook.validateCreate (job_webhook.go:139-152)
// without the TopologyAwareScheduling rules (an alpha gate, off in v0.13.0).
func validateCreate(j *jobView) field.ErrorList {
	errs := validateJobOnCreate(j)
	errs = append(errs, validatePartialAdmissionCreate(j)...)
	return append(errs, validateSyncCompletionCreate(j)...)
}

// validateUpdate is JobWebhook.validateUpdate (job_webhook.go:199-216).
func (p *Policy) validateUpdate(old, j *jobView) field.ErrorList {
	errs := validateJobOnCreate(j)
	if j.Annotations[MinParallelismAnnotation] != old.Annotations[MinParallelismAnnotation] {
		errs = append(errs, validatePartialAdmissionCreate(j)...)
	}
	errs = append(errs, validateSyncCompletionCreate(j)...)
	errs = append(errs, p.validateJobOnUpdate(old, j)...)
	return append(errs, validatePartialAdmissionUpdate(old, j)...)
}

// validateJobOnCreate is jobframework.ValidateJobOnCreate
// (validation.go:66-71): the queue-name label and the deprecated annotation
// are DNS-1123 subdomains (:116-121), so is the prebuilt-workload label
// (:82-94; batch/v1 Job supports prebuilt workloads), and
// max-exec-time-seconds is a positive integer (:163-175).
func validateJobOnCreate(j *jobView) field.ErrorList {
	errs := labelAsName(j.Labels, QueueLabel, labelsPath)
	errs = append(errs, labelAsName(j.Annotations, QueueAnnotation, annotationsPath)...)
	errs = append(errs, labelAsName(j.Labels, PrebuiltWorkloadLabel, labelsPath)...)
	return append(errs, validateMaxExecTime(j)...)
}

// labelAsName is ValidateLabelAsCRDName / ValidateAnnotationAsCRDName
// (validation.go:96-114).
func labelAsName(m map[string]string, key string, path *field.Path) field.ErrorList {
	value, ok := m[key]
	if !ok {
		return nil
	}
	if errs := validation.IsDNS1123Subdomain(value); len(errs) > 0 {
		return field.ErrorList{field.Invalid(path.Key(key), value, strings.Join(errs, ","))}
	}
	return nil
}

func validateMaxExecTime(j *jobView) field.ErrorList {
	s, ok := j.Labels[MaxExecTimeSecondsLabel]
	if !ok {
		return nil
	}
	v, err := strconv.Atoi(s)
	if err != nil {
		return field.ErrorList{field.Invalid(maxExecTimePath, s, err.Error())}
	}
	if v <= 0 {
		return field.ErrorList{field.Invalid(maxExecTimePath, v, "should be greater than 0")}
	}
	return nil
}

// validatePartialAdmissionCreate (job_webhook.go:154-165):
// job-min-parallelism is an integer in [1, podsCount-1]. The comparison is
// on int32, as Kueue's.
func validatePartialAdmissionCreate(j *jobView) field.ErrorList {
	s, ok := j.Annotations[MinParallelismAnnotation]
	if !ok {
		return nil
	}
	v, err := strconv.Atoi(s)
	if err != nil {
		return field.ErrorList{field.Invalid(minParallelismPath, s, err.Error())}
	}
	if int32(v) >= j.podsCount() || v <= 0 {
		return field.ErrorList{field.Invalid(minParallelismPath, v, fmt.Sprintf("should be between 0 and %d", j.podsCount()-1))}
	}
	return nil
}

// validateSyncCompletionCreate (job_webhook.go:167-184):
// job-completions-equal-parallelism is a bool; when true the job is
// Indexed and completions equal parallelism (both default 1).
func validateSyncCompletionCreate(j *jobView) field.ErrorList {
	s, ok := j.Annotations[CompletionsEqualParallelismAnnotation]
	if !ok {
		return nil
	}
	var errs field.ErrorList
	enabled, err := strconv.ParseBool(s)
	if err != nil {
		errs = append(errs, field.Invalid(syncCompletionPath, s, err.Error()))
	}
	if enabled {
		if j.Spec.CompletionMode == nil || *j.Spec.CompletionMode == batchv1.NonIndexedCompletion {
			errs = append(errs, field.Invalid(syncCompletionPath, s, "should not be enabled for NonIndexed jobs"))
		}
		completions := int32(1)
		if j.Spec.Completions != nil {
			completions = *j.Spec.Completions
		}
		if j.parallelism() != completions {
			errs = append(errs, field.Invalid(completionsPath, j.Spec.Completions,
				fmt.Sprintf("should be equal to parallelism when %s is annotation is true", CompletionsEqualParallelismAnnotation)))
		}
	}
	return errs
}

// validateJobOnUpdate is jobframework.ValidateJobOnUpdate
// (validation.go:74-80, 123-161, 177-182).
func (p *Policy) validateJobOnUpdate(old, j *jobView) field.ErrorList {
	var errs field.ErrorList
	// validateUpdateForQueueName (:123-135): the queue name (label, else
	// annotation) of the NEW object is immutable unless the new job is
	// suspended; with LocalQueueDefaulting it cannot be removed where the
	// old job's namespace holds a default LocalQueue.
	if !j.isSuspended() {
		errs = append(errs, apivalidation.ValidateImmutableField(j.queueName(), old.queueName(), queueNameLabelPath)...)
	}
	if p.lqDefaulting && j.queueName() == "" && old.queueName() != "" &&
		p.opts.LocalQueues != nil && p.opts.LocalQueues.HasLocalQueue(old.Namespace, DefaultLocalQueue) {
		errs = append(errs, field.Invalid(queueNameLabelPath, "", "queue-name must not be empty in namespace with default queue"))
	}
	// validateUpdateForPrebuiltWorkload (:137-148).
	if !j.isSuspended() {
		errs = append(errs, apivalidation.ValidateImmutableField(j.Labels[PrebuiltWorkloadLabel], old.Labels[PrebuiltWorkloadLabel], prebuiltPath)...)
	} else {
		errs = append(errs, labelAsName(j.Labels, PrebuiltWorkloadLabel, labelsPath)...)
	}
	// validateUpdateForMaxExecTime (:177-182).
	if !j.isSuspended() || !old.isSuspended() {
		errs = append(errs, apivalidation.ValidateImmutableField(j.Labels[MaxExecTimeSecondsLabel], old.Labels[MaxExecTimeSecondsLabel], maxExecTimePath)...)
	}
	// validateJobUpdateForWorkloadPriorityClassName (:150-161).
	if !j.isSuspended() || j.Labels[WorkloadPriorityClassLabel] == "" {
		errs = append(errs, apivalidation.ValidateImmutableField(j.Labels[WorkloadPriorityClassLabel], old.Labels[WorkloadPriorityClassLabel], priorityClassPath)...)
	}
	return errs
}

// validatePartialAdmissionUpdate (job_webhook.go:218-229): with
// job-min-parallelism on the old job, parallelism is fixed while the old
// job's spec.suspend is not true; the completions-equal-parallelism setting
// is fixed while the job stays running.
func validatePartialAdmissionUpdate(old, j *jobView) field.ErrorList {
	var errs field.ErrorList
	if _, ok := old.Annotations[MinParallelismAnnotation]; ok {
		if (old.Spec.Suspend == nil || !*old.Spec.Suspend) && old.parallelism() != j.parallelism() {
			errs = append(errs, field.Forbidden(parallelismPath, "cannot change when partial admission is enabled and the job is not suspended"))
		}
	}
	if old.isSuspended() == j.isSuspended() && !j.isSuspended() && syncCompletion(old) != syncCompletion(j) {
		errs = append(errs, field.Forbidden(syncCompletionPath, immutableWhileActive))
	}
	return errs
}

// syncCompletion is Job.syncCompletionWithParallelism
// (job_controller.go:360-367): the annotation parsed as a bool, false when
// malformed.
func syncCompletion(j *jobView) bool {
	b, err := strconv.ParseBool(j.Annotations[CompletionsEqualParallelismAnnotation])
	return err == nil && b
}

// validateQueue runs kadmit's additions, requireQueue and queue quotas,
// for a job that names a queue.
func (p *Policy) validateQueue(req *admission.Request, job, old *jobView) admission.Verdict {
	queue := job.queueName()
	if queue == "" || (!p.cfg.RequireQueue && len(p.cfg.Queues) == 0) {
		return admission.Allow()
	}
	ns := job.Namespace
	if ns == "" {
		ns = req.Namespace
	}
	if old != nil && old.queueName() == queue && old.podsCount() == job.podsCount() &&
		string(old.Spec.Template.Spec) == string(job.Spec.Template.Spec) {
		return admission.Allow()
	}
	cq := p.configured(ns, queue)
	if cq == nil {
		switch {
		case !p.cfg.RequireQueue:
			return admission.Allow()
		case p.opts.LocalQueues != nil && p.opts.LocalQueues.HasLocalQueue(ns, queue):
			return admission.Allow()
		case p.opts.LocalQueues == nil && p.opts.Offline:
			return admission.Allow(fmt.Sprintf("%s: queue %q is not configured; LocalQueues are not checked offline (give --state)", Name, queue))
		}
		return admission.Deny("queue %q does not exist in namespace %q: create the LocalQueue or name an existing queue in label %s", queue, ns, QueueLabel)
	}
	if len(cq.Quota) == 0 {
		return admission.Allow()
	}
	spec, err := job.podTemplate()
	if err != nil {
		return admission.Invalid("%s: %v", Name, err)
	}
	pods := max(job.podsCount(), 0)
	perPod := podrequest.Effective(spec)
	total := podrequest.Scale(perPod, int64(pods))
	for _, r := range slices.Sorted(maps.Keys(total)) {
		want := total[r]
		if want.IsZero() {
			continue
		}
		per := perPod[r]
		limit, ok := cq.Quota[r]
		if !ok {
			return admission.Deny("job requests %s %s (%d pods × %s) but queue %q has no quota for %s",
				r, want.String(), pods, per.String(), queue, r)
		}
		if want.Cmp(limit) > 0 {
			return admission.Deny("job requests %s %s (%d pods × %s), more than queue %q quota of %s",
				r, want.String(), pods, per.String(), queue, limit.String())
		}
	}
	return admission.Allow()
}

// configured returns the configured queue named name that serves ns: one of
// that namespace before one for every namespace.
func (p *Policy) configured(ns, name string) *Queue {
	var shared *Queue
	for i := range p.cfg.Queues {
		q := &p.cfg.Queues[i]
		if q.Name != name {
			continue
		}
		if q.Namespace == ns {
			return q
		}
		if q.Namespace == "" {
			shared = q
		}
	}
	return shared
}
