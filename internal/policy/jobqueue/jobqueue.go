// Package jobqueue implements the job-queue policy, kadmit's version of
// Kueue's batch/v1 Job webhook: jobs in namespaces with a default queue are
// labelled with it and created suspended, so that they wait for the queue
// controller to admit them; jobs naming a queue are checked against the
// queues that exist and against the queue's quota.
package jobqueue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/jsonedit"
	"github.com/kadmit/kadmit/internal/policy/podrequest"
	"github.com/kadmit/kadmit/internal/quantity"
)

// The policy states its change as JSONPatch operations.
var _ admission.Mutator = (*Policy)(nil)

// Name is the policy's name (policies.jobQueue in the configuration,
// job-queue.kadmit.io in the registration).
const Name = "job-queue"

// Paths of the hooks, as Kueue names them.
const (
	MutatePath   = "/mutate-batch-v1-job"
	ValidatePath = "/validate-batch-v1-job"
)

// Labels Kueue reads on a job.
const (
	QueueLabel   = "kueue.x-k8s.io/queue-name"
	ManagedLabel = "kueue.x-k8s.io/managed"
)

// Config is the job-queue policy's configuration (policies.jobQueue).
type Config struct {
	// DefaultQueues maps a namespace to the queue its jobs get when they
	// name none, e.g. {team-a: main}. Jobs in other namespaces are only
	// mutated when they name a queue themselves.
	DefaultQueues map[string]string `json:"defaultQueues,omitempty"`
	// Suspend makes the mutating hook set spec.suspend: true on queued
	// jobs, so no pod starts before the queue controller admits the job.
	// Default true.
	Suspend *bool `json:"suspend,omitempty"`
	// Queues are the queues kadmit knows without asking the cluster, with
	// their optional quotas. A queue also exists when a Kueue LocalQueue of
	// that namespace and name is in the informer cache.
	Queues []Queue `json:"queues,omitempty"`
}

// Queue is one configured queue.
type Queue struct {
	// Name is the value jobs put in kueue.x-k8s.io/queue-name.
	Name string `json:"name"`
	// Namespace limits the queue to one namespace; empty: every namespace.
	Namespace string `json:"namespace,omitempty"`
	// Quota is the most one job of this queue may request in total
	// (parallelism × the pod's effective request), per resource, e.g.
	// {cpu: "8", memory: 32Gi}. A resource the quota does not list cannot
	// be requested. Empty: no quota check.
	// Quantities are parsed with internal/quantity (|value| below
	// 9223372036854775807m): an out-of-range one fails the configuration.
	Quota quantity.List `json:"quota,omitempty"`
}

// DefaultConfig is the seed profile: disabled, no default queues, suspend
// on, no configured queues.
func DefaultConfig() Config { return Config{} }

// Validate reports the first problem as "<field>: <problem>".
func (c Config) Validate() error {
	for _, ns := range sortedKeys(c.DefaultQueues) {
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			return fmt.Errorf("defaultQueues[%s]: namespace: %s", ns, errs[0])
		}
		if err := queueNameError(c.DefaultQueues[ns]); err != nil {
			return fmt.Errorf("defaultQueues[%s]: %w", ns, err)
		}
	}
	seen := map[string]bool{}
	for i, q := range c.Queues {
		if err := queueNameError(q.Name); err != nil {
			return fmt.Errorf("queues[%d].name: %w", i, err)
		}
		if q.Namespace != "" {
			if errs := validation.IsDNS1123Label(q.Namespace); len(errs) > 0 {
				return fmt.Errorf("queues[%d].namespace: %s", i, errs[0])
			}
		}
		key := q.Namespace + "/" + q.Name
		if seen[key] {
			return fmt.Errorf("queues[%d]: duplicate queue %q in namespace %q", i, q.Name, q.Namespace)
		}
		seen[key] = true
		for _, r := range sortedKeys(q.Quota) {
			if v := q.Quota[r]; v.Sign() < 0 {
				return fmt.Errorf("queues[%d].quota.%s: must be >= 0, got %s", i, r, v.String())
			}
		}
	}
	return nil
}

func queueNameError(name string) error {
	if name == "" {
		return errors.New("queue name must not be empty")
	}
	if errs := validation.IsValidLabelValue(name); len(errs) > 0 {
		return fmt.Errorf("queue name %q is not a valid label value: %s", name, errs[0])
	}
	return nil
}

// LocalQueues answers from an informer cache whether a Kueue LocalQueue
// (kueue.x-k8s.io/v1beta1 localqueues) exists. It must not call the API server.
type LocalQueues interface {
	HasLocalQueue(namespace, name string) bool
}

// Options are the policy's cluster inputs.
type Options struct {
	// LocalQueues is nil when the LocalQueue CRD is not served or kadmit
	// runs offline; then only configured queues exist.
	LocalQueues LocalQueues
	// Offline is set by `kadmit review`: a queue that is neither configured
	// nor checkable is then admitted with a warning instead of denied.
	Offline bool
}

// Policy is the job-queue policy.
type Policy struct {
	cfg     Config
	opts    Options
	suspend bool
}

// New validates cfg and builds the policy; the error is Config.Validate's.
func New(cfg Config, opts Options) (*Policy, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	suspend := true
	if cfg.Suspend != nil {
		suspend = *cfg.Suspend
	}
	return &Policy{cfg: cfg, opts: opts, suspend: suspend}, nil
}

// Hooks returns the mutating hook (jobs CREATE on /mutate-batch-v1-job) and
// the validating hook (jobs CREATE and UPDATE on /validate-batch-v1-job),
// both failurePolicy Fail unless configured: a job that skipped the
// mutation would start unsuspended, outside the queue.
func (p *Policy) Hooks() []admission.Hook {
	fp := admissionregistrationv1.Fail
	rule := func(ops ...admissionregistrationv1.OperationType) []admissionregistrationv1.RuleWithOperations {
		return []admissionregistrationv1.RuleWithOperations{{
			Operations: ops,
			Rule:       admissionregistrationv1.Rule{APIGroups: []string{"batch"}, APIVersions: []string{"v1"}, Resources: []string{"jobs"}},
		}}
	}
	return []admission.Hook{
		{Policy: Name, Path: MutatePath, Type: admission.Mutating, Rules: rule(admissionregistrationv1.Create),
			FailurePolicy: fp, Mutator: p},
		{Policy: Name, Path: ValidatePath, Type: admission.Validating, Rules: rule(admissionregistrationv1.Create, admissionregistrationv1.Update),
			FailurePolicy: fp, Validator: admission.ValidatorFunc(p.Validate)},
	}
}

// Mutate, on CREATE, gives a job without kueue.x-k8s.io/queue-name the
// default queue of its namespace; then every job that names a queue gets
// kueue.x-k8s.io/managed: "true" and, when Suspend is on, spec.suspend: true.
// Jobs in namespaces without a default that name no queue are not touched.
// Each change is one JSONPatch operation on the job as sent (the rest of it,
// numbers included, is never re-encoded); it returns none when nothing
// changes, so a second call adds nothing.
func (p *Policy) Mutate(_ context.Context, req *admission.Request) ([]jsonedit.Op, admission.Verdict) {
	if req.Operation != admissionv1.Create {
		return nil, admission.Allow()
	}
	doc := jsonedit.NewDoc(req.Object.Raw)
	var meta struct {
		Namespace string            `json:"namespace"`
		Labels    map[string]string `json:"labels"`
	}
	var suspended *bool
	if _, err := doc.Decode(&meta, "metadata"); err != nil {
		return nil, admission.Invalid("%s: cannot parse the job: %v", Name, err)
	}
	if _, err := doc.Decode(&suspended, "spec", "suspend"); err != nil {
		return nil, admission.Invalid("%s: cannot parse the job: %v", Name, err)
	}
	ns := req.Namespace
	if ns == "" {
		ns = meta.Namespace
	}
	var err error
	set := func(v any, path ...string) {
		if err == nil {
			err = doc.Set(v, path...)
		}
	}
	if _, ok := meta.Labels[QueueLabel]; !ok {
		def, ok := p.cfg.DefaultQueues[ns]
		if !ok {
			return nil, admission.Allow()
		}
		set(def, "metadata", "labels", QueueLabel)
	}
	if meta.Labels[ManagedLabel] != "true" {
		set("true", "metadata", "labels", ManagedLabel)
	}
	if p.suspend && (suspended == nil || !*suspended) {
		set(true, "spec", "suspend")
	}
	if err != nil {
		return nil, admission.Invalid("%s: cannot edit the job: %v", Name, err)
	}
	return doc.Ops(), admission.Allow()
}

// Validate checks a job that names a queue: the name is a non-empty valid
// label value (else 400); the queue exists, configured or as a LocalQueue
// (else 403); the job's total request fits the configured queue's quota per
// resource (else 403 naming the resource, the request and the quota); and on
// UPDATE the queue name only changes while the job is suspended, before and
// after the update (else 403). Jobs without a queue label are allowed.
// On UPDATE, existence and quota are checked only when the queue or the
// pod template and parallelism changed, so that a queue deleted later does not
// freeze its jobs' metadata.
func (p *Policy) Validate(_ context.Context, req *admission.Request) admission.Verdict {
	job, err := decodeJob(req.Object.Raw)
	if err != nil {
		return admission.Invalid("%s: cannot parse the job: %v", Name, err)
	}
	ns := req.Namespace
	if ns == "" {
		ns = job.Namespace
	}
	queue, queued := job.Labels[QueueLabel]
	var old *batchv1.Job
	if req.Operation == admissionv1.Update && len(req.OldObject.Raw) > 0 {
		if old, err = decodeJob(req.OldObject.Raw); err != nil {
			return admission.Invalid("%s: cannot parse the old job: %v", Name, err)
		}
		oldQueue, oldQueued := old.Labels[QueueLabel]
		if (oldQueue != queue || oldQueued != queued) && (!suspended(old) || !suspended(job)) {
			return admission.Deny("label %s cannot change from %q to %q while the job is not suspended; set spec.suspend: true first",
				QueueLabel, oldQueue, queue)
		}
	}
	if !queued {
		return admission.Allow()
	}
	if err := queueNameError(queue); err != nil {
		return admission.Invalid("label %s: %v", QueueLabel, err)
	}
	if old != nil && old.Labels[QueueLabel] == queue &&
		podCount(&old.Spec) == podCount(&job.Spec) && equalJSON(old.Spec.Template.Spec, job.Spec.Template.Spec) {
		return admission.Allow()
	}
	cq := p.configured(ns, queue)
	if cq == nil {
		switch {
		case p.opts.LocalQueues != nil && p.opts.LocalQueues.HasLocalQueue(ns, queue):
			return admission.Allow()
		case p.opts.LocalQueues == nil && p.opts.Offline:
			return admission.Allow(fmt.Sprintf("%s: queue %q is not configured; LocalQueues are not checked offline", Name, queue))
		}
		return admission.Deny("queue %q does not exist in namespace %q: create the LocalQueue or name an existing queue in label %s", queue, ns, QueueLabel)
	}
	if len(cq.Quota) == 0 {
		return admission.Allow()
	}
	pods := podCount(&job.Spec)
	perPod := podrequest.Effective(&job.Spec.Template.Spec)
	total := podrequest.Scale(perPod, int64(pods))
	for _, r := range sortedKeys(total) {
		want := total[r]
		if want.IsZero() {
			continue
		}
		limit, ok := cq.Quota[r]
		if !ok {
			return admission.Deny("job requests %s %s (%d pods × %s) but queue %q has no quota for %s",
				r, want.String(), pods, ptr(perPod[r]).String(), queue, r)
		}
		if want.Cmp(limit) > 0 {
			return admission.Deny("job requests %s %s (%d pods × %s), more than queue %q quota of %s",
				r, want.String(), pods, ptr(perPod[r]).String(), queue, limit.String())
		}
	}
	return admission.Allow()
}

func ptr[T any](v T) *T { return &v }

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

// podCount is how many pods of the job run at once: parallelism (default
// 1), but never more than completions, since the Job controller does not
// start more pods than it needs; Kueue counts the same.
func podCount(spec *batchv1.JobSpec) int32 {
	n := int32(1)
	if spec.Parallelism != nil {
		n = *spec.Parallelism
	}
	if spec.Completions != nil && *spec.Completions < n {
		n = *spec.Completions
	}
	return max(n, 0)
}

// decodeJob decodes what Validate reads of a job: metadata, parallelism,
// completions, suspend, and of the pod template only what
// podrequest.Effective reads, through podrequest.DecodeSpec, so an
// out-of-range request is refused naming its field
// ("spec.template.spec.containers[0].resources.requests.cpu: quantity ...")
// before any arithmetic, and no other quantity of the job is parsed.
func decodeJob(raw []byte) (*batchv1.Job, error) {
	var j struct {
		metav1.ObjectMeta `json:"metadata"`
		Spec              struct {
			Parallelism *int32 `json:"parallelism"`
			Completions *int32 `json:"completions"`
			Suspend     *bool  `json:"suspend"`
			Template    struct {
				Spec json.RawMessage `json:"spec"`
			} `json:"template"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(raw, &j); err != nil {
		return nil, err
	}
	spec, err := podrequest.DecodeSpec(j.Spec.Template.Spec, "spec.template.spec")
	if err != nil {
		return nil, err
	}
	job := &batchv1.Job{ObjectMeta: j.ObjectMeta}
	job.Spec.Parallelism, job.Spec.Completions, job.Spec.Suspend = j.Spec.Parallelism, j.Spec.Completions, j.Spec.Suspend
	job.Spec.Template.Spec = *spec
	return job, nil
}

func suspended(j *batchv1.Job) bool { return j.Spec.Suspend != nil && *j.Spec.Suspend }

func equalJSON(a, b corev1.PodSpec) bool {
	ja, err1 := json.Marshal(a)
	jb, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && string(ja) == string(jb)
}

func sortedKeys[K ~string, V any](m map[K]V) []K {
	keys := make([]K, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return strings.Compare(string(keys[i]), string(keys[j])) < 0 })
	return slices.Clip(keys)
}
