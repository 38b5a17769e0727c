// Package policy defines what a built-in policy is to the rest of kadmit:
// an Entry of the registry that knows its name, its configuration section
// and its defaults, how to build its hooks from that section and the cluster, and which
// cluster caches it reads. The configuration loader, the server and
// `kadmit review` handle every policy through these values alone; the list
// of policies lives in package builtin, one line each.
//
// The shape follows the small role interfaces of
// k8s.io/apiserver/pkg/admission/plugin/policy/generic: the generic code
// (config parsing, failurePolicy override, cache start-up) is written once
// here, the policy packages hold only their own rules.
package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	kjson "sigs.k8s.io/json"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/clustercache"
)

// Entry is one built-in policy as the registry (package builtin), the
// configuration loader and the server see it. Definition is the only
// implementation. (It was called Kind, which read as a Kubernetes kind.)
type Entry interface {
	// Name is the policy's name, e.g. "pod-name": the webhook is registered
	// as "<name>.kadmit.io" and metrics and logs carry it.
	Name() string
	// Key is the policy's section under `policies:` in the configuration,
	// e.g. "podName".
	Key() string
	// Default returns the seed section: the policy's default config and
	// whether the seed profile enables it.
	Default() Section
	// Decode parses the section's JSON over Default (each field present
	// replaces the default whole; see Definition) and validates it. Errors
	// name the field relative to the section, e.g. "max: must be >= 0".
	Decode(raw []byte) (Section, error)
}

// Section is one policy's parsed configuration section.
type Section interface {
	Entry() Entry
	// Enabled reports `enabled: true`.
	Enabled() bool
	// Caches lists the cluster caches the enabled policy reads; none for a
	// disabled one.
	Caches() []clustercache.Read
	// Hooks builds the policy's hooks, with a configured failurePolicy in
	// place of each hook's default. A disabled section has none.
	Hooks(env Env) ([]admission.Hook, error)
	// FailurePolicy is the section's `failurePolicy`, nil when absent (each
	// hook keeps its default).
	FailurePolicy() *admissionregistrationv1.FailurePolicyType
	// Config returns the policy's own config value (the C of Definition[C]).
	Config() any
}

// Env is what a policy may use when it builds its hooks.
type Env struct {
	// Cluster holds the informer caches of a running server, started for the
	// resources the enabled sections' Caches list; nil offline (`kadmit
	// review`), where a policy that reads cluster state must say what it
	// cannot check (a warning), never deny for lack of state.
	Cluster *clustercache.Caches
	// LoadConfig parses kadmit's own configuration from data[key] of a
	// ConfigMap exactly as `kadmit serve --config-map` does, returning the
	// error serve would print (for the kadmit-config policy, which cannot
	// import the loader that imports it).
	LoadConfig func(cm *corev1.ConfigMap, key string) error
	// Log receives what a policy reports outside a review, such as a cached
	// object it cannot use; nil discards. Within a review a policy logs
	// through logging.FromContext(ctx) instead: that logger is serve's with
	// the review's "webhook" and "uid".
	Log *slog.Logger
	// PoliciesConfigMap is serve's --policies-configmap, for the
	// kadmit-policies policy that guards it; nil when serve follows none
	// (and offline).
	PoliciesConfigMap *PoliciesConfigMap
}

// PoliciesConfigMap locates the ConfigMap of declared policies serve
// follows, and loads one version of it as serve would.
type PoliciesConfigMap struct {
	Namespace, Name string
	// Load loads and compiles cm's documents together with serve's
	// --policies files exactly as serve does at start and on a reload,
	// returning the error serve would log (nil: a restart loads it).
	Load func(cm *corev1.ConfigMap) error
}

// Validator is the constraint on a policy's config type: Validate reports
// the first problem as "<field>: <problem>" relative to the section.
type Validator interface {
	Validate() error
}

// EnabledValidator is implemented by configs with fields required only when
// the policy is enabled; the loader calls it after Validate for an enabled
// section.
type EnabledValidator interface {
	ValidateEnabled() error
}

// Definition describes a built-in policy with config type C. The fields the
// loader handles for every policy, `enabled` and `failurePolicy`, are not
// part of C: they are parsed, validated and applied here.
type Definition[C Validator] struct {
	// PolicyName and SectionKey are Entry's Name and Key.
	PolicyName string
	SectionKey string
	// EnabledByDefault turns the policy on in the seed profile.
	EnabledByDefault bool
	// Defaults returns the policy's default config (a fresh value each call).
	Defaults func() C
	// Build returns the policy's hooks with their default failurePolicy.
	// Every hook must carry Policy == PolicyName. cfg has passed Validate.
	Build func(cfg C, env Env) ([]admission.Hook, error)
	// Caches, when set, lists the cluster caches an enabled policy with cfg
	// reads and, for each, the fields of its objects the policy reads
	// (clustercache.Resource.Keep; Whole for the whole object): the caches
	// keep nothing else. The server starts and syncs them before Build is
	// called.
	Caches func(cfg C) []clustercache.Read
}

var _ Entry = (*Definition[Validator])(nil)

// Hooker is a built policy that lists its hooks.
type Hooker interface {
	Hooks() []admission.Hook
}

// BuildWith adapts a policy constructor that needs nothing from Env (no
// cluster caches, no loader) to Definition.Build.
func BuildWith[C Validator, P Hooker](newPolicy func(C) (P, error)) func(C, Env) ([]admission.Hook, error) {
	return func(cfg C, _ Env) ([]admission.Hook, error) {
		p, err := newPolicy(cfg)
		if err != nil {
			return nil, err
		}
		return p.Hooks(), nil
	}
}

// Name implements Entry.
func (d *Definition[C]) Name() string { return d.PolicyName }

// Key implements Entry.
func (d *Definition[C]) Key() string { return d.SectionKey }

// Default implements Entry.
func (d *Definition[C]) Default() Section {
	return &section[C]{def: d, enabled: d.EnabledByDefault, cfg: d.Defaults()}
}

// common holds the section fields the loader handles for every policy.
type common struct {
	Enabled       *bool                                      `json:"enabled,omitempty"`
	FailurePolicy *admissionregistrationv1.FailurePolicyType `json:"failurePolicy,omitempty"`
}

// Decode implements Entry. A field present in raw replaces the default whole
// (a map such as nodeOvercommit's ratios is not merged key by key, so a file
// that lists only memory does not silently keep the cpu default); absent
// fields keep their defaults. Unknown and duplicate fields are errors and
// names are case-sensitive, as in Kubernetes objects.
func (d *Definition[C]) Decode(raw []byte) (Section, error) {
	var fields map[string]json.RawMessage
	if err := strictUnmarshal(raw, &fields); err != nil {
		return nil, &DecodeError{err}
	}
	if fields == nil && !bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		return nil, &DecodeError{errors.New("must be an object")}
	}
	var c common
	own := map[string]json.RawMessage{}
	for k, v := range fields {
		switch k {
		case "enabled":
			if err := strictUnmarshal(v, &c.Enabled); err != nil {
				return nil, fmt.Errorf("enabled: %w", err)
			}
		case "failurePolicy":
			if err := strictUnmarshal(v, &c.FailurePolicy); err != nil {
				return nil, fmt.Errorf("failurePolicy: %w", err)
			}
		default:
			own[k] = v
		}
	}
	// Overlay the present fields on the defaults' JSON, then decode the
	// result into a zero C: a present field replaces the default whole.
	base, err := json.Marshal(d.Defaults())
	if err != nil {
		return nil, fmt.Errorf("encode defaults: %w", err)
	}
	merged := map[string]json.RawMessage{}
	if err := json.Unmarshal(base, &merged); err != nil {
		return nil, fmt.Errorf("decode defaults: %w", err)
	}
	for k, v := range own {
		merged[k] = v
	}
	js, err := json.Marshal(merged)
	if err != nil {
		return nil, err
	}
	var cfg C
	if err := strictUnmarshal(js, &cfg); err != nil {
		return nil, &DecodeError{err}
	}
	s := &section[C]{def: d, enabled: d.EnabledByDefault, cfg: cfg, failurePolicy: c.FailurePolicy}
	if c.Enabled != nil {
		s.enabled = *c.Enabled
	}
	if err := s.validate(); err != nil {
		return nil, err
	}
	return s, nil
}

// DecodeError is a section that is not well-formed JSON for its policy (an
// unknown field, a wrong type), as opposed to a value that fails
// validation, whose error starts with the field name.
type DecodeError struct{ Err error }

func (e *DecodeError) Error() string { return e.Err.Error() }
func (e *DecodeError) Unwrap() error { return e.Err }

// strictUnmarshal decodes as Kubernetes does: case-sensitive names, exact
// integers, unknown and duplicate fields refused.
func strictUnmarshal(data []byte, v any) error {
	strictErrs, err := kjson.UnmarshalStrict(data, v, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	if err != nil {
		return err
	}
	if len(strictErrs) > 0 {
		return strictErrs[0]
	}
	return nil
}

// section is Section for Definition[C].
type section[C Validator] struct {
	def           *Definition[C]
	enabled       bool
	failurePolicy *admissionregistrationv1.FailurePolicyType
	cfg           C
}

func (s *section[C]) Entry() Entry  { return s.def }
func (s *section[C]) Enabled() bool { return s.enabled }
func (s *section[C]) Config() any   { return s.cfg }

func (s *section[C]) FailurePolicy() *admissionregistrationv1.FailurePolicyType {
	return s.failurePolicy
}

func (s *section[C]) validate() error {
	if fp := s.failurePolicy; fp != nil && *fp != admissionregistrationv1.Fail && *fp != admissionregistrationv1.Ignore {
		return fmt.Errorf("failurePolicy: must be Fail or Ignore, got %q", *fp)
	}
	if err := s.cfg.Validate(); err != nil {
		return err
	}
	if ev, ok := any(s.cfg).(EnabledValidator); ok && s.enabled {
		return ev.ValidateEnabled()
	}
	return nil
}

func (s *section[C]) Caches() []clustercache.Read {
	if !s.enabled || s.def.Caches == nil {
		return nil
	}
	return s.def.Caches(s.cfg)
}

func (s *section[C]) Hooks(env Env) ([]admission.Hook, error) {
	if !s.enabled {
		return nil, nil
	}
	hooks, err := s.def.Build(s.cfg, env)
	if err != nil {
		return nil, err
	}
	for i := range hooks {
		if hooks[i].Policy != s.def.PolicyName {
			return nil, fmt.Errorf("hook on %s names policy %q, want %q", hooks[i].Path, hooks[i].Policy, s.def.PolicyName)
		}
		if s.failurePolicy != nil {
			hooks[i].FailurePolicy = *s.failurePolicy
		}
	}
	return hooks, nil
}

// ConfigOf returns the config of kind d in sections, or d's defaults when the
// sections hold none: typed access for callers that know the policy, such as
// tests and the demo.
func ConfigOf[C Validator](sections []Section, d *Definition[C]) (C, bool) {
	for _, s := range sections {
		if s.Entry() == Entry(d) {
			return s.Config().(C), s.Enabled()
		}
	}
	return d.Defaults(), d.EnabledByDefault
}

// Registry is an ordered list of policy kinds. The order is the order of
// hooks on a shared path: on /validate-pod pod-name runs before the quota
// check, on /mutate-pod lifespan before the colocation profiles.
type Registry []Entry

// Lookup returns the kind whose section key is key.
func (r Registry) Lookup(key string) (Entry, bool) {
	for _, k := range r {
		if k.Key() == key {
			return k, true
		}
	}
	return nil, false
}

// Validate reports duplicate names or keys: a programming error.
func (r Registry) Validate() error {
	names, keys := map[string]bool{}, map[string]bool{}
	for _, k := range r {
		if k.Name() == "" || k.Key() == "" {
			return fmt.Errorf("policy registry: a kind has an empty name or key (%q, %q)", k.Name(), k.Key())
		}
		if names[k.Name()] || keys[k.Key()] {
			return fmt.Errorf("policy registry: %s (%s) is listed twice", k.Name(), k.Key())
		}
		names[k.Name()], keys[k.Key()] = true, true
	}
	return nil
}
