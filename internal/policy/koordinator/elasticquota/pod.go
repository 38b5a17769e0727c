package elasticquota

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/jsonedit"
	"github.com/kadmit/kadmit/internal/policy/koordinator/reservepod"
	"github.com/kadmit/kadmit/internal/policy/shared/podrequest"
)

// Line numbers below are koordinator-sh/koordinator v1.8.0: pod_check.go is
// pkg/webhook/elasticquota/pod_check.go, evaluator.go
// pkg/webhook/quotaevaluate/evaluator.go, evaluate_quota.go
// pkg/webhook/pod/validating/evaluate_quota.go.

// ValidatePod runs upstream's quota rules of /validate-pod, in the order of
// pkg/webhook/pod/validating/validating_handler.go:98-115, after (unless
// allowReservePod) the reserve-pod annotation ban that upstream's handler
// runs first (package reservepod):
//   - UPDATE: the preemptible label cannot change (pod_check.go:62-67);
//   - CREATE and UPDATE: unless supportParentQuotaSubmitPod, a pod cannot be
//     bound to a parent quota (pod_check.go:41-60);
//   - CREATE, with quotaAdmission: the pod's request plus its quota's use
//     fits the quota's admission limit (evaluate_quota.go:42-95).
//
// Every denial is a 400, as upstream's handler answers.
func (p *Policy) ValidatePod(ctx context.Context, req *admission.Request) admission.Verdict {
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return admission.Allow()
	}
	if !p.cfg.AllowReservePod {
		if v := reservepod.Validate(req); !v.Allowed {
			return v
		}
	}
	var pod struct {
		metav1.ObjectMeta `json:"metadata"`
		Spec              json.RawMessage `json:"spec"`
	}
	if err := jsonedit.Unmarshal(req.Object.Raw, &pod); err != nil {
		return deny("%s: cannot parse the pod: %v", Name, err)
	}
	// Upstream decodes the whole pod first and answers 400 when it cannot
	// (pod/validating/validating_handler.go:77-80); kadmit decodes what it
	// may sum, through internal/quantity, so an out-of-range request is a
	// 400 naming its field before any arithmetic.
	spec, err := podrequest.DecodeSpec(pod.Spec, "spec")
	if err != nil {
		return deny("%s: cannot parse the pod: %v", Name, err)
	}
	ns := pod.Namespace
	if ns == "" {
		ns = req.Namespace
	}
	if req.Operation == admissionv1.Update {
		var old struct {
			metav1.ObjectMeta `json:"metadata"`
		}
		if err := jsonedit.Unmarshal(req.OldObject.Raw, &old); err != nil {
			return deny("%s: cannot parse the old pod: %v", Name, err)
		}
		if old.Labels[LabelPreemptible] != pod.Labels[LabelPreemptible] {
			return deny("Preemptible label is forbidden modify now.")
		}
	}
	if p.cache == nil {
		if pod.Labels[LabelQuotaName] != "" {
			return admission.Allow(offlineWarning)
		}
		return admission.Allow()
	}
	snap := p.cache.Snapshot()
	if !p.cfg.SupportParentQuotaSubmitPod {
		name := p.quotaNameOf(snap, ns, pod.Labels)
		if q := snap.Get(name); q != nil && name != p.cfg.DefaultQuota && q.IsParent {
			return deny("pod can not be linked to a parentQuotaGroup,quota:%v, pod:%v", name, pod.Name)
		}
	}
	if p.cfg.QuotaAdmission && req.Operation == admissionv1.Create {
		return p.evaluateQuota(ctx, snap, ns, pod.Name, pod.Labels, spec)
	}
	return admission.Allow()
}

// quotaNameOf is upstream's GetQuotaName (pod_check.go:77-106): the pod's
// quota label; else (unless disableDefaultQuota) the quota named after the
// pod's namespace in that namespace, else the quota whose namespaces
// annotation claims it, else the default quota. A pod never binds to a
// quota merely because the quota lives in its namespace.
func (p *Policy) quotaNameOf(snap *Snapshot, ns string, labels map[string]string) string {
	name := labels[LabelQuotaName]
	if p.cfg.DisableDefaultQuota || name != "" {
		return name
	}
	if q := snap.GetIn(ns, ns); q != nil {
		return q.Name
	}
	if q := snap.Claimant(ns); q != nil {
		return q.Name
	}
	return p.cfg.DefaultQuota
}

// podResources are the resources quota admission manages
// (evaluator.go:44-65).
var podResources = []corev1.ResourceName{
	corev1.ResourceCPU, corev1.ResourceMemory, corev1.ResourceEphemeralStorage,
	corev1.ResourceRequestsCPU, corev1.ResourceRequestsMemory, corev1.ResourceRequestsEphemeralStorage,
	"kubernetes.io/batch-cpu", "kubernetes.io/batch-memory", "kubernetes.io/mid-cpu", "kubernetes.io/mid-memory",
	"koordinator.sh/gpu", "nvidia.com/gpu", "koordinator.sh/gpu.shared", "koordinator.sh/gpu-memory-ratio",
}

// evaluateQuota is the quota admission of evaluate_quota.go:42-95 and
// evaluator.go:305-365, without upstream's write: the quota's use is the
// sum of the effective requests of its running pods (from the informer),
// where upstream reads and then rewrites the child-request annotation.
func (p *Policy) evaluateQuota(ctx context.Context, snap *Snapshot, ns, podName string, labels map[string]string, spec *corev1.PodSpec) admission.Verdict {
	name := p.quotaNameOf(snap, ns, labels)
	if name == "" || name == p.cfg.DefaultQuota || name == p.cfg.SystemQuota || name == p.cfg.RootQuota {
		return admission.Allow()
	}
	switch n := snap.Count(name); {
	case n == 0:
		return deny("elastic quota %v not found", name)
	case n > 1:
		return deny("more than one elastic quota %v found", name)
	}
	q := snap.Get(name)
	managed := false
	for _, r := range podResources {
		if _, ok := q.Max[r]; ok {
			managed = true
			break
		}
	}
	if !managed {
		return admission.Allow()
	}
	requested := corev1.ResourceList{}
	for k, v := range podrequest.Effective(spec) {
		if _, ok := q.Max[k]; ok && !v.IsZero() {
			requested[k] = v
		}
	}
	if len(requested) == 0 {
		return admission.Allow()
	}
	limit, _, err := q.annotationList(AnnotationAdmission)
	if err != nil {
		return deny("%s: ElasticQuota %s annotation %s: %v", Name, name, AnnotationAdmission, err)
	}
	if len(limit) == 0 {
		limit = q.Max
	}
	used, err := p.quotaUse(ctx, snap, q, ns, podName)
	if err != nil {
		return admission.Errored(0, err)
	}
	var exceeded []corev1.ResourceName
	for _, k := range keys(limit) {
		w, ok := requested[k]
		if !ok {
			continue
		}
		total := used[k].DeepCopy()
		total.Add(w)
		if total.Cmp(limit[k]) > 0 {
			exceeded = append(exceeded, k)
		}
	}
	if len(exceeded) > 0 {
		return deny("exceeded quota: %s/%s, requested: %s, used: %s, limited: %s", q.Namespace, q.Name,
			pretty(requested, exceeded), pretty(used, exceeded), pretty(limit, exceeded))
	}
	return admission.Allow()
}

// pretty is upstream's prettyPrint of a list masked to names
// (evaluator.go:431-444): "cpu=4,memory=1Gi".
func pretty(l corev1.ResourceList, names []corev1.ResourceName) string {
	var parts []string
	for _, k := range names {
		if v, ok := l[k]; ok {
			parts = append(parts, string(k)+"="+v.String())
		}
	}
	return strings.Join(parts, ",")
}

// quotaUse sums the effective requests of the pods bound to q that still
// count (evaluator.go:280-293: not Succeeded or Failed, not past their
// deletion grace period), leaving out the pod under review.
func (p *Policy) quotaUse(ctx context.Context, snap *Snapshot, q *Quota, ns, podName string) (corev1.ResourceList, error) {
	used := corev1.ResourceList{}
	now := time.Now()
	for i, bp := range p.candidatePods(snap, q) {
		// A quota may hold thousands of pods: stop once the handler has
		// given up on this review (its context is cancelled).
		if i%256 == 0 && ctx.Err() != nil {
			return nil, fmt.Errorf("%s: summing the pods of ElasticQuota %s: %w", Name, q.Name, ctx.Err())
		}
		if (bp.Namespace == ns && bp.Name == podName && podName != "") || !counts(bp, now) {
			continue
		}
		if p.quotaNameOf(snap, bp.Namespace, bp.Labels) != q.Name {
			continue
		}
		podrequest.Add(used, podrequest.Effective(&bp.Spec))
	}
	return used, nil
}

// counts is upstream's QuotaV1Pod (evaluator.go:280-293).
func counts(pod *corev1.Pod, now time.Time) bool {
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return false
	}
	if pod.DeletionTimestamp != nil && pod.DeletionGracePeriodSeconds != nil {
		grace := time.Duration(*pod.DeletionGracePeriodSeconds) * time.Second
		if now.After(pod.DeletionTimestamp.Add(grace)) {
			return false
		}
	}
	return true
}

// candidatePods returns, once each, the pods that can be bound
// to q: labelled with its name, in the namespace named after it (when q
// lives there), or in a namespace it claims.
func (p *Policy) candidatePods(snap *Snapshot, q *Quota) []*corev1.Pod {
	seen := map[string]bool{}
	var out []*corev1.Pod
	addAll := func(pods []*corev1.Pod) {
		for _, pod := range pods {
			if k := pod.Namespace + "/" + pod.Name; !seen[k] {
				seen[k] = true
				out = append(out, pod)
			}
		}
	}
	addAll(p.cache.PodsWithQuotaLabel(q.Name))
	if !p.cfg.DisableDefaultQuota {
		if q.Namespace == q.Name {
			addAll(p.cache.PodsInNamespace(q.Name))
		}
		for _, ns := range q.Namespaces {
			if snap.Claimant(ns) == q {
				addAll(p.cache.PodsInNamespace(ns))
			}
		}
	}
	return out
}

// hasBoundPods is upstream's hasQuotaBoundedPods (pod_check.go:108-142):
// any pod, in any phase, labelled with the quota's name, in the namespace
// named after the quota, or in one of namespaces (the request's old
// namespaces annotation).
func (p *Policy) hasBoundPods(name string, namespaces []string) bool {
	if len(p.cache.PodsWithQuotaLabel(name)) > 0 || len(p.cache.PodsInNamespace(name)) > 0 {
		return true
	}
	for _, ns := range namespaces {
		if len(p.cache.PodsInNamespace(ns)) > 0 {
			return true
		}
	}
	return false
}

func sortPods(pods []*corev1.Pod) {
	sort.Slice(pods, func(i, j int) bool {
		if pods[i].Namespace != pods[j].Namespace {
			return pods[i].Namespace < pods[j].Namespace
		}
		return pods[i].Name < pods[j].Name
	})
}
