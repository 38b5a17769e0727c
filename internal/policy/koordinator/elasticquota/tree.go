package elasticquota

import (
	"encoding/json"
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kadmit/kadmit/internal/jsonedit"
	"github.com/kadmit/kadmit/internal/quantity"
)

// Labels and annotations of Koordinator's quota tree, as
// koordinator-sh/koordinator v1.8.0 apis/extension/elastic_quota.go:30-58
// names them.
const (
	Prefix = "quota.scheduling.koordinator.sh/"
	// LabelParent names the parent quota (label).
	LabelParent = Prefix + "parent"
	// LabelIsParent is "true" on quotas that may have children (label);
	// any other value, "yes" included, is a leaf (elastic_quota.go:69-71).
	LabelIsParent = Prefix + "is-parent"
	// LabelTreeID names the tree a quota belongs to (label).
	LabelTreeID = Prefix + "tree-id"
	// LabelIsRoot is "true" on the root of a quota tree: its min is not
	// checked against its parent's (label).
	LabelIsRoot = Prefix + "is-root"
	// LabelAllowForceUpdate "true" skips the min-sum checks (label).
	LabelAllowForceUpdate = Prefix + "allow-force-update"
	// AnnotationSharedWeight is a JSON ResourceList weighting how spare
	// capacity is shared between siblings (annotation).
	AnnotationSharedWeight = Prefix + "shared-weight"
	// AnnotationNamespaces is a JSON list of the namespaces whose pods the
	// quota accounts (annotation).
	AnnotationNamespaces = Prefix + "namespaces"
	// AnnotationAdmission is a JSON ResourceList: the limit a pod's quota
	// admission is checked against instead of spec.max (annotation).
	AnnotationAdmission = Prefix + "admission"
	// AnnotationMaxStrictCheckResourceKeys is a JSON list of resource names
	// whose spec.max must stay >= status.used (annotation).
	AnnotationMaxStrictCheckResourceKeys = Prefix + "max-strict-check-resource-keys"
	// LabelQuotaName binds a pod to a quota by name (label on pods).
	LabelQuotaName = Prefix + "name"
	// LabelPreemptible marks a pod preemptible or not (label on pods); it
	// cannot change on UPDATE.
	LabelPreemptible = Prefix + "preemptible"
)

// Koordinator's built-in quotas (elastic_quota.go:31-33).
const (
	DefaultRootQuota    = "koordinator-root-quota"
	DefaultSystemQuota  = "koordinator-system-quota"
	DefaultDefaultQuota = "koordinator-default-quota"
)

// Quota is one ElasticQuota as the tree sees it. Quotas are identified by
// name across namespaces, as Koordinator does.
type Quota struct {
	Namespace, Name string
	// Parent is the parent label as written; "" means the root quota.
	Parent           string
	IsParent         bool
	IsTreeRoot       bool
	AllowForceUpdate bool
	TreeID           string
	Min, Max         corev1.ResourceList
	// Used is status.used (read by the max-strict-check rule).
	Used corev1.ResourceList
	// Namespaces are the namespaces the quota claims; nil when the
	// annotation is absent, empty or not a JSON list of strings, as
	// upstream's GetAnnotationQuotaNamespaces (elastic_quota.go:118-131).
	Namespaces []string

	labels, annotations map[string]string
	minRaw, maxRaw      json.RawMessage
}

type object struct {
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Min json.RawMessage `json:"min"`
		Max json.RawMessage `json:"max"`
	} `json:"spec"`
	Status struct {
		Used json.RawMessage `json:"used"`
	} `json:"status"`
}

// Parse decodes an ElasticQuota's JSON. It is as lenient as upstream's
// informer: labels and annotations never make it fail (a bad is-parent is a
// leaf, bad namespaces JSON claims nothing); only malformed JSON or a
// quantity that is not one, or out of internal/quantity's range, is an
// error naming its field ("spec.max: cpu: ...").
func Parse(raw []byte) (*Quota, error) {
	var o object
	if err := jsonedit.Unmarshal(raw, &o); err != nil {
		return nil, fmt.Errorf("cannot parse the ElasticQuota: %w", err)
	}
	q := &Quota{Namespace: o.Namespace, Name: o.Name, Parent: o.Labels[LabelParent], TreeID: o.Labels[LabelTreeID],
		IsParent:         o.Labels[LabelIsParent] == "true",
		IsTreeRoot:       o.Labels[LabelIsRoot] == "true",
		AllowForceUpdate: o.Labels[LabelAllowForceUpdate] == "true",
		labels:           o.Labels, annotations: o.Annotations, minRaw: o.Spec.Min, maxRaw: o.Spec.Max}
	for _, f := range []struct {
		name string
		raw  json.RawMessage
		dst  *corev1.ResourceList
	}{{"spec.min", o.Spec.Min, &q.Min}, {"spec.max", o.Spec.Max, &q.Max}, {"status.used", o.Status.Used, &q.Used}} {
		l, err := parseList(f.raw)
		if err != nil {
			return nil, quantity.Prefix(f.name, err)
		}
		*f.dst = l
	}
	if v := o.Annotations[AnnotationNamespaces]; v != "" {
		var ns []string
		if json.Unmarshal([]byte(v), &ns) == nil {
			q.Namespaces = ns
		}
	}
	return q, nil
}

// parseList reads a JSON resource list through internal/quantity; absent
// and null are nil.
func parseList(raw json.RawMessage) (corev1.ResourceList, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var l quantity.List
	if err := jsonedit.Unmarshal(raw, &l); err != nil {
		return nil, err
	}
	return corev1.ResourceList(l), nil
}

// annotationList parses the JSON resource list in annotation key; ok is
// false when it is absent or empty.
func (q *Quota) annotationList(key string) (l corev1.ResourceList, ok bool, err error) {
	v := q.annotations[key]
	if v == "" {
		return nil, false, nil
	}
	l, err = parseList(json.RawMessage(v))
	return l, true, err
}

// Snapshot is an immutable view of every quota, indexed for the checks.
// The cached one is never changed: a check reads it and decides, so a
// denied or dry-run request leaves no trace.
type Snapshot struct {
	byName   map[string]*Quota
	byKey    map[string]*Quota   // namespace/name
	named    map[string]int      // name -> how many quotas carry it
	children map[string][]*Quota // parent label -> children, sorted by name
	claims   map[string]*Quota   // namespace -> quota claiming it
}

// NewSnapshot indexes quotas. Two quotas of one name (in two namespaces)
// are one node, the later in namespace order, as upstream's map keyed by
// name holds one (quota_handler.go:41). When two quotas claim one
// namespace, the one with the smaller name holds the claim.
func NewSnapshot(quotas []*Quota) *Snapshot {
	s := &Snapshot{byName: map[string]*Quota{}, byKey: map[string]*Quota{}, named: map[string]int{},
		children: map[string][]*Quota{}, claims: map[string]*Quota{}}
	sorted := append([]*Quota(nil), quotas...)
	sort.Slice(sorted, func(i, j int) bool {
		if sorted[i].Name != sorted[j].Name {
			return sorted[i].Name < sorted[j].Name
		}
		return sorted[i].Namespace < sorted[j].Namespace
	})
	for _, q := range sorted {
		s.byName[q.Name] = q
		s.byKey[q.Namespace+"/"+q.Name] = q
		s.named[q.Name]++
	}
	for _, q := range sorted {
		if q != s.byName[q.Name] {
			continue
		}
		s.children[q.Parent] = append(s.children[q.Parent], q)
		for _, ns := range q.Namespaces {
			if _, taken := s.claims[ns]; !taken {
				s.claims[ns] = q
			}
		}
	}
	return s
}

// All returns every quota node, sorted by name.
func (s *Snapshot) All() []*Quota {
	out := make([]*Quota, 0, len(s.byName))
	for _, q := range s.byName {
		out = append(out, q)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Get returns the quota named name, or nil.
func (s *Snapshot) Get(name string) *Quota { return s.byName[name] }

// GetIn returns the quota namespace/name, or nil.
func (s *Snapshot) GetIn(namespace, name string) *Quota { return s.byKey[namespace+"/"+name] }

// Count returns how many quotas (in any namespace) are named name.
func (s *Snapshot) Count(name string) int { return s.named[name] }

// Children returns the quotas whose parent label is name, sorted by name.
// The root quota's children are not indexed (no rule reads them).
func (s *Snapshot) Children(name string) []*Quota {
	if name == "" {
		return nil
	}
	return s.children[name]
}

// Claimant returns the quota whose namespaces annotation claims namespace,
// or nil.
func (s *Snapshot) Claimant(namespace string) *Quota { return s.claims[namespace] }
