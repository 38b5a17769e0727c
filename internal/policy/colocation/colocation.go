// Package colocation implements the colocation policy, kadmit's version of
// Koordinator's ClusterColocationProfile: profiles from the configuration
// that stamp labels, annotations, a scheduler, a priority class, tolerations
// and node selector entries onto the pods they select at CREATE, so that
// batch pods land on the colocated nodes with the right QoS without every
// team editing its manifests.
package colocation

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/jsonedit"
	"github.com/kadmit/kadmit/internal/policy/resourceflavor"
)

// The policy states its change as JSONPatch operations.
var _ admission.Mutator = (*Policy)(nil)

// Name is the policy's name (policies.colocation in the configuration).
const Name = "colocation"

// Path is the mutating hook's path, shared with the lifespan policy.
const Path = "/mutate-pod"

// Config is the colocation policy's configuration (policies.colocation).
type Config struct {
	// Profiles are applied in list order to every pod they match.
	Profiles []Profile `json:"profiles,omitempty"`
}

// Profile is one colocation profile.
type Profile struct {
	// Name identifies the profile in messages and in the
	// kadmit.io/colocation-profiles annotation; unique, a DNS label.
	Name string `json:"name"`
	// NamespaceSelector selects by the labels of the pod's namespace; nil
	// matches every namespace.
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`
	// Selector selects by the pod's labels; nil matches every pod.
	Selector *metav1.LabelSelector `json:"selector,omitempty"`
	// Labels and Annotations are set on the pod.
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
	// SchedulerName and PriorityClassName are set when non-empty.
	SchedulerName     string `json:"schedulerName,omitempty"`
	PriorityClassName string `json:"priorityClassName,omitempty"`
	// Tolerations are appended unless the pod already has an equal one.
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
	// NodeSelector entries are set on spec.nodeSelector.
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	// Overwrite lets the profile replace a label, annotation, node selector
	// entry, schedulerName or priorityClassName the pod (or an earlier
	// profile) already set. Without it the pod's value wins.
	Overwrite bool `json:"overwrite,omitempty"`
}

// DefaultConfig is the seed profile: disabled, no profiles.
func DefaultConfig() Config { return Config{} }

// Validate reports the first problem as "<field>: <problem>".
func (c Config) Validate() error {
	seen := map[string]bool{}
	for i, p := range c.Profiles {
		path := fmt.Sprintf("profiles[%d]", i)
		if errs := validation.IsDNS1123Label(p.Name); len(errs) > 0 {
			return fmt.Errorf("%s.name: %q: %s", path, p.Name, errs[0])
		}
		if seen[p.Name] {
			return fmt.Errorf("%s.name: duplicate profile %q", path, p.Name)
		}
		seen[p.Name] = true
		if _, err := selector(p.NamespaceSelector); err != nil {
			return fmt.Errorf("%s.namespaceSelector: %w", path, err)
		}
		if _, err := selector(p.Selector); err != nil {
			return fmt.Errorf("%s.selector: %w", path, err)
		}
		for _, m := range []struct {
			field string
			kv    map[string]string
			value bool
		}{{"labels", p.Labels, true}, {"annotations", p.Annotations, false}, {"nodeSelector", p.NodeSelector, true}} {
			for k, v := range m.kv {
				if errs := validation.IsQualifiedName(k); len(errs) > 0 {
					return fmt.Errorf("%s.%s: key %q: %s", path, m.field, k, errs[0])
				}
				if m.value {
					if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
						return fmt.Errorf("%s.%s[%s]: value %q: %s", path, m.field, k, v, errs[0])
					}
				}
			}
		}
		if p.SchedulerName != "" {
			if errs := validation.IsDNS1123Subdomain(p.SchedulerName); len(errs) > 0 {
				return fmt.Errorf("%s.schedulerName: %q: %s", path, p.SchedulerName, errs[0])
			}
		}
		if p.PriorityClassName != "" {
			if errs := validation.IsDNS1123Subdomain(p.PriorityClassName); len(errs) > 0 {
				return fmt.Errorf("%s.priorityClassName: %q: %s", path, p.PriorityClassName, errs[0])
			}
		}
		for j, t := range p.Tolerations {
			if err := resourceflavor.ValidateToleration(t); err != nil {
				return fmt.Errorf("%s.tolerations[%d].%w", path, j, err)
			}
		}
	}
	return nil
}

func selector(s *metav1.LabelSelector) (labels.Selector, error) {
	if s == nil {
		return labels.Everything(), nil
	}
	return metav1.LabelSelectorAsSelector(s)
}

// Namespaces returns the labels of a namespace from an informer cache; ok
// is false when the namespace is not in the cache.
type Namespaces interface {
	NamespaceLabels(name string) (map[string]string, bool)
}

// ProfilesAnnotation lists, comma-separated, the profiles applied to a pod.
const ProfilesAnnotation = "kadmit.io/colocation-profiles"

type compiled struct {
	Profile
	ns, pod labels.Selector
}

// Policy is the colocation policy.
type Policy struct {
	cfg        Config
	profiles   []compiled
	namespaces Namespaces
	// needsNamespaceLabels is true when some profile's namespace selector
	// reads more than the name label the API server puts on every namespace.
	needsNamespaceLabels bool
}

// New validates cfg and builds the policy. namespaces is nil offline: then a
// namespace's only label is kubernetes.io/metadata.name (which the API server
// sets on every namespace), and a profile whose namespaceSelector needs other
// labels does not match, with a warning.
func New(cfg Config, namespaces Namespaces) (*Policy, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	p := &Policy{cfg: cfg, namespaces: namespaces}
	for _, pr := range cfg.Profiles {
		ns, _ := selector(pr.NamespaceSelector)
		pod, _ := selector(pr.Selector)
		p.profiles = append(p.profiles, compiled{Profile: pr, ns: ns, pod: pod})
		if pr.NamespaceSelector != nil {
			p.needsNamespaceLabels = true
		}
	}
	return p, nil
}

// Hooks returns the mutating hook: pods CREATE on /mutate-pod, failurePolicy
// Ignore unless configured.
func (p *Policy) Hooks() []admission.Hook {
	fp := admissionregistrationv1.Ignore
	return []admission.Hook{{
		Policy: Name, Path: Path, Type: admission.Mutating,
		Rules: []admissionregistrationv1.RuleWithOperations{{
			Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
			Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
		}},
		FailurePolicy: fp,
		Mutator:       p,
	}}
}

// Mutate applies every matching profile, in configuration order, to a pod
// being created. A profile sets a field only when the pod leaves it empty
// (for maps: per key), unless it says overwrite: true; so with two matching
// profiles the earlier one wins a conflict unless the later overwrites.
// Tolerations are appended when no equal toleration is present. The names of
// the applied profiles are recorded in kadmit.io/colocation-profiles. The
// result is the same when applied twice. The change is one JSONPatch
// operation per label, annotation and node selector entry set, per scalar
// field changed and per toleration added, in that order, on the pod as sent
// (the rest of it is neither decoded nor re-encoded); none when nothing
// changes.
func (p *Policy) Mutate(_ context.Context, req *admission.Request) ([]jsonedit.Op, admission.Verdict) {
	if req.Operation != admissionv1.Create || len(p.profiles) == 0 {
		return nil, admission.Allow()
	}
	doc := jsonedit.NewDoc(req.Object.Raw)
	var pod podFields
	for _, f := range []struct {
		v    any
		path []string
	}{
		{&pod.namespace, []string{"metadata", "namespace"}},
		{&pod.labels, []string{"metadata", "labels"}},
		{&pod.annotations, []string{"metadata", "annotations"}},
		{&pod.nodeSelector, []string{"spec", "nodeSelector"}},
		{&pod.schedulerName, []string{"spec", "schedulerName"}},
		{&pod.priorityClassName, []string{"spec", "priorityClassName"}},
		{&pod.priority, []string{"spec", "priority"}},
		{&pod.tolerations, []string{"spec", "tolerations"}},
	} {
		if _, err := doc.Decode(f.v, f.path...); err != nil {
			return nil, admission.Invalid("%s: cannot parse the pod: %v", Name, err)
		}
	}
	ns := req.Namespace
	if ns == "" {
		ns = pod.namespace
	}
	nsLabels, warn := p.namespaceLabels(ns)
	var warnings []string
	if warn != "" {
		warnings = append(warnings, warn)
	}
	podLabels := labels.Set(pod.labels)
	// want is the pod as the profiles leave it; pod stays as sent.
	want := podFields{labels: maps.Clone(pod.labels), annotations: maps.Clone(pod.annotations), nodeSelector: maps.Clone(pod.nodeSelector),
		schedulerName: pod.schedulerName, priorityClassName: pod.priorityClassName, priority: pod.priority}
	var applied []string
	for i := range p.profiles {
		pr := &p.profiles[i]
		// Selectors see the pod as submitted: a profile's labels do not make
		// a later profile match, so the order only settles conflicts.
		if !pr.ns.Matches(labels.Set(nsLabels)) || !pr.pod.Matches(podLabels) {
			continue
		}
		applied = append(applied, pr.Name)
		setMap(&want.labels, pr.Labels, pr.Overwrite)
		setMap(&want.annotations, pr.Annotations, pr.Overwrite)
		setMap(&want.nodeSelector, pr.NodeSelector, pr.Overwrite)
		// The API server fills in default-scheduler before webhooks run, so
		// that value means "not chosen" and may be replaced.
		if cur := want.schedulerName; pr.SchedulerName != "" && cur != pr.SchedulerName &&
			(cur == "" || cur == corev1.DefaultSchedulerName || pr.Overwrite) {
			want.schedulerName = pr.SchedulerName
		}
		if pr.PriorityClassName != "" && want.priorityClassName != pr.PriorityClassName &&
			(want.priorityClassName == "" || pr.Overwrite) {
			want.priorityClassName = pr.PriorityClassName
			// The Priority admission plugin resolves the class into
			// spec.priority after webhooks; a stale number would be refused.
			want.priority = nil
		}
		for _, t := range pr.Tolerations {
			if !hasToleration(pod.tolerations, t) && !hasToleration(want.tolerations, t) {
				want.tolerations = append(want.tolerations, t)
			}
		}
	}
	if len(applied) == 0 {
		return nil, admission.Allow(warnings...)
	}
	setMap(&want.annotations, map[string]string{ProfilesAnnotation: strings.Join(applied, ",")}, true)
	if err := edit(doc, &pod, &want); err != nil {
		return nil, admission.Invalid("%s: cannot edit the pod: %v", Name, err)
	}
	return doc.Ops(), admission.Allow(warnings...)
}

// podFields is what colocation reads of a pod, and, as the profiles leave
// it, what it changes (tolerations then holds only the added ones).
type podFields struct {
	namespace                        string
	labels, annotations              map[string]string
	nodeSelector                     map[string]string
	schedulerName, priorityClassName string
	priority                         *int32
	tolerations                      []corev1.Toleration
}

// edit states the difference from pod to want as operations on doc:
// map entries in key order, then the scalars, then the added tolerations.
func edit(doc *jsonedit.Doc, pod, want *podFields) error {
	var err error
	set := func(v any, path ...string) {
		if err == nil {
			err = doc.Set(v, path...)
		}
	}
	for _, m := range []struct {
		have, want map[string]string
		path       []string
	}{
		{pod.labels, want.labels, []string{"metadata", "labels"}},
		{pod.annotations, want.annotations, []string{"metadata", "annotations"}},
		{pod.nodeSelector, want.nodeSelector, []string{"spec", "nodeSelector"}},
	} {
		for _, k := range slices.Sorted(maps.Keys(m.want)) {
			if v, ok := m.have[k]; !ok || v != m.want[k] {
				set(m.want[k], append(m.path, k)...)
			}
		}
	}
	if want.schedulerName != pod.schedulerName {
		set(want.schedulerName, "spec", "schedulerName")
	}
	if want.priorityClassName != pod.priorityClassName {
		set(want.priorityClassName, "spec", "priorityClassName")
	}
	if want.priority == nil && pod.priority != nil && err == nil {
		err = doc.Remove("spec", "priority")
	}
	if len(want.tolerations) > 0 && err == nil {
		add := make([]any, len(want.tolerations))
		for i, t := range want.tolerations {
			add[i] = t
		}
		err = doc.Append([]string{"spec", "tolerations"}, add...)
	}
	return err
}

func (p *Policy) namespaceLabels(ns string) (map[string]string, string) {
	base := map[string]string{corev1.LabelMetadataName: ns}
	if !p.needsNamespaceLabels {
		return base, ""
	}
	if p.namespaces == nil {
		return base, fmt.Sprintf("%s: namespace labels unknown offline; only %s is matched", Name, corev1.LabelMetadataName)
	}
	if l, ok := p.namespaces.NamespaceLabels(ns); ok {
		return l, ""
	}
	return base, fmt.Sprintf("%s: namespace %q not in kadmit's cache yet; only its name is matched", Name, ns)
}

func setMap(dst *map[string]string, src map[string]string, overwrite bool) {
	for k, v := range src {
		cur, ok := (*dst)[k]
		if ok && (cur == v || !overwrite) {
			continue
		}
		if *dst == nil {
			*dst = map[string]string{}
		}
		(*dst)[k] = v
	}
}

func hasToleration(ts []corev1.Toleration, t corev1.Toleration) bool {
	for _, have := range ts {
		if equality.Semantic.DeepEqual(have, t) {
			return true
		}
	}
	return false
}
