package jobqueue

import (
	"context"
	"fmt"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/jsonedit"
)

// Mutate is Kueue's JobWebhook.Default (job_webhook.go:107-121 at v0.13.0)
// on CREATE:
//
//  1. ApplyDefaultLocalQueue (jobframework/defaults.go:81-97): with
//     LocalQueueDefaulting, a job whose queue name (label, else the
//     deprecated annotation) is empty, in a namespace holding a LocalQueue
//     named "default", and whose controller owner is not of a configured
//     framework's kind, gets label queue-name "default". Then kadmit's
//     defaultQueues, when configured, fill a queue the same way.
//  2. ApplyDefaultForSuspend (defaults.go:37-79): a job not managed through
//     its owner is suspended when it names a queue, or, with
//     manageJobsWithoutQueueName, when its namespace matches
//     managedJobsNamespaceSelector.
//  3. kadmit's managedLabel: kueue.x-k8s.io/managed: "true" on a job that
//     names a queue.
//
// Each change is one JSONPatch operation on the job as sent (the rest of
// it, numbers included, is never re-encoded); it returns none when nothing
// changes, so a second call adds nothing. A namespace that
// manageJobsWithoutQueueName must read and the cache does not hold is
// answered 404 as Kueue's client Get would be.
func (p *Policy) Mutate(_ context.Context, req *admission.Request) ([]jsonedit.Op, admission.Verdict) {
	if req.Operation != admissionv1.Create {
		return nil, admission.Allow()
	}
	doc := req.ObjectDoc()
	var meta struct {
		Namespace       string                  `json:"namespace"`
		Labels          map[string]string       `json:"labels"`
		Annotations     map[string]string       `json:"annotations"`
		OwnerReferences []metav1.OwnerReference `json:"ownerReferences"`
	}
	var suspended *bool
	if _, err := doc.Decode(&meta, "metadata"); err != nil {
		return nil, admission.Invalid("%s: cannot parse the job: %v", Name, err)
	}
	if _, err := doc.Decode(&suspended, "spec", "suspend"); err != nil {
		return nil, admission.Invalid("%s: cannot parse the job: %v", Name, err)
	}
	ns := meta.Namespace
	if ns == "" {
		ns = req.Namespace
	}
	j := &jobView{}
	j.Labels, j.Annotations = meta.Labels, meta.Annotations
	ownerManaged := p.ownerManaged(meta.OwnerReferences)

	var warnings []string
	var err error
	set := func(v any, path ...string) {
		if err == nil {
			err = doc.Set(v, path...)
		}
	}
	queue := j.queueName()
	if queue == "" && !ownerManaged {
		switch {
		case p.lqDefaulting && p.opts.LocalQueues != nil && p.opts.LocalQueues.HasLocalQueue(ns, DefaultLocalQueue):
			queue = DefaultLocalQueue
		case p.lqDefaulting && p.opts.LocalQueues == nil && p.opts.Offline:
			warnings = append(warnings, fmt.Sprintf("%s: LocalQueue %s/%s is not known offline (give --state): queue-name not defaulted", Name, ns, DefaultLocalQueue))
		}
		if queue == "" {
			queue = p.cfg.DefaultQueues[ns]
		}
		if queue != "" {
			set(queue, "metadata", "labels", QueueLabel)
		}
	}
	if p.suspend && (suspended == nil || !*suspended) {
		should, warning, v := p.shouldSuspend(ns, queue, ownerManaged)
		if v != nil {
			return nil, *v
		}
		if warning != "" {
			warnings = append(warnings, warning)
		}
		if should {
			set(true, "spec", "suspend")
		}
	}
	if p.cfg.ManagedLabel && queue != "" && meta.Labels[ManagedLabel] != "true" {
		set("true", "metadata", "labels", ManagedLabel)
	}
	if err != nil {
		return nil, admission.Invalid("%s: cannot edit the job: %v", Name, err)
	}
	return doc.Ops(), admission.Allow(warnings...)
}

// shouldSuspend is jobframework.WorkloadShouldBeSuspended (defaults.go:50-79
// at v0.13.0) for a job whose ancestor walk kadmit answers with
// ownerManaged. Offline without namespaces, a selector reading more than
// the name label is decided on the name label alone, with a warning.
func (p *Policy) shouldSuspend(ns, queue string, ownerManaged bool) (bool, string, *admission.Verdict) {
	if ownerManaged {
		return false, "", nil
	}
	if queue != "" {
		return true, "", nil
	}
	if !p.cfg.ManageJobsWithoutQueueName {
		return false, "", nil
	}
	nsLabels := map[string]string{"kubernetes.io/metadata.name": ns}
	var warning string
	if p.opts.Namespaces != nil {
		l, ok := p.opts.Namespaces.NamespaceLabels(ns)
		if !ok {
			v := admission.Verdict{Code: http.StatusNotFound, Reason: metav1.StatusReasonNotFound,
				Message: fmt.Sprintf("failed to get namespace: namespaces %q not found", ns)}
			return false, "", &v
		}
		nsLabels = l
	} else if !p.nsSelectorNameOnly {
		warning = fmt.Sprintf("%s: the labels of namespace %s are not known offline (give --state): managedJobsNamespaceSelector matched on its name only", Name, ns)
	}
	return p.nsSelector.Matches(labels.Set(nsLabels)), warning, nil
}

// ownerManaged answers Kueue's two owner questions without reading the
// owner: jobframework.IsOwnerManagedByKueueForObject
// (integrationmanager.go:338-343 at v0.13.0: the controller owner is of an
// enabled framework's kind) and FindAncestorJobManagedByKueue
// (reconciler.go:727-779), which also reads the owner's queue name; kadmit
// takes an owner of a framework kind as managed (docs/policies.md,
// differences).
func (p *Policy) ownerManaged(refs []metav1.OwnerReference) bool {
	for _, r := range refs {
		if r.Controller == nil || !*r.Controller {
			continue
		}
		for _, o := range p.owners {
			if r.APIVersion == o.APIVersion && r.Kind == o.Kind {
				return true
			}
		}
		return false
	}
	return false
}
