// Package elasticquota implements the elastic-quota policy, kadmit's version
// of Koordinator's ElasticQuota webhooks (scheduling.sigs.k8s.io/v1alpha1
// elasticquotas): defaulting of the quota tree labels, the tree's topology
// checks, and a pod check that refuses pods their quota has no room for.
//
// Unlike Koordinator, which applies a request to its in-memory tree before
// checking it, every check here runs on a copy (Snapshot.With) of an
// informer-fed snapshot: a denied request or a dry run changes nothing, and
// no API call is made while a request waits.
package elasticquota

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/jsonedit"
	"github.com/kadmit/kadmit/internal/policy/podrequest"
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
type Config struct {
	// RootQuota and SystemQuota name Koordinator's built-in quotas; they
	// cannot be changed or deleted. Defaults koordinator-root-quota and
	// koordinator-system-quota. A quota without a parent label gets
	// RootQuota as its parent; the root need not exist as an object.
	RootQuota   string `json:"rootQuota,omitempty"`
	SystemQuota string `json:"systemQuota,omitempty"`
	// PodCheck adds the pod hook on /validate-pod; default true.
	PodCheck *bool `json:"podCheck,omitempty"`
}

// DefaultConfig is the seed profile: disabled, Koordinator's quota names.
func DefaultConfig() Config {
	return Config{RootQuota: DefaultRootQuota, SystemQuota: DefaultSystemQuota}
}

// Validate reports the first problem as "<field>: <problem>".
func (c Config) Validate() error {
	for _, f := range []struct{ field, v string }{{"rootQuota", c.RootQuota}, {"systemQuota", c.SystemQuota}} {
		if errs := validation.IsDNS1123Subdomain(f.v); len(errs) > 0 {
			return fmt.Errorf("%s: %q: %s", f.field, f.v, errs[0])
		}
	}
	if c.RootQuota == c.SystemQuota {
		return fmt.Errorf("systemQuota: must differ from rootQuota %q", c.RootQuota)
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
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Policy{cfg: cfg, cache: cache}, nil
}

// Hooks returns the mutating hook (elasticquotas CREATE), the validating
// hook (elasticquotas CREATE, UPDATE, DELETE) and, unless podCheck is false,
// the pod hook (pods CREATE on /validate-pod); all failurePolicy Fail.
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
			Rules: rule("", "pods", admissionregistrationv1.Create), Validator: admission.ValidatorFunc(p.ValidatePod)})
	}
	return hooks
}

func (p *Policy) builtin(name string) bool {
	return name == p.cfg.RootQuota || name == p.cfg.SystemQuota
}

const offlineWarning = Name + ": no cluster cache (offline): checks against other quotas and pods skipped"

// Mutate defaults a new quota: parent label to the root quota; tree-id
// label to the parent's (when the parent has one); shared-weight annotation
// to spec.max as JSON. The built-in quotas are left alone. Each default is
// one JSONPatch operation on the quota as sent; it returns none when
// nothing changes.
func (p *Policy) Mutate(_ context.Context, req *admission.Request) ([]jsonedit.Op, admission.Verdict) {
	if req.Operation != admissionv1.Create {
		return nil, admission.Allow()
	}
	q, err := Parse(req.Object.Raw)
	if err != nil {
		return nil, admission.Invalid("%s: %v", Name, err)
	}
	if p.builtin(q.Name) {
		return nil, admission.Allow()
	}
	// The labels and annotations the operations address, read as the
	// patch will find them.
	doc := jsonedit.NewDoc(req.Object.Raw)
	var meta struct {
		Labels      map[string]string `json:"labels"`
		Annotations map[string]string `json:"annotations"`
	}
	if _, err := doc.Decode(&meta, "metadata"); err != nil {
		return nil, admission.Invalid("%s: cannot parse the ElasticQuota: %v", Name, err)
	}
	set := func(v any, path ...string) {
		if err == nil {
			err = doc.Set(v, path...)
		}
	}
	parent := meta.Labels[LabelParent]
	if parent == "" {
		parent = p.cfg.RootQuota
		set(parent, "metadata", "labels", LabelParent)
	}
	if meta.Labels[LabelTreeID] == "" && p.cache != nil {
		if pq := p.cache.Snapshot().Get(parent); pq != nil && pq.TreeID != "" {
			set(pq.TreeID, "metadata", "labels", LabelTreeID)
		}
	}
	if _, ok := meta.Annotations[AnnotationSharedWeight]; !ok {
		max := q.Max
		if max == nil {
			max = corev1.ResourceList{}
		}
		b, err := json.Marshal(max)
		if err != nil {
			return nil, admission.Errored(0, fmt.Errorf("%s: encode shared-weight: %w", Name, err))
		}
		set(string(b), "metadata", "annotations", AnnotationSharedWeight)
	}
	if err != nil {
		return nil, admission.Invalid("%s: cannot edit the ElasticQuota: %v", Name, err)
	}
	return doc.Ops(), admission.Allow()
}

// Validate checks an ElasticQuota write against the tree: see checkQuota and
// checkDelete. Content errors answer 400, tree violations 403.
func (p *Policy) Validate(_ context.Context, req *admission.Request) admission.Verdict {
	if req.Operation == admissionv1.Delete {
		name := req.Name
		if name == "" && len(req.OldObject.Raw) > 0 {
			if old, err := Parse(req.OldObject.Raw); err == nil {
				name = old.Name
			}
		}
		return p.checkDelete(name)
	}
	q, err := Parse(req.Object.Raw)
	if err != nil {
		return admission.Invalid("%s: %v", Name, err)
	}
	var old *Quota
	if req.Operation == admissionv1.Update && len(req.OldObject.Raw) > 0 {
		if old, err = Parse(req.OldObject.Raw); err != nil {
			return admission.Invalid("%s: old object: %v", Name, err)
		}
	}
	return p.checkQuota(q, old)
}

// checkQuota runs, in order: built-in quotas are immutable; min and max are
// >= 0 and every min key is in max with min <= max; tree-id does not change.
// Then, with the cluster cache: the parent exists (the root always does),
// is not the quota itself or its descendant, and is a parent; max keys equal
// the parent's and min keys are a subset of the parent's min; the siblings'
// min (this one's new value included) sum to at most the parent's min; the
// children's min sum to at most this min; is-parent stays true while
// children exist; tree-id equals the parent's; no claimed namespace is
// claimed by another quota.
func (p *Policy) checkQuota(q, old *Quota) admission.Verdict {
	if old != nil && p.builtin(q.Name) && (!equality.Semantic.DeepEqual(old.labels, q.labels) ||
		!equality.Semantic.DeepEqual(old.annotations, q.annotations) || !jsonEqual(old.spec, q.spec)) {
		return admission.Deny("ElasticQuota %s is built in and cannot be changed", q.Name)
	}
	for _, l := range []struct {
		field string
		list  corev1.ResourceList
	}{{"min", q.Min}, {"max", q.Max}} {
		for _, r := range keys(l.list) {
			if v := l.list[r]; v.Sign() < 0 {
				return admission.Invalid("ElasticQuota %s: spec.%s.%s must be >= 0, got %s", q.Name, l.field, r, v.String())
			}
		}
	}
	for _, r := range keys(q.Min) {
		mx, ok := q.Max[r]
		if !ok {
			return admission.Deny("ElasticQuota %s: spec.min.%s has no matching spec.max.%s", q.Name, r, r)
		}
		if mn := q.Min[r]; mn.Cmp(mx) > 0 {
			return admission.Deny("ElasticQuota %s: spec.min.%s %s is more than spec.max.%s %s", q.Name, r, mn.String(), r, mx.String())
		}
	}
	if old != nil && old.TreeID != q.TreeID {
		return admission.Deny("ElasticQuota %s: label %s is immutable (%q -> %q)", q.Name, LabelTreeID, old.TreeID, q.TreeID)
	}
	for _, ns := range q.Namespaces {
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			return admission.Invalid("ElasticQuota %s: annotation %s: namespace %q: %s", q.Name, AnnotationNamespaces, ns, errs[0])
		}
	}
	if p.cache == nil {
		return admission.Allow(offlineWarning)
	}
	if p.builtin(q.Name) {
		return admission.Allow()
	}
	parentName := q.Parent
	if parentName == "" {
		parentName = p.cfg.RootQuota
	}
	if parentName == q.Name {
		return admission.Deny("ElasticQuota %s: cannot be its own parent", q.Name)
	}
	// The tree as it would be after this write; the cache is not touched.
	snap := p.cache.Snapshot().With(q.Name, q)
	children := snap.Children(q.Name)
	if len(children) > 0 && !q.IsParent {
		return admission.Deny("ElasticQuota %s: label %s cannot be false while it has children (%s)", q.Name, LabelIsParent, names(children))
	}
	if len(children) > 0 {
		sum := corev1.ResourceList{}
		for _, c := range children {
			podrequest.Add(sum, c.Min)
		}
		for _, r := range keys(sum) {
			if have := q.Min[r]; cmp(sum[r], have) > 0 {
				return admission.Deny("ElasticQuota %s: its children's min %s sum to %s, more than its min %s", q.Name, r, qty(sum[r]), have.String())
			}
		}
	}
	for _, ns := range q.Namespaces {
		if other := p.cache.Snapshot().claims[ns]; other != nil && other.Name != q.Name {
			return admission.Deny("ElasticQuota %s: namespace %q is already claimed by ElasticQuota %s", q.Name, ns, other.Name)
		}
	}
	if parentName == p.cfg.RootQuota {
		return admission.Allow()
	}
	parent := snap.Get(parentName)
	if parent == nil {
		return admission.Deny("ElasticQuota %s: parent ElasticQuota %q does not exist", q.Name, parentName)
	}
	for a, seen := parent, 0; a != nil && seen <= len(snap.byName); a, seen = snap.Get(a.Parent), seen+1 {
		if a.Parent == q.Name {
			return admission.Deny("ElasticQuota %s: parent %s is its own descendant", q.Name, parentName)
		}
	}
	if !parent.IsParent {
		return admission.Deny("ElasticQuota %s: parent %s is not a parent quota (label %s: \"true\")", q.Name, parentName, LabelIsParent)
	}
	if q.TreeID != parent.TreeID {
		return admission.Deny("ElasticQuota %s: label %s %q must equal its parent %s's %q", q.Name, LabelTreeID, q.TreeID, parentName, parent.TreeID)
	}
	if mine, theirs := keys(q.Max), keys(parent.Max); !slices.Equal(mine, theirs) {
		return admission.Deny("ElasticQuota %s: spec.max resources %v must equal its parent %s's %v", q.Name, mine, parentName, theirs)
	}
	for _, r := range keys(q.Min) {
		if _, ok := parent.Min[r]; !ok {
			return admission.Deny("ElasticQuota %s: spec.min.%s is not in its parent %s's min", q.Name, r, parentName)
		}
	}
	sum := corev1.ResourceList{}
	for _, s := range snap.Children(parentName) {
		podrequest.Add(sum, s.Min)
	}
	for _, r := range keys(sum) {
		if have := parent.Min[r]; cmp(sum[r], have) > 0 {
			return admission.Deny("ElasticQuota %s: the min %s of %s's children would sum to %s, more than its min %s", q.Name, r, parentName, qty(sum[r]), have.String())
		}
	}
	return admission.Allow()
}

// checkDelete refuses to delete a built-in quota, a quota with children or
// one with bound pods, naming up to two of them.
func (p *Policy) checkDelete(name string) admission.Verdict {
	if p.builtin(name) {
		return admission.Deny("ElasticQuota %s is built in and cannot be deleted", name)
	}
	if p.cache == nil {
		return admission.Allow(offlineWarning)
	}
	snap := p.cache.Snapshot()
	if c := snap.Children(name); len(c) > 0 {
		return admission.Deny("ElasticQuota %s has %d child quota(s) (%s); delete them first", name, len(c), names(c))
	}
	if pods := p.boundPods(snap, name); len(pods) > 0 {
		var refs []string
		for _, pod := range pods[:min(2, len(pods))] {
			refs = append(refs, pod.Namespace+"/"+pod.Name)
		}
		return admission.Deny("ElasticQuota %s has %d bound pod(s) (%s); delete them first", name, len(pods), strings.Join(refs, ", "))
	}
	return admission.Allow()
}

// ValidatePod denies (403) a pod whose effective request plus its quota's
// current use exceeds the quota's max for a resource the max lists. Use is
// the sum of the effective requests of the quota's pods that have not
// finished. Pods bound to no quota, or to one kadmit does not know, pass.
func (p *Policy) ValidatePod(ctx context.Context, req *admission.Request) admission.Verdict {
	// Only the metadata and what podrequest.Effective reads are decoded;
	// quantities go through internal/quantity, so an out-of-range request
	// is a 400 naming its field before any arithmetic.
	var raw struct {
		metav1.ObjectMeta `json:"metadata"`
		Spec              json.RawMessage `json:"spec"`
	}
	if err := json.Unmarshal(req.Object.Raw, &raw); err != nil {
		return admission.Invalid("%s: cannot parse the pod: %v", Name, err)
	}
	spec, err := podrequest.DecodeSpec(raw.Spec, "spec")
	if err != nil {
		return admission.Invalid("%s: cannot parse the pod: %v", Name, err)
	}
	pod := corev1.Pod{ObjectMeta: raw.ObjectMeta, Spec: *spec}
	if p.cache == nil {
		if pod.Labels[LabelQuotaName] != "" {
			return admission.Allow(offlineWarning)
		}
		return admission.Allow()
	}
	ns := req.Namespace
	if ns == "" {
		ns = pod.Namespace
	}
	snap := p.cache.Snapshot()
	name := snap.QuotaFor(ns, pod.Labels)
	q := snap.Get(name)
	if q == nil || len(q.Max) == 0 {
		return admission.Allow()
	}
	used := corev1.ResourceList{}
	for i, bp := range p.boundPods(snap, name) {
		// A quota may hold thousands of pods: stop once the handler has
		// given up on this review (its context is cancelled).
		if i%256 == 0 && ctx.Err() != nil {
			return admission.Errored(0, fmt.Errorf("%s: summing the pods of ElasticQuota %s: %w", Name, name, ctx.Err()))
		}
		if bp.Namespace == ns && bp.Name == pod.Name && pod.Name != "" {
			continue
		}
		podrequest.Add(used, podrequest.Effective(&bp.Spec))
	}
	want := podrequest.Effective(&pod.Spec)
	for _, r := range keys(q.Max) {
		w := want[r]
		if w.IsZero() {
			continue
		}
		total := used[r].DeepCopy()
		total.Add(w)
		if mx := q.Max[r]; total.Cmp(mx) > 0 {
			return admission.Deny("pod requests %s %s but ElasticQuota %s has %s of max %s in use", r, w.String(), name, qty(used[r]), mx.String())
		}
	}
	return admission.Allow()
}

// boundPods returns the unfinished pods accounted to quota name, sorted by
// namespace and name.
func (p *Policy) boundPods(snap *Snapshot, name string) []*corev1.Pod {
	var out []*corev1.Pod
	live := func(pod *corev1.Pod) bool {
		return pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed
	}
	for _, pod := range p.cache.PodsWithQuotaLabel(name) {
		if live(pod) {
			out = append(out, pod)
		}
	}
	for _, ns := range snap.namespacesOf(name) {
		for _, pod := range p.cache.PodsInNamespace(ns) {
			if pod.Labels[LabelQuotaName] == "" && live(pod) {
				out = append(out, pod)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Namespace != out[j].Namespace {
			return out[i].Namespace < out[j].Namespace
		}
		return out[i].Name < out[j].Name
	})
	return out
}

func names(qs []*Quota) string {
	var out []string
	for _, q := range qs[:min(2, len(qs))] {
		out = append(out, q.Name)
	}
	if len(qs) > 2 {
		out = append(out, "...")
	}
	return strings.Join(out, ", ")
}

// qty and cmp take quantities by value, as map elements are not addressable.
func qty(q resource.Quantity) string { return q.String() }

func cmp(a, b resource.Quantity) int { return a.Cmp(b) }

func keys(l corev1.ResourceList) []corev1.ResourceName {
	out := make([]corev1.ResourceName, 0, len(l))
	for k := range l {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func jsonEqual(a, b json.RawMessage) bool {
	var x, y any
	_ = json.Unmarshal(a, &x)
	_ = json.Unmarshal(b, &y)
	return equality.Semantic.DeepEqual(x, y)
}
