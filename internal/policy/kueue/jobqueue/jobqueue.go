// Package jobqueue implements the job-queue policy, kadmit's version of
// Kueue's batch/v1 Job webhook (kubernetes-sigs/kueue v0.13.0,
// pkg/controller/jobs/job/job_webhook.go with
// pkg/controller/jobframework/{defaults,validation}.go).
//
// With its default configuration it behaves as Kueue v0.13.0 does with its
// own defaults (integrations.frameworks [batch/job],
// manageJobsWithoutQueueName false, the LocalQueueDefaulting gate on, the
// TopologyAwareScheduling, MultiKueueBatchJobWithManagedBy and
// ElasticJobsViaWorkloadSlices gates off): a job naming a queue is created
// suspended, a job in a namespace holding a LocalQueue named "default" gets
// that queue, and the validator answers 403 with the field errors Kueue
// returns. What kadmit adds (the managed label, a LocalQueue-existence
// check, per-queue quotas, configured default queues) is off unless
// configured; docs/policies.md lists each difference.
package jobqueue

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/kadmit/kadmit/internal/admission"
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

// Labels and annotations Kueue reads on a job (kueue v0.13.0
// pkg/controller/constants/constants.go:23-50,
// pkg/controller/jobs/job/job_controller.go:55-57).
const (
	QueueLabel = "kueue.x-k8s.io/queue-name"
	// QueueAnnotation is the deprecated annotation form of QueueLabel,
	// read when the label is empty.
	QueueAnnotation            = QueueLabel
	PrebuiltWorkloadLabel      = "kueue.x-k8s.io/prebuilt-workload-name"
	WorkloadPriorityClassLabel = "kueue.x-k8s.io/priority-class"
	MaxExecTimeSecondsLabel    = "kueue.x-k8s.io/max-exec-time-seconds"
	MinParallelismAnnotation   = "kueue.x-k8s.io/job-min-parallelism"
	// CompletionsEqualParallelismAnnotation asks Kueue to keep completions
	// equal to parallelism under partial admission.
	CompletionsEqualParallelismAnnotation = "kueue.x-k8s.io/job-completions-equal-parallelism"
	// StoppingAnnotation marks a job Kueue is suspending: while it is
	// "true" the job does not count as suspended.
	StoppingAnnotation = "kueue.x-k8s.io/stopping"
	// DefaultLocalQueue is the LocalQueue name LocalQueueDefaulting applies.
	DefaultLocalQueue = "default"
	// ManagedLabel is the label kadmit's managedLabel switch adds. Kueue
	// puts it on pods it manages, never on Jobs.
	ManagedLabel = "kueue.x-k8s.io/managed"
)

// Config is the job-queue policy's configuration (policies.jobQueue). The
// first group mirrors Kueue's own configuration and feature gates, with
// Kueue v0.13.0's defaults; the second group are kadmit's additions, each
// off by default.
type Config struct {
	// ManageJobsWithoutQueueName is Kueue's manageJobsWithoutQueueName:
	// jobs without a queue in a namespace matching
	// ManagedJobsNamespaceSelector are created suspended as well. Default
	// false.
	ManageJobsWithoutQueueName bool `json:"manageJobsWithoutQueueName,omitempty"`
	// ManagedJobsNamespaceSelector is Kueue's managedJobsNamespaceSelector.
	// Default: kubernetes.io/metadata.name NotIn [kube-system, kueue-system]
	// (Kueue's default with its namespace kueue-system).
	ManagedJobsNamespaceSelector *metav1.LabelSelector `json:"managedJobsNamespaceSelector,omitempty"`
	// LocalQueueDefaulting is Kueue's LocalQueueDefaulting feature gate
	// (beta, on in v0.13): a job without a queue in a namespace holding a
	// LocalQueue named "default" gets queue-name "default". Default true.
	LocalQueueDefaulting *bool `json:"localQueueDefaulting,omitempty"`
	// Frameworks is Kueue's integrations.frameworks: a job whose
	// controller owner is of one of these kinds is managed through its
	// owner. Default [batch/job]. Known names are those of
	// FrameworkOwners.
	Frameworks []string `json:"frameworks,omitempty"`
	// Suspend: jobs Kueue manages are created suspended. Default true, as
	// Kueue; false is a kadmit difference (jobs start at once).
	Suspend *bool `json:"suspend,omitempty"`

	// ManagedLabel (kadmit) adds kueue.x-k8s.io/managed: "true" to every
	// job that names a queue after defaulting. Default false.
	ManagedLabel bool `json:"managedLabel,omitempty"`
	// RequireQueue (kadmit) denies with 403 a job whose queue is neither a
	// configured queue nor a LocalQueue in the informer cache. Kueue checks
	// no LocalQueue at admission (the job waits for its queue). Default
	// false.
	RequireQueue bool `json:"requireQueue,omitempty"`
	// DefaultQueues (kadmit) maps a namespace to the queue its jobs get
	// when they name none and LocalQueueDefaulting gave none, e.g.
	// {team-a: main}. Default empty.
	DefaultQueues map[string]string `json:"defaultQueues,omitempty"`
	// Queues (kadmit) are queues kadmit knows without asking the cluster,
	// with optional quotas checked at admission. Default empty.
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

// FrameworkOwners maps the Kueue v0.13.0 integration names accepted in
// Frameworks to the owner apiVersion/kind they manage (each integration's
// JobType, pkg/controller/jobs/*).
var FrameworkOwners = map[string]metav1.TypeMeta{
	"batch/job":                                {APIVersion: "batch/v1", Kind: "Job"},
	"jobset.x-k8s.io/jobset":                   {APIVersion: "jobset.x-k8s.io/v1alpha2", Kind: "JobSet"},
	"kubeflow.org/mpijob":                      {APIVersion: "kubeflow.org/v2beta1", Kind: "MPIJob"},
	"kubeflow.org/paddlejob":                   {APIVersion: "kubeflow.org/v1", Kind: "PaddleJob"},
	"kubeflow.org/pytorchjob":                  {APIVersion: "kubeflow.org/v1", Kind: "PyTorchJob"},
	"kubeflow.org/tfjob":                       {APIVersion: "kubeflow.org/v1", Kind: "TFJob"},
	"kubeflow.org/xgboostjob":                  {APIVersion: "kubeflow.org/v1", Kind: "XGBoostJob"},
	"ray.io/rayjob":                            {APIVersion: "ray.io/v1", Kind: "RayJob"},
	"ray.io/raycluster":                        {APIVersion: "ray.io/v1", Kind: "RayCluster"},
	"workload.codeflare.dev/appwrapper":        {APIVersion: "workload.codeflare.dev/v1beta2", Kind: "AppWrapper"},
	"pod":                                      {APIVersion: "v1", Kind: "Pod"},
	"deployment":                               {APIVersion: "apps/v1", Kind: "Deployment"},
	"statefulset":                              {APIVersion: "apps/v1", Kind: "StatefulSet"},
	"leaderworkerset.x-k8s.io/leaderworkerset": {APIVersion: "leaderworkerset.x-k8s.io/v1", Kind: "LeaderWorkerSet"},
}

// DefaultConfig is Kueue v0.13.0's behaviour: every kadmit addition off.
func DefaultConfig() Config { return Config{} }

// defaultNamespaceSelector is Kueue's managedJobsNamespaceSelector default
// (apis/config/v1beta1/defaults.go:118-126 at v0.13.0, namespace
// kueue-system).
func defaultNamespaceSelector() *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
		Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"kube-system", "kueue-system"},
	}}}
}

// Validate reports the first problem as "<field>: <problem>".
func (c Config) Validate() error {
	if c.ManagedJobsNamespaceSelector != nil {
		if _, err := metav1.LabelSelectorAsSelector(c.ManagedJobsNamespaceSelector); err != nil {
			return fmt.Errorf("managedJobsNamespaceSelector: %w", err)
		}
	}
	for i, f := range c.Frameworks {
		if _, ok := FrameworkOwners[f]; !ok {
			return fmt.Errorf("frameworks[%d]: unknown Kueue integration %q (known: %s)", i, f, strings.Join(slices.Sorted(maps.Keys(FrameworkOwners)), ", "))
		}
	}
	for _, ns := range slices.Sorted(maps.Keys(c.DefaultQueues)) {
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
		for _, r := range slices.Sorted(maps.Keys(q.Quota)) {
			if v := q.Quota[r]; v.Sign() < 0 {
				return fmt.Errorf("queues[%d].quota.%s: must be >= 0, got %s", i, r, v.String())
			}
		}
	}
	return nil
}

// queueNameError applies Kueue's queue-name rule (a DNS-1123 subdomain,
// jobframework/validation.go:106-121 at v0.13.0) to a configured name.
func queueNameError(name string) error {
	if name == "" {
		return errors.New("queue name must not be empty")
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return fmt.Errorf("queue name %q: %s", name, strings.Join(errs, ","))
	}
	return nil
}

// LocalQueues answers from an informer cache whether a Kueue LocalQueue
// (kueue.x-k8s.io/v1beta1 localqueues) exists. It must not call the API server.
type LocalQueues interface {
	HasLocalQueue(namespace, name string) bool
}

// Namespaces returns a namespace's labels from an informer cache; ok is
// false when the namespace is not in the cache.
type Namespaces interface {
	NamespaceLabels(name string) (map[string]string, bool)
}

// Options are the policy's cluster inputs.
type Options struct {
	// LocalQueues is nil when the LocalQueue CRD is not served or kadmit
	// runs offline without --state.
	LocalQueues LocalQueues
	// Namespaces is nil offline without --state; read only with
	// ManageJobsWithoutQueueName.
	Namespaces Namespaces
	// Offline is set by `kadmit review` without cluster state: what needs
	// the cluster is skipped with a warning, never denied.
	Offline bool
}

// Policy is the job-queue policy.
type Policy struct {
	cfg          Config
	opts         Options
	suspend      bool
	lqDefaulting bool
	nsSelector   labels.Selector
	// nsSelectorNameOnly: the selector reads no label but the name label
	// every namespace carries, so it is decidable without the cache.
	nsSelectorNameOnly bool
	owners             []metav1.TypeMeta
}

// New validates cfg and builds the policy; the error is Config.Validate's.
func New(cfg Config, opts Options) (*Policy, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	p := &Policy{cfg: cfg, opts: opts, suspend: true, lqDefaulting: true}
	if cfg.Suspend != nil {
		p.suspend = *cfg.Suspend
	}
	if cfg.LocalQueueDefaulting != nil {
		p.lqDefaulting = *cfg.LocalQueueDefaulting
	}
	sel := cfg.ManagedJobsNamespaceSelector
	if sel == nil {
		sel = defaultNamespaceSelector()
	}
	var err error
	if p.nsSelector, err = metav1.LabelSelectorAsSelector(sel); err != nil {
		return nil, fmt.Errorf("managedJobsNamespaceSelector: %w", err)
	}
	p.nsSelectorNameOnly = len(sel.MatchLabels) == 0 && !slices.ContainsFunc(sel.MatchExpressions, func(r metav1.LabelSelectorRequirement) bool {
		return r.Key != "kubernetes.io/metadata.name"
	})
	frameworks := cfg.Frameworks
	if len(frameworks) == 0 {
		frameworks = []string{"batch/job"}
	}
	for _, f := range frameworks {
		p.owners = append(p.owners, FrameworkOwners[f])
	}
	return p, nil
}

// Hooks returns the mutating hook (jobs CREATE on /mutate-batch-v1-job) and
// the validating hook (jobs CREATE and UPDATE on /validate-batch-v1-job),
// both failurePolicy Fail as Kueue registers them (job_webhook.go:102,123
// at v0.13.0): a job that skipped the mutation would start unsuspended,
// outside the queue.
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

// BoundedReview marks the policy admission.Bounded, so its hooks run on
// the request's goroutine: beside the object, it reads only the
// LocalQueue and namespace informer stores, whose reads do not wait on
// I/O.
func (*Policy) BoundedReview() {}
