package elasticquota

import (
	"context"
	"encoding/json"
	"fmt"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/jsonedit"
)

// Mutate defaults a new quota as upstream's fillQuotaDefaultInformation
// (koordinator v1.8.0 pkg/webhook/elasticquota/quota_topology.go:215-270):
//   - the root quota is left alone (216-218);
//   - an absent or empty parent label becomes the root quota (230-233);
//   - an empty tree-id label under a non-root parent is copied from the
//     parent when it has one; a parent the tree does not hold is a 400
//     "fill quota <name> failed, parent not exist" (236-245);
//   - an absent or empty shared-weight annotation becomes spec.max as JSON
//     ("null" without a max, as json.Marshal of a nil list) (251-254);
//   - otherwise shared-weight keys are reconciled with spec.max: a max key
//     it lacks is added with max's value, a key max lacks is dropped
//     (fixedSharedWeight, 319-342), and the annotation is rewritten only
//     then; shared-weight that is not a JSON resource list is a 400.
//
// Each default is one JSONPatch operation on the quota as sent; it returns
// none when nothing changes.
func (p *Policy) Mutate(_ context.Context, req *admission.Request) ([]jsonedit.Op, admission.Verdict) {
	if req.Operation != admissionv1.Create {
		return nil, admission.Allow()
	}
	q, err := Parse(req.Object.Raw)
	if err != nil {
		return nil, deny("%s: %v", Name, err)
	}
	if q.Name == p.cfg.RootQuota {
		return nil, admission.Allow()
	}
	doc := req.ObjectDoc()
	set := func(v any, path ...string) {
		if err == nil {
			err = doc.Set(v, path...)
		}
	}
	parent := q.Parent
	if parent == "" {
		parent = p.cfg.RootQuota
		set(parent, "metadata", "labels", LabelParent)
	}
	var warnings []string
	if q.TreeID == "" && parent != p.cfg.RootQuota {
		if p.cache == nil {
			warnings = append(warnings, offlineWarning)
		} else {
			pq := p.cache.Snapshot().Get(parent)
			if pq == nil {
				return nil, deny("fill quota %v failed, parent not exist", q.Name)
			}
			if pq.TreeID != "" {
				set(pq.TreeID, "metadata", "labels", LabelTreeID)
			}
		}
	}
	sw, present, perr := q.annotationList(AnnotationSharedWeight)
	switch {
	case !present:
		b, merr := json.Marshal(q.Max)
		if merr != nil {
			return nil, admission.Errored(0, fmt.Errorf("%s: encode shared-weight: %w", Name, merr))
		}
		set(string(b), "metadata", "annotations", AnnotationSharedWeight)
	case perr != nil:
		return nil, deny("fillDefaultQuotaInfo unmarshal sharedWeight failed:%v", perr)
	default:
		if sw == nil {
			sw = corev1.ResourceList{}
		}
		if fixSharedWeight(sw, q.Max) {
			b, merr := json.Marshal(sw)
			if merr != nil {
				return nil, admission.Errored(0, fmt.Errorf("%s: encode shared-weight: %w", Name, merr))
			}
			set(string(b), "metadata", "annotations", AnnotationSharedWeight)
		}
	}
	if err != nil {
		return nil, deny("%s: cannot edit the ElasticQuota: %v", Name, err)
	}
	return doc.Ops(), admission.Allow(warnings...)
}

// fixSharedWeight is upstream's fixedSharedWeight
// (quota_topology.go:319-342): it makes sharedWeight's keys max's, adding
// max's value for a missing key, and reports whether it changed anything.
func fixSharedWeight(sharedWeight, max corev1.ResourceList) bool {
	fixed := false
	for k, v := range max {
		if _, ok := sharedWeight[k]; !ok {
			sharedWeight[k] = v.DeepCopy()
			fixed = true
		}
	}
	for k := range sharedWeight {
		if _, ok := max[k]; !ok {
			delete(sharedWeight, k)
			fixed = true
		}
	}
	return fixed
}
