package elasticquota

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kadmit/kadmit/internal/quantity"
)

// Labels and annotations of Koordinator's quota tree.
const (
	Prefix = "quota.scheduling.koordinator.sh/"
	// LabelParent names the parent quota (label).
	LabelParent = Prefix + "parent"
	// LabelIsParent is "true" on quotas that may have children (label).
	LabelIsParent = Prefix + "is-parent"
	// LabelTreeID names the tree a quota belongs to (label).
	LabelTreeID = Prefix + "tree-id"
	// AnnotationSharedWeight is a JSON ResourceList weighting how spare
	// capacity is shared between siblings (annotation).
	AnnotationSharedWeight = Prefix + "shared-weight"
	// AnnotationNamespaces is a JSON list of the namespaces whose pods the
	// quota accounts (annotation).
	AnnotationNamespaces = Prefix + "namespaces"
	// LabelQuotaName binds a pod to a quota by name (label on pods).
	LabelQuotaName = Prefix + "name"
)

// Koordinator's built-in quotas.
const (
	DefaultRootQuota   = "koordinator-root-quota"
	DefaultSystemQuota = "koordinator-system-quota"
)

// Quota is one ElasticQuota as the tree sees it. Quotas are identified by
// name across namespaces, as Koordinator does.
type Quota struct {
	Namespace, Name string
	Parent          string // "" only before defaulting
	IsParent        bool
	TreeID          string
	Min, Max        corev1.ResourceList
	// SharedWeight is nil when the annotation is absent.
	SharedWeight corev1.ResourceList
	// Namespaces are the namespaces the quota claims.
	Namespaces []string

	labels, annotations map[string]string
	spec                json.RawMessage
}

type object struct {
	metav1.ObjectMeta `json:"metadata"`
	Spec              json.RawMessage `json:"spec"`
}

// spec is what Parse reads of an ElasticQuota's spec; quantity.List parses
// through internal/quantity, so an out-of-range min or max is an error
// naming it ("spec: max.cpu: quantity 1e9999999 is out of range (...)").
type spec struct {
	Min quantity.List `json:"min,omitempty"`
	Max quantity.List `json:"max,omitempty"`
}

// Parse decodes an ElasticQuota's JSON. Errors name the field: a bad
// is-parent value, shared-weight or namespaces annotation, or quantity.
func Parse(raw []byte) (*Quota, error) {
	var o object
	if err := json.Unmarshal(raw, &o); err != nil {
		return nil, fmt.Errorf("cannot parse the ElasticQuota: %w", err)
	}
	var s spec
	if len(o.Spec) > 0 && string(o.Spec) != "null" {
		var raw struct{ Min, Max json.RawMessage }
		if err := json.Unmarshal(o.Spec, &raw); err != nil {
			return nil, fmt.Errorf("spec: %w", err)
		}
		for _, f := range []struct {
			name string
			raw  json.RawMessage
			dst  *quantity.List
		}{{"spec.min", raw.Min, &s.Min}, {"spec.max", raw.Max, &s.Max}} {
			if len(f.raw) > 0 {
				if err := json.Unmarshal(f.raw, f.dst); err != nil {
					return nil, quantity.Prefix(f.name, err)
				}
			}
		}
	}
	q := &Quota{Namespace: o.Namespace, Name: o.Name, Parent: o.Labels[LabelParent], TreeID: o.Labels[LabelTreeID],
		Min: corev1.ResourceList(s.Min), Max: corev1.ResourceList(s.Max), labels: o.Labels, annotations: o.Annotations, spec: o.Spec}
	if v, ok := o.Labels[LabelIsParent]; ok {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return nil, fmt.Errorf("label %s: %q is not true or false", LabelIsParent, v)
		}
		q.IsParent = b
	}
	if v, ok := o.Annotations[AnnotationSharedWeight]; ok {
		var l quantity.List
		err := json.Unmarshal([]byte(v), &l)
		q.SharedWeight = corev1.ResourceList(l)
		if err != nil {
			return nil, fmt.Errorf("annotation %s: must be a JSON resource list like {\"cpu\":\"4\"}: %w", AnnotationSharedWeight, err)
		}
	}
	if v, ok := o.Annotations[AnnotationNamespaces]; ok {
		if err := json.Unmarshal([]byte(v), &q.Namespaces); err != nil {
			return nil, fmt.Errorf("annotation %s: must be a JSON list of namespaces like [\"a\",\"b\"]: %w", AnnotationNamespaces, err)
		}
	}
	return q, nil
}

// Snapshot is an immutable view of every quota, indexed for the checks.
// Checks that ask "what if" build a new Snapshot with With and never change
// the cached one, so a denied or dry-run request leaves no trace.
type Snapshot struct {
	byName   map[string]*Quota
	children map[string][]*Quota // parent name -> children, sorted by name
	claims   map[string]*Quota   // namespace -> quota claiming it
	homes    map[string][]*Quota // namespace -> quotas living in it, sorted
}

// NewSnapshot indexes quotas. When two quotas claim one namespace, the one
// with the smaller name holds the claim (validation refuses the second, so
// this only arises from objects written while kadmit was not looking).
func NewSnapshot(quotas []*Quota) *Snapshot {
	s := &Snapshot{byName: map[string]*Quota{}, children: map[string][]*Quota{}, claims: map[string]*Quota{}, homes: map[string][]*Quota{}}
	sorted := append([]*Quota(nil), quotas...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	for _, q := range sorted {
		s.byName[q.Name] = q
	}
	for _, q := range sorted {
		if q != s.byName[q.Name] {
			continue
		}
		if q.Parent != "" {
			s.children[q.Parent] = append(s.children[q.Parent], q)
		}
		for _, ns := range q.Namespaces {
			if _, taken := s.claims[ns]; !taken {
				s.claims[ns] = q
			}
		}
		s.homes[q.Namespace] = append(s.homes[q.Namespace], q)
	}
	return s
}

// All returns every quota, sorted by name.
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

// Children returns the quotas whose parent is name, sorted by name.
func (s *Snapshot) Children(name string) []*Quota { return s.children[name] }

// With returns a new snapshot in which q replaces the quota of its name (or
// is added); without(name) removes it when q is nil.
func (s *Snapshot) With(name string, q *Quota) *Snapshot {
	all := make([]*Quota, 0, len(s.byName)+1)
	for n, x := range s.byName {
		if n != name {
			all = append(all, x)
		}
	}
	if q != nil {
		all = append(all, q)
	}
	return NewSnapshot(all)
}

// QuotaFor returns the name of the quota a pod in namespace with the given
// labels is accounted to, or "": the quota named by its
// quota.scheduling.koordinator.sh/name label; else the quota whose
// namespaces annotation claims the namespace; else the first quota (by
// name) that lives in the namespace.
func (s *Snapshot) QuotaFor(namespace string, podLabels map[string]string) string {
	if n := podLabels[LabelQuotaName]; n != "" {
		return n
	}
	if q := s.claims[namespace]; q != nil {
		return q.Name
	}
	if h := s.homes[namespace]; len(h) > 0 {
		return h[0].Name
	}
	return ""
}

// namespacesOf returns the namespaces whose unlabelled pods fall to name.
func (s *Snapshot) namespacesOf(name string) []string {
	q := s.byName[name]
	if q == nil {
		return nil
	}
	var out []string
	for _, ns := range q.Namespaces {
		if s.claims[ns] == q {
			out = append(out, ns)
		}
	}
	if _, claimed := s.claims[q.Namespace]; !claimed && len(s.homes[q.Namespace]) > 0 && s.homes[q.Namespace][0] == q {
		out = append(out, q.Namespace)
	}
	return out
}
