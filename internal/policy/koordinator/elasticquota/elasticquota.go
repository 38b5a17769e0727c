// Package elasticquota implements the elastic-quota policy, kadmit's version
// of Koordinator's ElasticQuota webhooks (scheduling.sigs.k8s.io/v1alpha1
// elasticquotas) as koordinator-sh/koordinator v1.8.0 serves them
// (pkg/webhook/elasticquota): defaulting of the quota tree labels, the
// tree's topology checks, and the quota rules of /validate-pod.
//
// Upstream applies an admitted request to its in-memory tree; kadmit reads
// an informer-fed snapshot and never changes it, so a denied request or a
// dry run leaves no trace and no API call is made while a request waits.
// The rules, their order and their messages are upstream's; every
// deliberate difference is a Config switch, off by default
// (docs/policies.md, "Differences from upstream").
package elasticquota

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/kadmit/kadmit/internal/admission"
)

// The policy states its change as JSONPatch operations.
var _ admission.Mutator = (*Policy)(nil)

// Name is the policy's name (policies.elasticQuota in the configuration).
const Name = "elastic-quota"

// Paths of the hooks, as Koordinator names them.
const (
	MutatePath      = "/mutate-scheduling-sigs-k8s-io-v1alpha1-elasticquota"
	ValidatePath    = "/validate-scheduling-sigs-k8s-io-v1alpha1-elasticquota"
	ValidatePodPath = "/validate-pod"
)

// Config is the elastic-quota policy's configuration (policies.elasticQuota).
// Every boolean defaults to false, which is upstream's behaviour.
type Config struct {
	// RootQuota, SystemQuota and DefaultQuota name Koordinator's built-in
	// quotas; defaults koordinator-root-quota, koordinator-system-quota,
	// koordinator-default-quota (apis/extension/elastic_quota.go:31-33).
	// The root and system quotas cannot be modified, none of the three
	// deleted; a quota without a parent label has RootQuota as its parent.
	RootQuota    string `json:"rootQuota,omitempty"`
	SystemQuota  string `json:"systemQuota,omitempty"`
	DefaultQuota string `json:"defaultQuota,omitempty"`
	// PodCheck adds the pod hook on /validate-pod (CREATE, UPDATE);
	// default true.
	PodCheck *bool `json:"podCheck,omitempty"`
	// AllowReservePod (kadmit, off by default) skips Koordinator's ban on
	// the scheduling.koordinator.sh/reserve-pod annotation (package
	// reservepod) in the pod hook; upstream's pod validation runs the ban
	// whenever it runs.
	AllowReservePod bool `json:"allowReservePod,omitempty"`

	// Upstream feature gates (pkg/features/features.go:121-126, all off by
	// default there and here).

	// EnableUpdateResourceKey (ElasticQuotaEnableUpdateResourceKey): a
	// quota's max keys need only be included in its parent's, not equal.
	EnableUpdateResourceKey bool `json:"enableUpdateResourceKey,omitempty"`
	// SupportParentQuotaSubmitPod: pods may be bound to a parent quota.
	SupportParentQuotaSubmitPod bool `json:"supportParentQuotaSubmitPod,omitempty"`
	// DisableDefaultQuota: a pod binds to a quota only by its label.
	DisableDefaultQuota bool `json:"disableDefaultQuota,omitempty"`
	// QuotaAdmission (EnableQuotaAdmission): a new pod is denied when its
	// request plus its quota's use exceeds the quota's admission annotation
	// (spec.max when absent). Use is the sum of the requests of the
	// quota's running pods from the informer, where upstream reads the
	// child-request annotation its webhook writes (kadmit writes nothing).
	QuotaAdmission bool `json:"quotaAdmission,omitempty"`

	// kadmit's own checks, beyond upstream.

	// DenyParentCycles refuses a quota that is its own parent or ancestor;
	// upstream admits such a write (quota_topology_check.go:187-201 only
	// checks that the parent exists and is a parent).
	DenyParentCycles bool `json:"denyParentCycles,omitempty"`
}

// DefaultConfig is upstream's behaviour with Koordinator's quota names.
func DefaultConfig() Config {
	return Config{RootQuota: DefaultRootQuota, SystemQuota: DefaultSystemQuota, DefaultQuota: DefaultDefaultQuota}
}

// Validate reports the first problem as "<field>: <problem>".
func (c Config) Validate() error {
	seen := map[string]string{}
	for _, f := range []struct{ field, v string }{{"rootQuota", c.RootQuota}, {"systemQuota", c.SystemQuota}, {"defaultQuota", c.DefaultQuota}} {
		if errs := validation.IsDNS1123Subdomain(f.v); len(errs) > 0 {
			return fmt.Errorf("%s: %q: %s", f.field, f.v, errs[0])
		}
		if other, dup := seen[f.v]; dup {
			return fmt.Errorf("%s: must differ from %s %q", f.field, other, f.v)
		}
		seen[f.v] = f.field
	}
	return nil
}

// Cache is the cluster state the policy reads, from informers. Every method
// answers from memory.
type Cache interface {
	// Snapshot returns the current quota snapshot; never nil.
	Snapshot() *Snapshot
	// PodsWithQuotaLabel returns the pods labelled
	// quota.scheduling.koordinator.sh/name=name.
	PodsWithQuotaLabel(name string) []*corev1.Pod
	// PodsInNamespace returns the pods of namespace.
	PodsInNamespace(namespace string) []*corev1.Pod
}

// Policy is the elastic-quota policy.
type Policy struct {
	cfg   Config
	cache Cache
}

// New validates cfg and builds the policy. cache is nil offline: checks
// that need other quotas or pods are then skipped with a warning, and the
// checks of the object alone still run.
func New(cfg Config, cache Cache) (*Policy, error) {
	if cfg.DefaultQuota == "" {
		cfg.DefaultQuota = DefaultDefaultQuota
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Policy{cfg: cfg, cache: cache}, nil
}

// Hooks returns the mutating hook (elasticquotas CREATE), the validating
// hook (elasticquotas CREATE, UPDATE, DELETE) and, unless podCheck is false,
// the pod hook (pods CREATE, UPDATE on /validate-pod); all failurePolicy
// Fail, as upstream's kubebuilder markers
// (pkg/webhook/elasticquota/{mutating,validating}/webhooks.go:28,
// pkg/webhook/pod/validating/webhooks.go:28).
func (p *Policy) Hooks() []admission.Hook {
	fp := admissionregistrationv1.Fail
	rule := func(group, resource string, ops ...admissionregistrationv1.OperationType) []admissionregistrationv1.RuleWithOperations {
		v := "v1alpha1"
		if group == "" {
			v = "v1"
		}
		return []admissionregistrationv1.RuleWithOperations{{Operations: ops, Rule: admissionregistrationv1.Rule{
			APIGroups: []string{group}, APIVersions: []string{v}, Resources: []string{resource}}}}
	}
	const g = "scheduling.sigs.k8s.io"
	hooks := []admission.Hook{
		{Policy: Name, Path: MutatePath, Type: admission.Mutating, FailurePolicy: fp,
			Rules: rule(g, "elasticquotas", admissionregistrationv1.Create), Mutator: p},
		{Policy: Name, Path: ValidatePath, Type: admission.Validating, FailurePolicy: fp,
			Rules:     rule(g, "elasticquotas", admissionregistrationv1.Create, admissionregistrationv1.Update, admissionregistrationv1.Delete),
			Validator: admission.ValidatorFunc(p.Validate)},
	}
	if p.cfg.PodCheck == nil || *p.cfg.PodCheck {
		hooks = append(hooks, admission.Hook{Policy: Name, Path: ValidatePodPath, Type: admission.Validating, FailurePolicy: fp,
			Rules:     rule("", "pods", admissionregistrationv1.Create, admissionregistrationv1.Update),
			Validator: admission.ValidatorFunc(p.ValidatePod)})
	}
	return hooks
}

// forbiddenModify is upstream's IsForbiddenModify
// (apis/extension/elastic_quota.go:105-112).
func (p *Policy) forbiddenModify(name string) bool {
	return name == p.cfg.RootQuota || name == p.cfg.SystemQuota
}

// parentOf is upstream's GetParentQuotaName (elastic_quota.go:61-67): the
// parent label, else the root quota (the root has none).
func (p *Policy) parentOf(q *Quota) string {
	if q.Parent == "" && q.Name != p.cfg.RootQuota {
		return p.cfg.RootQuota
	}
	return q.Parent
}

const offlineWarning = Name + ": no cluster cache (offline): checks against other quotas and pods skipped"

// deny is every quota denial: upstream answers admission.Errored(400) for
// each (validating_handler.go:90, mutating_handler.go:77,
// pod/validating/validating_handler.go:142).
func deny(format string, args ...any) admission.Verdict {
	return admission.Invalid(format, args...)
}

func keys(l corev1.ResourceList) []corev1.ResourceName {
	return slices.Sorted(maps.Keys(l))
}

// names lists resource names as upstream's %v of a []ResourceName does:
// "[cpu memory]".
func names(l []corev1.ResourceName) string {
	s := make([]string, len(l))
	for i, n := range l {
		s[i] = string(n)
	}
	return "[" + strings.Join(s, " ") + "]"
}

// negative returns the sorted names whose quantity is below zero
// (quotav1.IsNegative).
func negative(l corev1.ResourceList) []corev1.ResourceName {
	var out []corev1.ResourceName
	for _, k := range keys(l) {
		if v := l[k]; v.Sign() < 0 {
			out = append(out, k)
		}
	}
	return out
}

// sameKeys and keysIncluded are upstream's checkQuotaKeySame and
// checkQuotaKeyIncluded (quota_topology_check.go:380-402).
func sameKeys(a, b corev1.ResourceList) bool { return keysIncluded(a, b) && keysIncluded(b, a) }

func keysIncluded(parent, child corev1.ResourceList) bool {
	for k := range child {
		if _, ok := parent[k]; !ok {
			return false
		}
	}
	return true
}

// lessOrEqualCompletely is upstream's util.LessThanOrEqualCompletely
// (pkg/util/resource.go:328-339): every key of a is <= b's (0 if absent).
func lessOrEqualCompletely(a, b corev1.ResourceList) bool {
	for k, v := range a {
		if w := b[k]; v.Cmp(w) > 0 {
			return false
		}
	}
	return true
}
