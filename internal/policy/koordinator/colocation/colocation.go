// Package colocation implements the colocation policy, kadmit's version of
// Koordinator's ClusterColocationProfile webhooks (koordinator-sh/koordinator
// v1.8.0 pkg/webhook/pod/mutating/cluster_colocation_profile.go and
// pkg/webhook/pod/validating/cluster_colocation_profile.go): profiles from
// the configuration stamp labels, annotations, a scheduler, a priority class
// and a QoS class onto the pods they select at CREATE and turn a batch pod's
// cpu and memory into kubernetes.io/batch-cpu and batch-memory; the
// validating half keeps QoS, priority class and resources consistent on
// every pod CREATE and UPDATE.
//
// The profile engine (Profiles, Object) is shared with the reservation
// policy, which applies the same kind of profiles to Reservations.
package colocation

import (
	"cmp"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/kadmit/kadmit/internal/jsonedit"
	"github.com/kadmit/kadmit/internal/policy/shared/toleration"
)

// Profile is one colocation profile: the spec of Koordinator's
// ClusterColocationProfile (apis/config/v1alpha1/cluster_colocation_profile_types.go:29-107)
// plus its name, with three kadmit additions (tolerations, nodeSelector,
// keepExisting) that do nothing unless set.
type Profile struct {
	// Name identifies the profile; profiles apply in name order
	// (cluster_colocation_profile.go:90-93). Unique, a DNS label.
	Name string `json:"name"`
	// NamespaceSelector selects by the labels of the pod's namespace; nil or
	// empty matches every namespace. Reservations ignore it.
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`
	// Selector selects by the object's labels as submitted; nil or empty
	// matches every object.
	Selector *metav1.LabelSelector `json:"selector,omitempty"`
	// Probability is the chance, an integer or a percentage of 100, that a
	// matching profile applies; nil is 100.
	Probability *intstr.IntOrString `json:"probability,omitempty"`
	// QoSClass sets the koordinator.sh/qosClass label: LSE, LSR, LS, BE or
	// SYSTEM.
	QoSClass string `json:"qosClass,omitempty"`
	// PriorityClassName sets spec.priorityClassName and, from the
	// PriorityClass, spec.priority and spec.preemptionPolicy.
	PriorityClassName string `json:"priorityClassName,omitempty"`
	// KoordinatorPriority sets the koordinator.sh/priority label.
	KoordinatorPriority *int32 `json:"koordinatorPriority,omitempty"`
	// Labels and Annotations are set on the object.
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
	// LabelKeysMapping sets labels[new] = labels[old] ("" when old is
	// absent) for each old: new; AnnotationKeysMapping the same for
	// annotations. Applied in key order.
	LabelKeysMapping      map[string]string `json:"labelKeysMapping,omitempty"`
	AnnotationKeysMapping map[string]string `json:"annotationKeysMapping,omitempty"`
	// LabelSuffixes appends the suffix to each label the object has.
	LabelSuffixes map[string]string `json:"labelSuffixes,omitempty"`
	// SchedulerName sets spec.schedulerName.
	SchedulerName string `json:"schedulerName,omitempty"`
	// SkipUpdateResources is upstream's profile annotation
	// config.koordinator.sh/skip-update-resources
	// (apis/extension/cluster_colocation_profile.go:24-37): when a matching
	// profile has it, cpu and memory are not translated.
	SkipUpdateResources bool `json:"skipUpdateResources,omitempty"`

	// Tolerations (kadmit) are appended unless the pod has an equal one.
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
	// NodeSelector (kadmit) entries are set on spec.nodeSelector.
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	// KeepExisting (kadmit, off by default) keeps a label, annotation, node
	// selector entry, schedulerName (other than default-scheduler) or
	// priorityClassName the object already has, where upstream overwrites.
	KeepExisting bool `json:"keepExisting,omitempty"`
}

// ProfilesAnnotation lists, comma-separated, the profiles applied to an
// object when recordProfiles is on.
const ProfilesAnnotation = "kadmit.io/colocation-profiles"

// ValidateProfiles reports the first problem of ps as
// "profiles[i].<field>: <problem>".
func ValidateProfiles(ps []Profile) error {
	seen := map[string]bool{}
	for i, p := range ps {
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
		if p.Probability != nil {
			if _, err := intstr.GetScaledValueFromIntOrPercent(p.Probability, 100, false); err != nil {
				return fmt.Errorf("%s.probability: %w", path, err)
			}
		}
		if p.QoSClass != "" && qosByName(p.QoSClass) == QoSNone {
			return fmt.Errorf("%s.qosClass: %q: must be one of LSE, LSR, LS, BE, SYSTEM", path, p.QoSClass)
		}
		for _, m := range []struct {
			field         string
			kv            map[string]string
			value, keyVal bool
		}{
			{"labels", p.Labels, true, false}, {"annotations", p.Annotations, false, false},
			{"nodeSelector", p.NodeSelector, true, false},
			{"labelKeysMapping", p.LabelKeysMapping, false, true}, {"annotationKeysMapping", p.AnnotationKeysMapping, false, true},
			{"labelSuffixes", p.LabelSuffixes, false, false},
		} {
			for k, v := range m.kv {
				if errs := validation.IsQualifiedName(k); len(errs) > 0 {
					return fmt.Errorf("%s.%s: key %q: %s", path, m.field, k, errs[0])
				}
				if m.keyVal {
					if errs := validation.IsQualifiedName(v); len(errs) > 0 {
						return fmt.Errorf("%s.%s[%s]: %q: %s", path, m.field, k, v, errs[0])
					}
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
			if err := toleration.Validate(t); err != nil {
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

// PriorityClasses resolves a PriorityClass name to its value and
// preemptionPolicy; the error is the API server's for a missing class
// (`priorityclasses.scheduling.k8s.io "x" not found`).
type PriorityClasses interface {
	PriorityClass(name string) (int32, *corev1.PreemptionPolicy, error)
}

type compiled struct {
	*Profile
	ns, obj           labels.Selector
	nsEmpty, objEmpty bool
	percent           int
	// tolerations are Tolerations encoded (toleration.AppendJSON) at
	// compile time: Write appends them without encoding them per object.
	tolerations []jsonedit.Fragment
	// suffixKeys are LabelSuffixes' keys in order, sorted once.
	suffixKeys []string
}

// Profiles is a validated list of profiles in the order upstream applies
// them: by name.
type Profiles struct {
	list []compiled
	// intn is rand.IntN; tests replace it (upstream's randIntnFn,
	// cluster_colocation_profile.go:47-49).
	intn func(int) int
}

// CompileProfiles validates ps and sorts them by name.
func CompileProfiles(ps []Profile) (*Profiles, error) {
	if err := ValidateProfiles(ps); err != nil {
		return nil, err
	}
	out := &Profiles{intn: rand.IntN}
	for i := range ps {
		pr := &ps[i]
		c := compiled{Profile: pr, percent: 100}
		c.ns, _ = selector(pr.NamespaceSelector)
		c.obj, _ = selector(pr.Selector)
		c.nsEmpty, c.objEmpty = c.ns.Empty(), c.obj.Empty()
		if pr.Probability != nil {
			c.percent, _ = intstr.GetScaledValueFromIntOrPercent(pr.Probability, 100, false)
		}
		for _, t := range pr.Tolerations {
			f, err := jsonedit.NewFragment(toleration.AppendJSON(nil, t))
			if err != nil { // AppendJSON writes valid JSON; this is a bug
				return nil, fmt.Errorf("profiles %s: toleration %v: %w", pr.Name, t, err)
			}
			c.tolerations = append(c.tolerations, f)
		}
		c.suffixKeys = slices.Sorted(maps.Keys(pr.LabelSuffixes))
		out.list = append(out.list, c)
	}
	slices.SortFunc(out.list, func(a, b compiled) int { return cmp.Compare(a.Name, b.Name) })
	return out, nil
}

// Len is the number of profiles.
func (ps *Profiles) Len() int { return len(ps.list) }

// NeedsNamespaceLabels is true when some profile's namespace selector is not
// empty.
func (ps *Profiles) NeedsNamespaceLabels() bool {
	return slices.ContainsFunc(ps.list, func(c compiled) bool { return !c.nsEmpty })
}

// NeedsPriorityClasses is true when some profile sets a priority class.
func (ps *Profiles) NeedsPriorityClasses() bool {
	return slices.ContainsFunc(ps.list, func(c compiled) bool { return c.PriorityClassName != "" })
}

// match returns the profiles whose selectors match objLabels (as
// submitted) and, unless nsLabels is nil, the namespace's labels
// (cluster_colocation_profile.go:69-85). nsLabels is called once, when a
// non-empty namespace selector needs it; ok false means the namespace is
// unknown, and then the profile matches, as upstream's failed namespace Get
// does (line 74: only a definite mismatch skips a profile).
func (ps *Profiles) match(objLabels map[string]string, nsLabels func() (map[string]string, bool)) []*compiled {
	var out []*compiled
	var ns map[string]string
	var nsKnown, nsRead bool
	for i := range ps.list {
		c := &ps.list[i]
		if nsLabels != nil && !c.nsEmpty {
			if !nsRead {
				ns, nsKnown = nsLabels()
				nsRead = true
			}
			if nsKnown && !c.ns.Matches(labels.Set(ns)) {
				continue
			}
		}
		if !c.objEmpty && !c.obj.Matches(labels.Set(objLabels)) {
			continue
		}
		out = append(out, c)
	}
	return out
}

// skip is shouldSkipProfile (cluster_colocation_profile.go:151-161),
// including its off-by-one: 50% applies when IntN(100) <= 50.
func (ps *Profiles) skip(c *compiled) bool {
	return c.percent == 0 || (c.percent != 100 && ps.intn(100) > c.percent)
}

// Object is what profiles read from and write to an object: metadata and,
// when HasSpec, the pod spec at the path given to ReadObject.
type Object struct {
	Labels, Annotations map[string]string
	HasSpec             bool
	SchedulerName       string
	PriorityClassName   string
	Priority            *int32
	PreemptionPolicy    *corev1.PreemptionPolicy
	NodeSelector        map[string]string
	Tolerations         []corev1.Toleration

	// added are the encoded tolerations apply appended to Tolerations, in
	// order, when every one came from a profile (nil otherwise: Write then
	// encodes them).
	added []jsonedit.Fragment

	// shared marks the maps that are still the very maps of the object
	// the profiles started from (Profiles.Apply copies a map only when a
	// matching profile may change it): Write, given that object as have,
	// has nothing to compare in them.
	shared mapSet
}

// mapSet is a set of an Object's maps.
type mapSet uint8

const (
	mLabels mapSet = 1 << iota
	mAnnotations
	mNodeSelector
)

// SpecPath is where an object keeps its pod spec, with the paths of the
// fields profiles read precomputed (a request allocates none of them).
type SpecPath struct {
	spec, parent []string
	fields       [6][]string
}

// NewSpecPath returns the SpecPath of the pod spec at spec (at least one
// segment).
func NewSpecPath(spec ...string) *SpecPath {
	sp := &SpecPath{spec: spec, parent: spec[:len(spec)-1]}
	for i, name := range []string{"schedulerName", "priorityClassName", "priority", "preemptionPolicy", "nodeSelector", "tolerations"} {
		sp.fields[i] = append(slices.Clip(slices.Clone(spec)), name)
	}
	return sp
}

// The indexes of SpecPath.fields.
const (
	fSchedulerName = iota
	fPriorityClassName
	fPriority
	fPreemptionPolicy
	fNodeSelector
	fTolerations
)

// PodSpec is a pod's spec; TemplateSpec a Reservation's template spec.
var (
	PodSpec      = NewSpecPath("spec")
	TemplateSpec = NewSpecPath("spec", "template", "spec")
)

// ReadObject decodes the fields profiles read; HasSpec is true when the
// value holding the spec (the object for a pod, spec.template for a
// Reservation) exists.
func ReadObject(doc *jsonedit.Doc, sp *SpecPath) (*Object, error) {
	o := &Object{}
	if _, err := doc.Decode(&o.Labels, "metadata", "labels"); err != nil {
		return nil, err
	}
	if err := readRest(doc, sp, o, allSpecFields|readAnnotations, nil); err != nil {
		return nil, err
	}
	return o, nil
}

// specFields is a set of the spec fields profiles read, one bit per index
// of SpecPath.fields.
type specFields uint8

const allSpecFields specFields = 1<<len(SpecPath{}.fields) - 1

// readAnnotations, in readRest's need, reads the object's annotations: all
// of them, which a profile that changes annotations (or the record of the
// applied profiles) compares with what it leaves. Without it the
// annotations stay nil, shared by the object and what apply leaves (Write
// skips them).
const readAnnotations specFields = 1 << 7

// specFieldsOf returns the spec fields the profiles cs write, and so must
// read to state their change: a field no profile writes is the same in the
// object as it is and as the profiles leave it, so Write needs neither.
func specFieldsOf(cs []*compiled) specFields {
	var f specFields
	for _, c := range cs {
		if c.SchedulerName != "" {
			f |= 1 << fSchedulerName
		}
		if c.PriorityClassName != "" {
			f |= 1<<fPriorityClassName | 1<<fPriority | 1<<fPreemptionPolicy
		}
		if len(c.NodeSelector) > 0 {
			f |= 1 << fNodeSelector
		}
		if len(c.Tolerations) > 0 {
			f |= 1 << fTolerations
		}
	}
	return f
}

// readRest decodes, into o whose labels are read, the annotations (unless
// need lacks readAnnotations) and the spec fields of need. With adding
// (the tolerations the matching profiles add) not empty, o.Tolerations is
// only those of the object's that equal one of them, when tolerationsHave
// can tell without decoding the list: all that apply and Write need of it.
func readRest(doc *jsonedit.Doc, sp *SpecPath, o *Object, need specFields, adding []corev1.Toleration) error {
	if need&readAnnotations != 0 {
		if _, err := doc.Decode(&o.Annotations, "metadata", "annotations"); err != nil {
			return err
		}
	}
	if len(sp.parent) == 0 {
		o.HasSpec = true
	} else {
		parent, err := doc.Get(sp.parent...)
		if err != nil {
			return err
		}
		o.HasSpec = parent != nil && parent[0] != 'n'
	}
	if !o.HasSpec {
		return nil
	}
	for i, v := range []any{&o.SchedulerName, &o.PriorityClassName, &o.Priority, &o.PreemptionPolicy, &o.NodeSelector} {
		if need&(1<<i) == 0 {
			continue
		}
		if _, err := doc.Decode(v, sp.fields[i]...); err != nil {
			return err
		}
	}
	if need&(1<<fTolerations) != 0 {
		if len(adding) > 0 {
			ts, ok, err := tolerationsHave(doc, sp.fields[fTolerations], adding)
			if err != nil {
				return err
			}
			if ok {
				o.Tolerations = ts
				return nil
			}
		}
		// A pod lifespan has just given a dozen tolerations: read them
		// without reflection, as lifespan itself does.
		ts, err := toleration.Of(doc, sp.fields[fTolerations]...)
		if err != nil {
			return err
		}
		o.Tolerations = ts
	}
	return nil
}

// clone copies o, with room for extra more tolerations, and its maps of
// change; the others it shares with o (marked in shared).
// own copies the maps of m that o still shares.
func (o *Object) own(m mapSet) {
	m &= o.shared
	if m&mLabels != 0 {
		o.Labels = maps.Clone(o.Labels)
	}
	if m&mAnnotations != 0 {
		o.Annotations = maps.Clone(o.Annotations)
	}
	if m&mNodeSelector != 0 {
		o.NodeSelector = maps.Clone(o.NodeSelector)
	}
	o.shared &^= m
}

func (o *Object) clone(extra int, change mapSet) *Object {
	c := *o
	c.shared = mLabels | mAnnotations | mNodeSelector
	c.own(change)
	c.Tolerations, c.added = nil, nil
	if len(o.Tolerations)+extra > 0 {
		c.Tolerations = append(make([]corev1.Toleration, 0, len(o.Tolerations)+extra), o.Tolerations...)
	}
	return &c
}

// Result is what applying the matching profiles did.
type Result struct {
	// Matched is true when at least one profile matched (applied or skipped
	// by its probability).
	Matched bool
	// Applied lists the applied profiles in order.
	Applied []string
	// SkipResources is true when a matching profile has SkipUpdateResources.
	SkipResources bool
	// Warnings are for the reviewer (offline priority classes, unknown
	// namespace).
	Warnings []string
	// Want is the object as the profiles leave it.
	Want *Object
}

// Apply applies the profiles matching o (nsLabels as for match) to a copy of
// o in name order, as doMutateByColocationProfile
// (cluster_colocation_profile.go:163-254) does: labels, annotations, label
// and annotation key mappings, label suffixes, schedulerName, the QoS
// label, the priority class, the Koordinator priority label; then kadmit's
// node selector and tolerations. classes nil is offline: a koord-* class
// gets its default value (apis/extension/priority_utils.go:78-91), another
// class has spec.priority removed for the API server to resolve, each with a
// warning. The error is a PriorityClass lookup's.
func (ps *Profiles) Apply(o *Object, nsLabels func() (map[string]string, bool), classes PriorityClasses) (Result, error) {
	return ps.apply(o, ps.match(o.Labels, nsLabels), classes)
}

// changesOf returns how many tolerations the profiles cs may add and the
// maps they may change.
func changesOf(cs []*compiled) (extra int, change mapSet) {
	for _, c := range cs {
		extra += len(c.Tolerations)
		if len(c.Labels)+len(c.LabelKeysMapping)+len(c.LabelSuffixes) > 0 || c.QoSClass != "" || c.KoordinatorPriority != nil {
			change |= mLabels
		}
		if len(c.Annotations)+len(c.AnnotationKeysMapping) > 0 {
			change |= mAnnotations
		}
		if len(c.NodeSelector) > 0 {
			change |= mNodeSelector
		}
	}
	return extra, change
}

// apply is Apply with the matching profiles found.
func (ps *Profiles) apply(o *Object, matched []*compiled, classes PriorityClasses) (Result, error) {
	res := Result{Matched: len(matched) > 0, Want: o}
	if !res.Matched {
		return res, nil
	}
	// The maps a matching profile may change are copied; the others stay
	// the object's (Write then skips them).
	extra, change := changesOf(matched)
	w := o.clone(extra, change)
	res.Want = w
	for _, c := range matched {
		// Upstream reads the skip annotation before the probability draw
		// (cluster_colocation_profile.go:96-98).
		if c.SkipUpdateResources {
			res.SkipResources = true
		}
		if ps.skip(c) {
			continue
		}
		res.Applied = append(res.Applied, c.Name)
		keep := c.KeepExisting
		setMap(&w.Labels, c.Labels, keep)
		setMap(&w.Annotations, c.Annotations, keep)
		mapKeys(&w.Labels, c.LabelKeysMapping)
		mapKeys(&w.Annotations, c.AnnotationKeysMapping)
		for _, k := range c.suffixKeys {
			if v, ok := w.Labels[k]; ok {
				w.Labels[k] = v + c.LabelSuffixes[k]
			}
		}
		if c.SchedulerName != "" && w.HasSpec &&
			(!keep || w.SchedulerName == "" || w.SchedulerName == corev1.DefaultSchedulerName) {
			w.SchedulerName = c.SchedulerName
		}
		if c.QoSClass != "" {
			setMap(&w.Labels, map[string]string{LabelPodQoS: c.QoSClass}, keep)
		}
		if c.PriorityClassName != "" && w.HasSpec && (!keep || w.PriorityClassName == "") {
			warn, err := setPriorityClass(w, c.PriorityClassName, classes)
			if err != nil {
				return res, err
			}
			if warn != "" {
				res.Warnings = append(res.Warnings, warn)
			}
		}
		if c.KoordinatorPriority != nil {
			setMap(&w.Labels, map[string]string{LabelPodPriority: strconv.FormatInt(int64(*c.KoordinatorPriority), 10)}, keep)
		}
		if w.HasSpec {
			setMap(&w.NodeSelector, c.NodeSelector, keep)
			for j, t := range c.Tolerations {
				if !hasToleration(w.Tolerations, t) {
					w.Tolerations = append(w.Tolerations, t)
					w.added = append(w.added, c.tolerations[j])
				}
			}
		}
	}
	return res, nil
}

func setPriorityClass(w *Object, name string, classes PriorityClasses) (string, error) {
	w.PriorityClassName = name
	if classes != nil {
		v, pp, err := classes.PriorityClass(name)
		if err != nil {
			return "", err
		}
		w.Priority, w.PreemptionPolicy = &v, pp
		return "", nil
	}
	if v, ok := defaultPriorityValue(priorityByName(name)); ok {
		w.Priority = &v
		return fmt.Sprintf("colocation: offline, priority class %s assumed to have value %d", name, v), nil
	}
	w.Priority, w.PreemptionPolicy = nil, nil
	return fmt.Sprintf("colocation: offline, value of priority class %s unknown", shorten(name)), nil
}

func shorten(s string) string {
	if len(s) > 60 {
		return s[:60] + "..."
	}
	return s
}

// RecordApplied sets ProfilesAnnotation on w to the applied profiles.
func (r *Result) RecordApplied() {
	if len(r.Applied) > 0 {
		r.Want.own(mAnnotations)
		setMap(&r.Want.Annotations, map[string]string{ProfilesAnnotation: strings.Join(r.Applied, ",")}, false)
	}
}

// Write states the difference from have to want as operations on doc (sp
// as given to ReadObject): map entries in key order, then the scalars, then
// the added tolerations. Profiles never remove a label, annotation or node
// selector entry. have is the object the profiles were applied to (want is
// Result.Want): a map of want's that is still have's own is not compared.
func Write(doc *jsonedit.Doc, sp *SpecPath, have, want *Object) error {
	var err error
	set := func(v any, path ...string) {
		if err == nil {
			err = doc.Set(v, path...)
		}
	}
	// Doc copies the paths it keeps, so one buffer serves every key.
	var buf [8]string
	for i, m := range []struct {
		have, want map[string]string
		path       []string
		which      mapSet
	}{
		{have.Labels, want.Labels, []string{"metadata", "labels"}, mLabels},
		{have.Annotations, want.Annotations, []string{"metadata", "annotations"}, mAnnotations},
		{have.NodeSelector, want.NodeSelector, sp.fields[fNodeSelector], mNodeSelector},
	} {
		if i == 2 && !want.HasSpec {
			break
		}
		if want.shared&m.which != 0 {
			continue
		}
		for _, k := range sortedChanged(m.have, m.want) {
			set(m.want[k], append(append(buf[:0], m.path...), k)...)
		}
	}
	if !want.HasSpec {
		return err
	}
	if want.SchedulerName != have.SchedulerName {
		set(want.SchedulerName, sp.fields[fSchedulerName]...)
	}
	if want.PriorityClassName != have.PriorityClassName {
		set(want.PriorityClassName, sp.fields[fPriorityClassName]...)
	}
	for _, f := range []struct {
		field         int
		want          any
		nilWant, same bool
	}{
		{fPriority, want.Priority, want.Priority == nil, equalPtr(have.Priority, want.Priority)},
		{fPreemptionPolicy, want.PreemptionPolicy, want.PreemptionPolicy == nil, equalPtr(have.PreemptionPolicy, want.PreemptionPolicy)},
	} {
		switch {
		case f.same || err != nil:
		case f.nilWant:
			err = doc.Remove(sp.fields[f.field]...)
		default:
			set(f.want, sp.fields[f.field]...)
		}
	}
	switch added := want.Tolerations[len(have.Tolerations):]; {
	case len(added) == 0 || err != nil:
	case len(want.added) == len(added):
		err = doc.AppendFragments(sp.fields[fTolerations], want.added...)
	default:
		err = doc.AppendJSON(sp.fields[fTolerations], toleration.Encode(added)...)
	}
	return err
}

// sortedChanged returns, in order, the keys of want whose value have lacks
// or differs: nil, without allocating, when there are none.
func sortedChanged(have, want map[string]string) []string {
	var out []string
	for k, v := range want {
		if hv, ok := have[k]; !ok || hv != v {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

func equalPtr[T comparable](a, b *T) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// setMap sets src's entries on dst; with keep, an entry dst already has
// stays.
func setMap(dst *map[string]string, src map[string]string, keep bool) {
	for k, v := range src {
		if cur, ok := (*dst)[k]; ok && (cur == v || keep) {
			continue
		}
		if *dst == nil {
			*dst = map[string]string{}
		}
		(*dst)[k] = v
	}
}

// mapKeys sets m[new] = m[old] for each old: new of mapping, in key order;
// an absent old gives "" (cluster_colocation_profile.go:182-198).
func mapKeys(m *map[string]string, mapping map[string]string) {
	if len(mapping) == 0 {
		return
	}
	if *m == nil {
		*m = map[string]string{}
	}
	for _, old := range slices.Sorted(maps.Keys(mapping)) {
		(*m)[mapping[old]] = (*m)[old]
	}
}

func hasToleration(ts []corev1.Toleration, t corev1.Toleration) bool {
	for _, have := range ts {
		if sameToleration(have, t) {
			return true
		}
	}
	return false
}

// sameToleration is equality.Semantic.DeepEqual on two tolerations (which
// hold no type with a semantic equality of its own) without reflection.
func sameToleration(a, b corev1.Toleration) bool {
	return a.Key == b.Key && a.Operator == b.Operator && a.Value == b.Value && a.Effect == b.Effect &&
		equalPtr(a.TolerationSeconds, b.TolerationSeconds)
}

// SetRandForTest replaces the probability draw (rand.IntN) for a test.
func (ps *Profiles) SetRandForTest(intn func(int) int) { ps.intn = intn }
