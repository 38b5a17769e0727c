package colocation

import (
	"context"
	"errors"
	"fmt"
	"slices"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/jsonedit"
)

// The policy mutates pods at CREATE and validates them at CREATE and UPDATE.
var (
	_ admission.Mutator   = (*Policy)(nil)
	_ admission.Validator = (*Policy)(nil)
)

// Name is the policy's name (policies.colocation in the configuration).
const Name = "colocation"

// Paths: the mutating hook shares /mutate-pod with lifespan, the validating
// one /validate-pod with pod-name, the quota check and reservation.
const (
	Path         = "/mutate-pod"
	ValidatePath = "/validate-pod"
)

// Config is the colocation policy's configuration (policies.colocation).
// The zero value of every switch is upstream's behaviour.
type Config struct {
	// Profiles are applied by name order to every pod they match.
	Profiles []Profile `json:"profiles,omitempty"`
	// SkipMutatingResources is upstream's feature gate
	// ColocationProfileSkipMutatingResources (pkg/features/features.go:52,
	// default false): no cpu/memory translation at all.
	SkipMutatingResources bool `json:"skipMutatingResources,omitempty"`
	// SkipValidatingPriority is upstream's feature gate
	// ColocationProfileSkipValidatingPriority (features.go:55, default
	// false): the koordinator.sh/priority label may change on UPDATE.
	SkipValidatingPriority bool `json:"skipValidatingPriority,omitempty"`
	// DisableValidation turns off the /validate-pod hook, as upstream's
	// feature gate PodValidatingWebhook=false (features.go:31, default on).
	DisableValidation bool `json:"disableValidation,omitempty"`
	// RecordProfiles (kadmit, off by default) lists the applied profiles in
	// the kadmit.io/colocation-profiles annotation.
	RecordProfiles bool `json:"recordProfiles,omitempty"`
	// AllowReservePod (kadmit, off by default) skips Koordinator's ban on
	// the scheduling.koordinator.sh/reserve-pod annotation (package
	// reservepod) in this policy's /validate-pod hook; upstream's pod
	// validation runs the ban whenever it runs.
	AllowReservePod bool `json:"allowReservePod,omitempty"`
}

// DefaultConfig is the seed profile: disabled, no profiles.
func DefaultConfig() Config { return Config{} }

// Validate reports the first problem as "<field>: <problem>".
func (c Config) Validate() error { return ValidateProfiles(c.Profiles) }

// Namespaces returns the labels of a namespace from an informer cache; ok
// is false when the namespace is not in the cache.
type Namespaces interface {
	NamespaceLabels(name string) (map[string]string, bool)
}

// Policy is the colocation policy.
type Policy struct {
	cfg        Config
	profiles   *Profiles
	namespaces Namespaces
	classes    PriorityClasses
}

// Option configures New.
type Option func(*Policy)

// WithPriorityClasses resolves profiles' priority classes with classes
// (the cluster cache); without it, or with nil, they resolve offline as
// Profiles.Apply says.
func WithPriorityClasses(classes PriorityClasses) Option {
	return func(p *Policy) { p.classes = classes }
}

// New validates cfg and builds the policy. namespaces is nil offline: then
// a namespace's only label is kubernetes.io/metadata.name (which the API
// server sets on every namespace), with a warning when a profile needs
// more.
func New(cfg Config, namespaces Namespaces, opts ...Option) (*Policy, error) {
	ps, err := CompileProfiles(cfg.Profiles)
	if err != nil {
		return nil, err
	}
	p := &Policy{cfg: cfg, profiles: ps, namespaces: namespaces}
	for _, o := range opts {
		o(p)
	}
	return p, nil
}

// Hooks returns the mutating hook (pods CREATE on /mutate-pod) and, unless
// disableValidation, the validating hook (pods CREATE and UPDATE on
// /validate-pod), both failurePolicy Fail as upstream registers them
// (pkg/webhook/pod/mutating/webhooks.go:27,
// pkg/webhook/pod/validating/webhooks.go:28). Upstream also registers
// /mutate-pod for UPDATE (mutating/webhooks.go:28), where its handler does
// nothing (mutating_handler.go:157-160); kadmit does not, which saves a call
// per pod update and changes no outcome.
func (p *Policy) Hooks() []admission.Hook {
	rule := func(ops ...admissionregistrationv1.OperationType) []admissionregistrationv1.RuleWithOperations {
		return []admissionregistrationv1.RuleWithOperations{{
			Operations: ops,
			Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
		}}
	}
	hooks := []admission.Hook{{
		Policy: Name, Path: Path, Type: admission.Mutating,
		Rules:         rule(admissionregistrationv1.Create),
		FailurePolicy: admissionregistrationv1.Fail,
		Mutator:       p,
	}}
	if !p.cfg.DisableValidation {
		hooks = append(hooks, admission.Hook{
			Policy: Name, Path: ValidatePath, Type: admission.Validating,
			Rules:         rule(admissionregistrationv1.Create, admissionregistrationv1.Update),
			FailurePolicy: admissionregistrationv1.Fail,
			Validator:     p,
		})
	}
	return hooks
}

// Mutate applies the matching profiles, by name, to a pod being created
// (clusterColocationProfileMutatingPod,
// pkg/webhook/pod/mutating/cluster_colocation_profile.go:54-117) and then,
// unless a matching profile says skipUpdateResources or
// skipMutatingResources is on, moves a koord-batch (koord-mid) pod's cpu and
// memory to kubernetes.io/batch-cpu and batch-memory (mid-cpu, mid-memory).
// Last, for every pod created, the node.koordinator.sh/extended-resource-spec
// annotation is brought in line with its batch resources (extendedResources).
// Only the fields read are decoded: the labels (and the namespace's, when a
// namespaceSelector needs them), then, for a pod no profile matches, only
// the extended-resource-spec annotation and the containers' batch
// resources; for a matched pod the spec fields the matching profiles
// write and, when a matching profile changes annotations or recordProfiles
// is on, all its annotations (else only the extended-resource-spec one, as
// for a pod no profile matches: another annotation whose value is not a
// string, which the API server never sends, is not refused). Of
// spec.tolerations only the elements that may equal a profile's are read:
// none when no profile toleration's key appears in the list (an element
// the decoder refuses is then not refused either). The change
// is stated as JSONPatch operations on the pod as sent. A pod whose fields
// read cannot be decoded is refused with 400, a failed PriorityClass lookup
// with 500 (mutating_handler.go:68-91).
func (p *Policy) Mutate(_ context.Context, req *admission.Request) ([]jsonedit.Op, admission.Verdict) {
	if req.Operation != admissionv1.Create || req.SubResource != "" {
		return nil, admission.Allow()
	}
	doc := req.ObjectDoc()
	have := &Object{}
	if _, err := doc.Decode(&have.Labels, "metadata", "labels"); err != nil {
		return nil, admission.Invalid("%s: cannot parse the pod: %v", Name, err)
	}
	var warnings []string
	var matched []*compiled
	if p.profiles.Len() > 0 {
		ns := req.Namespace
		if ns == "" {
			if _, err := doc.Decode(&ns, "metadata", "namespace"); err != nil {
				return nil, admission.Invalid("%s: cannot parse the pod: %v", Name, err)
			}
		}
		matched = p.profiles.match(have.Labels, func() (map[string]string, bool) {
			l, ok, warn := p.namespaceLabels(ns)
			if warn != "" {
				warnings = append(warnings, warn)
			}
			return l, ok
		})
	}
	// With no matching profile upstream's clusterColocationProfileMutatingPod
	// returns before touching the pod (cluster_colocation_profile.go:65-67,
	// 86-88) and only mutateByExtendedResources runs, on the pod as sent: it
	// reads the one annotation and the containers' batch resources, so
	// nothing else is decoded.
	if len(matched) == 0 {
		cur, has, err := extendedSpecAnnotation(doc)
		if err == nil {
			err = extendedResources(doc, cur, has, nil)
		}
		if err != nil {
			return nil, extendedError(err)
		}
		return doc.Ops(), admission.Allow(warnings...)
	}
	// Only the spec fields the matching profiles write are read, plus
	// spec.priority when resources may be translated.
	need := specFieldsOf(matched)
	translate := !p.cfg.SkipMutatingResources &&
		!slices.ContainsFunc(matched, func(c *compiled) bool { return c.SkipUpdateResources })
	if translate {
		need |= 1 << fPriority
	}
	// The annotations are read whole only when they may change; else
	// extendedResources below reads its one annotation by itself.
	_, change := changesOf(matched)
	if change&mAnnotations != 0 || p.cfg.RecordProfiles {
		need |= readAnnotations
	}
	var adding []corev1.Toleration
	if need&(1<<fTolerations) != 0 {
		for _, c := range matched {
			adding = append(adding, c.Tolerations...)
		}
	}
	if err := readRest(doc, PodSpec, have, need, adding); err != nil {
		return nil, admission.Invalid("%s: cannot parse the pod: %v", Name, err)
	}
	res, err := p.profiles.apply(have, matched, p.classes)
	if err != nil {
		return nil, admission.Errored(0, err)
	}
	warnings = append(warnings, res.Warnings...)
	if p.cfg.RecordProfiles {
		res.RecordApplied()
	}
	want := res.Want
	if err := Write(doc, PodSpec, have, want); err != nil {
		return nil, admission.Invalid("%s: cannot edit the pod: %v", Name, err)
	}
	var translated []containerLists
	if translate {
		if translated, err = translateResources(doc, want.Labels, want.Priority); err != nil {
			return nil, admission.Invalid("%s: %v", Name, err)
		}
	}
	cur, has := want.Annotations[AnnotationExtendedResourceSpec]
	if need&readAnnotations == 0 {
		// Not read, and so not changed: the annotation as sent.
		if cur, has, err = extendedSpecAnnotation(doc); err != nil {
			return nil, extendedError(err) // as when no profile matches
		}
	}
	if err := extendedResources(doc, cur, has, translated); err != nil {
		return nil, extendedError(err)
	}
	return doc.Ops(), admission.Allow(warnings...)
}

// extendedError is the verdict on extendedResources' error: 500 for a
// malformed annotation, as upstream's handler answers
// (mutating_handler.go:89-91), 400 for a pod it cannot read.
func extendedError(err error) admission.Verdict {
	var ae *annotationError
	if errors.As(err, &ae) {
		return admission.Errored(0, err)
	}
	return admission.Invalid("%s: %v", Name, err)
}

// namespaceLabels returns the labels of namespace ns and whether it is
// known. Offline, every namespace is known by its name label alone.
func (p *Policy) namespaceLabels(ns string) (map[string]string, bool, string) {
	base := map[string]string{corev1.LabelMetadataName: ns}
	if p.namespaces == nil {
		return base, true, fmt.Sprintf("%s: namespace labels unknown offline; only %s is matched", Name, corev1.LabelMetadataName)
	}
	if l, ok := p.namespaces.NamespaceLabels(ns); ok {
		return l, true, ""
	}
	return nil, false, fmt.Sprintf("%s: namespace %q not in kadmit's cache; its profiles apply", Name, shorten(ns))
}

// BoundedReview marks the policy admission.Bounded, so its hooks run on
// the request's goroutine: beside the pod, it reads only the namespace
// and PriorityClass informer stores, whose reads do not wait on I/O.
func (*Policy) BoundedReview() {}
