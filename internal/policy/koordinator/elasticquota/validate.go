package elasticquota

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/policy/shared/podrequest"
)

// Line numbers below are koordinator-sh/koordinator v1.8.0
// pkg/webhook/elasticquota/quota_topology.go (qt) and
// quota_topology_check.go (qtc).

// Validate checks an ElasticQuota write as upstream's QuotaMetaChecker
// (plugin_check_quota_meta_validate.go:72-95): CREATE is ValidAddQuota,
// UPDATE ValidUpdateQuota, DELETE ValidDeleteQuota. Every denial is a 400.
func (p *Policy) Validate(_ context.Context, req *admission.Request) admission.Verdict {
	if req.Operation == admissionv1.Delete {
		name := req.Name
		var old *Quota
		if len(req.OldObject.Raw) > 0 {
			var err error
			if old, err = Parse(req.OldObject.Raw); err != nil {
				return deny("%s: old object: %v", Name, err)
			}
			name = old.Name
		}
		return p.validDelete(name)
	}
	q, err := Parse(req.Object.Raw)
	if err != nil {
		return deny("%s: %v", Name, err)
	}
	if req.Operation == admissionv1.Update {
		old, err := Parse(req.OldObject.Raw)
		if err != nil {
			return deny("%s: old object: %v", Name, err)
		}
		return p.validUpdate(old, q)
	}
	return p.validAdd(q)
}

// validAdd is ValidAddQuota (qt:62-101): the name is not in the tree yet,
// no claimed namespace is claimed by another quota, the quota's own items
// hold, then the topology.
func (p *Policy) validAdd(q *Quota) admission.Verdict {
	if p.cache == nil {
		if v := p.validateSelfItem(q); !v.Allowed {
			return v
		}
		return admission.Allow(offlineWarning)
	}
	snap := p.cache.Snapshot()
	if snap.Get(q.Name) != nil {
		return deny("AddQuota quota already exist:%v", q.Name)
	}
	for _, ns := range q.Namespaces {
		if other := snap.Claimant(ns); other != nil {
			return deny("AddQuota quota %s's annotation namespace %s is already bound to quota %s", q.Name, ns, other.Name)
		}
	}
	if v := p.validateSelfItem(q); !v.Allowed {
		return v
	}
	return p.validateTopology(snap, nil, q, nil)
}

// validUpdate is ValidUpdateQuota (qt:103-157). A write that leaves the
// parent, is-parent and tree-id labels, the namespaces annotation and the
// spec as they were is admitted before any other check (qt:108-110,
// quotaFieldsCopy qtc:364-378): koord-scheduler's status and annotation
// updates pass even on the built-in quotas or an inconsistent tree.
func (p *Policy) validUpdate(old, q *Quota) admission.Verdict {
	if sameTreeFields(old, q) {
		return admission.Allow()
	}
	if p.forbiddenModify(q.Name) {
		return deny("invalid quota %s", q.Name)
	}
	if p.cache == nil {
		if v := p.validateSelfItem(q); !v.Allowed {
			return v
		}
		if old.TreeID != q.TreeID {
			return deny("%v tree id changed [%v] vs [%v]", q.Name, old.TreeID, q.TreeID)
		}
		return admission.Allow(offlineWarning)
	}
	snap := p.cache.Snapshot()
	for _, ns := range q.Namespaces {
		if other := snap.Claimant(ns); other != nil && other.Name != q.Name {
			return deny("UpdadteQuota, quota %s update namespaces, but namespace %s is already bound to quota %s", q.Name, ns, other.Name)
		}
	}
	current := snap.Get(q.Name)
	if current == nil {
		return deny("UpdateQuota quota not exist in quotaInfoMap:%v", q.Name)
	}
	if v := p.validateSelfItem(q); !v.Allowed {
		return v
	}
	return p.validateTopology(snap, current, q, old.Namespaces)
}

// sameTreeFields compares what quotaFieldsCopy keeps (qtc:364-378); an
// absent label or annotation equals an empty one there.
func sameTreeFields(a, b *Quota) bool {
	for _, l := range []string{LabelParent, LabelIsParent, LabelTreeID} {
		if a.labels[l] != b.labels[l] {
			return false
		}
	}
	return a.annotations[AnnotationNamespaces] == b.annotations[AnnotationNamespaces] &&
		jsonEqual(a.minRaw, b.minRaw) && jsonEqual(a.maxRaw, b.maxRaw)
}

// jsonEqual compares two JSON values semantically; absent equals null.
// Upstream compares the decoded resource.Quantity values with
// reflect.DeepEqual (qt:108), which tells 2^53+1 from 2^53; so numbers here
// compare by their literal text (json.Number), never through float64, which
// would call them equal and skip the checks upstream runs. Two spellings of
// one value ("1" and 1, 1 and 1.0) are a change here, and upstream's
// DeepEqual of differently scaled Quantities calls most of them one too;
// either way the update only goes through the full checks.
func jsonEqual(a, b json.RawMessage) bool {
	x, errX := decodeNumbers(a)
	y, errY := decodeNumbers(b)
	if errX != nil || errY != nil {
		return bytes.Equal(a, b)
	}
	return equality.Semantic.DeepEqual(x, y)
}

// decodeNumbers decodes raw (absent is null) keeping numbers as
// json.Number.
func decodeNumbers(raw json.RawMessage) (any, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	err := d.Decode(&v)
	return v, err
}

// validateSelfItem is validateQuotaSelfItem (qtc:39-88), in its order:
// max and min have no negative value; shared-weight, when set, is a JSON
// resource list with no negative value; every min key is in max with
// min <= max; for each key of max-strict-check-resource-keys that
// status.used has, max has it and max >= used.
func (p *Policy) validateSelfItem(q *Quota) admission.Verdict {
	if n := negative(q.Max); len(n) > 0 {
		return deny("%v quota.Spec.Max's value < 0, in dimensions :%v", q.Name, names(n))
	}
	if n := negative(q.Min); len(n) > 0 {
		return deny("%v quota.Spec.Min's value < 0, in dimensions :%v", q.Name, names(n))
	}
	sw, _, err := q.annotationList(AnnotationSharedWeight)
	if err != nil {
		return deny("%v quota.Annotation[%v]: %v", q.Name, AnnotationSharedWeight, err)
	}
	if n := negative(sw); len(n) > 0 {
		return deny("%v quota.Annotation[%v]'s value < 0, in dimension :%v", q.Name, AnnotationSharedWeight, names(n))
	}
	for _, k := range keys(q.Min) {
		mx, ok := q.Max[k]
		if !ok {
			return deny("resourceKey %v of quota %v is included in min, which is not included in max", k, q.Name)
		}
		if mn := q.Min[k]; mx.Cmp(mn) < 0 {
			return deny("resourceKey %v of quota %v min %v > max %v", k, q.Name, mn.String(), mx.String())
		}
	}
	if v := q.annotations[AnnotationMaxStrictCheckResourceKeys]; v != "" {
		var strict []corev1.ResourceName
		if err := json.Unmarshal([]byte(v), &strict); err != nil {
			return deny("%v quota.Annotation[%v]'s value is invalid: %v", q.Name, AnnotationMaxStrictCheckResourceKeys, err)
		}
		for _, k := range strict {
			used, ok := q.Used[k]
			if !ok {
				continue
			}
			mx, ok := q.Max[k]
			if !ok {
				return deny("resourceKey %v of quota %v is included in used, which is not included in max but should check max >= used", k, q.Name)
			}
			if mx.Cmp(used) < 0 {
				return deny("resourceKey %v of quota %v max %v < used %v", k, q.Name, mx.String(), used.String())
			}
		}
	}
	return admission.Allow()
}

// validateTopology is validateQuotaTopology (qtc:92-129). snap is the tree
// before the write; current is the tree's node for q on UPDATE (nil on
// CREATE); oldNamespaces are the request's old namespaces annotation.
func (p *Policy) validateTopology(snap *Snapshot, current, q *Quota, oldNamespaces []string) admission.Verdict {
	if q.Name == p.cfg.RootQuota {
		return admission.Allow()
	}
	parent := p.parentOf(q)
	// checkIsParentChange (qtc:163-184).
	if current != nil && current.IsParent != q.IsParent {
		if len(snap.Children(current.Name)) > 0 && !q.IsParent {
			return deny("quota has children, isParent is forbidden to modify as false, quotaName:%v", current.Name)
		}
		if q.IsParent && p.hasBoundPods(current.Name, oldNamespaces) {
			return deny("quota has bound pods, isParent is forbidden to modify as true, quotaName: %v", current.Name)
		}
	}
	// checkTreeID (qtc:131-161).
	if current != nil && current.TreeID != q.TreeID {
		return deny("%v tree id changed [%v] vs [%v]", q.Name, current.TreeID, q.TreeID)
	}
	if parent != p.cfg.RootQuota {
		if pq := snap.Get(parent); pq != nil && pq.TreeID != q.TreeID {
			return deny("%v tree id is different from parent %v, [%v] vs [%v]", q.Name, pq.Name, q.TreeID, pq.TreeID)
		}
	}
	for _, c := range snap.Children(q.Name) {
		if c.TreeID != q.TreeID {
			return deny("%v tree id is different from child %v, [%v] vs [%v]", q.Name, c.Name, q.TreeID, c.TreeID)
		}
	}
	// qtc:105-108: a leaf under the root needs nothing more.
	if parent == p.cfg.RootQuota && !q.IsParent {
		return admission.Allow()
	}
	if p.cfg.DenyParentCycles {
		if v := p.checkCycle(snap, q, parent); !v.Allowed {
			return v
		}
	}
	// checkParentQuotaInfo (qtc:187-201).
	if parent != p.cfg.RootQuota {
		pq := snap.Get(parent)
		if pq == nil {
			return deny("%v has parentName %v but not find parentInfo in quotaInfoMap", q.Name, parent)
		}
		if !pq.IsParent {
			return deny("%v has parentName %v but the parentQuotaInfo's IsParent is false", q.Name, parent)
		}
	}
	// checkSubAndParentGroupQuotaKey (qtc:209-260).
	if v := p.checkQuotaKeys(snap, q, parent); !v.Allowed {
		return v
	}
	// checkMinQuotaValidate (qtc:265-303).
	return p.checkMinSums(snap, q, parent)
}

// checkQuotaKeys: max keys equal the parent's and each child's (with
// enableUpdateResourceKey: included in the parent's, each child's included
// in this one's); min keys are included in the parent's, each child's min
// keys in this one's.
func (p *Policy) checkQuotaKeys(snap *Snapshot, q *Quota, parent string) admission.Verdict {
	const pre = "failed to check sub and parent group quotaKey, err: checkSubAndParentGroupQuotaKey failed: "
	if parent != p.cfg.RootQuota {
		pq := snap.Get(parent)
		if p.cfg.EnableUpdateResourceKey {
			if !keysIncluded(pq.Max, q.Max) {
				return deny(pre+"%v's max keys are not all included in %v's", q.Name, parent)
			}
		} else if !sameKeys(pq.Max, q.Max) {
			return deny(pre+"%v's max keys are not the same with %v's", parent, q.Name)
		}
		if !keysIncluded(pq.Min, q.Min) {
			return deny(pre+"%v's min keys are not all included in %v's", q.Name, parent)
		}
	}
	for _, c := range snap.Children(q.Name) {
		if p.cfg.EnableUpdateResourceKey {
			if !keysIncluded(q.Max, c.Max) {
				return deny(pre+"%v's max keys are not all included in %v's", c.Name, q.Name)
			}
		} else if !sameKeys(q.Max, c.Max) {
			return deny(pre+"%v's max keys are not the same with %v's", c.Name, q.Name)
		}
		if !keysIncluded(q.Min, c.Min) {
			return deny(pre+"%v's min keys are not all included in %v's", c.Name, q.Name)
		}
	}
	return admission.Allow()
}

// checkMinSums: skipped with allow-force-update or is-root; the siblings'
// min plus this min fit in the parent's min; the children's min fit in
// this min.
func (p *Policy) checkMinSums(snap *Snapshot, q *Quota, parent string) admission.Verdict {
	if q.AllowForceUpdate || q.IsTreeRoot {
		return admission.Allow()
	}
	if parent != p.cfg.RootQuota {
		sum := corev1.ResourceList{}
		for _, s := range snap.Children(parent) {
			if s.Name != q.Name {
				podrequest.Add(sum, s.Min)
			}
		}
		podrequest.Add(sum, q.Min)
		if !lessOrEqualCompletely(sum, snap.Get(parent).Min) {
			return deny("checkMinQuotaSum all brothers' MinQuota > parent MinQuota, parent: %v", parent)
		}
	}
	if children := snap.Children(q.Name); len(children) > 0 {
		sum := corev1.ResourceList{}
		for _, c := range children {
			podrequest.Add(sum, c.Min)
		}
		if !lessOrEqualCompletely(sum, q.Min) {
			return deny("checkMinQuotaSum all children's MinQuota > current MinQuota, current: %v", q.Name)
		}
	}
	return admission.Allow()
}

// checkCycle (denyParentCycles, kadmit's own): the parent is neither the
// quota nor one of its descendants. The walk is bounded by the tree's size.
func (p *Policy) checkCycle(snap *Snapshot, q *Quota, parent string) admission.Verdict {
	if parent == q.Name {
		return deny("ElasticQuota %s: cannot be its own parent", q.Name)
	}
	for a, seen := snap.Get(parent), 0; a != nil && seen <= len(snap.byName); seen++ {
		if p.parentOf(a) == q.Name {
			return deny("ElasticQuota %s: parent %s is its own descendant", q.Name, parent)
		}
		a = snap.Get(p.parentOf(a))
	}
	return admission.Allow()
}

// validDelete is ValidDeleteQuota (qt:159-212): the root, system and
// default quotas cannot be deleted; the quota is in the tree, has no child
// quota and no pod labelled with its name (in any phase: upstream lists
// every pod of the label index, qt:181-202).
func (p *Policy) validDelete(name string) admission.Verdict {
	if name == p.cfg.SystemQuota || name == p.cfg.RootQuota || name == p.cfg.DefaultQuota {
		return deny("can not delete quotaGroup :%v", name)
	}
	if p.cache == nil {
		return admission.Allow(offlineWarning)
	}
	snap := p.cache.Snapshot()
	if snap.Get(name) == nil {
		return deny("not found quota:%v", name)
	}
	if c := snap.Children(name); len(c) > 0 {
		return deny("delete quota failed, quota %v has %d child quotas", name, len(c))
	}
	pods := p.cache.PodsWithQuotaLabel(name)
	if len(pods) > 0 {
		sortPods(pods)
		var shown []string
		if len(pods) <= 2 {
			for _, pod := range pods {
				shown = append(shown, pod.Name)
			}
		} else {
			shown = append(shown, pods[0].Name, pods[1].Name, "...")
		}
		return deny("delete quota failed, quota %v has %d child pods: %s", name, len(pods), strings.Join(shown, ", "))
	}
	return admission.Allow()
}
