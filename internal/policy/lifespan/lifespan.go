// Package lifespan implements the lifespan policy. Nodes are tainted
// acme.com/lifespan-remaining=<days>:NoSchedule as they age; a pod states how
// many days of node lifetime it needs with the label
// acme.com/lifespan-requested, and the policy turns that into the tolerations
// that let it land only on nodes with at least that many days left.
package lifespan

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"gomodules.xyz/jsonpatch/v2"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/kadmit/kadmit/internal/admission"
)

// Name is the policy's name in the configuration (policies.lifespan) and in
// the webhook registration (lifespan.kadmit.io).
const Name = "lifespan"

// Path is the URL path of the mutating hook.
const Path = "/mutate-pod"

const (
	// LabelRequested is the pod label holding the requested lifespan: a
	// decimal integer N in [0, max] (days).
	LabelRequested = "acme.com/lifespan-requested"
	// TaintKey is the node taint key the added tolerations tolerate.
	TaintKey = "acme.com/lifespan-remaining"
)

// MaxLimit bounds Config.Max: every day in N..max costs one toleration on
// every pod, and the pod spec must stay small.
const MaxLimit = 1000

// Config is the lifespan policy's configuration (policies.lifespan).
type Config struct {
	// Max is the largest lifespan, in days, a node can have left: integer in
	// [0, MaxLimit]. A labelled pod gets one toleration per day N..Max.
	Max int `json:"max"`
}

// DefaultConfig is the seed profile: enabled, max 14 days, failurePolicy Fail.
func DefaultConfig() Config {
	return Config{Max: 14}
}

// Validate reports the first problem in c as "<field>: <problem>", e.g.
// `max: must be >= 0, got -1`; the field path is relative to the policy so the
// config loader can prefix "policies.lifespan.".
func (c Config) Validate() error {
	if c.Max < 0 {
		return fmt.Errorf("max: must be >= 0, got %d", c.Max)
	}
	if c.Max > MaxLimit {
		return fmt.Errorf("max: must be <= %d, got %d", MaxLimit, c.Max)
	}
	return nil
}

// Policy adds lifespan tolerations to pods on CREATE.
type Policy struct {
	cfg Config
}

// New validates cfg and builds the policy; it returns Config.Validate's error
// unchanged so the caller can prefix the field path.
func New(cfg Config) (*Policy, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Policy{cfg: cfg}, nil
}

// Hooks returns the policy's single mutating hook: POST /mutate-pod for
// core/v1 pods on CREATE, failurePolicy Fail unless configured otherwise.
// Tolerations are only added at creation: the API server rejects adding them
// to a running pod's spec except in narrow cases.
func (p *Policy) Hooks() []admission.Hook {
	fp := admissionregistrationv1.Fail
	return []admission.Hook{{
		Policy: Name,
		Path:   Path,
		Type:   admission.Mutating,
		Rules: []admissionregistrationv1.RuleWithOperations{{
			Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
			Rule: admissionregistrationv1.Rule{
				APIGroups:   []string{""},
				APIVersions: []string{"v1"},
				Resources:   []string{"pods"},
			},
		}},
		FailurePolicy: fp,
		Mutator:       p,
	}}
}

// Tolerations returns the tolerations a pod needs. requested is the label's
// value, or nil when the pod has no label: then the pod gets
// {acme.com/lifespan-remaining Exists NoSchedule} and runs anywhere, since it
// did not ask for a lifespan. Otherwise the value must be a decimal integer N
// in [0, maxDays] (digits only: no sign, space, or fraction) and the result is one
// {acme.com/lifespan-remaining Equal "i" NoSchedule} per i in N..maxDays,
// increasing. A bad value returns a *LabelError (matching ErrInvalidLabel).
func Tolerations(requested *string, maxDays int) ([]corev1.Toleration, error) {
	if requested == nil {
		return []corev1.Toleration{{Key: TaintKey, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}, nil
	}
	n, err := parseRequested(*requested, maxDays)
	if err != nil {
		return nil, err
	}
	out := make([]corev1.Toleration, 0, maxDays-n+1)
	for i := n; i <= maxDays; i++ {
		out = append(out, corev1.Toleration{
			Key:      TaintKey,
			Operator: corev1.TolerationOpEqual,
			Value:    strconv.Itoa(i),
			Effect:   corev1.TaintEffectNoSchedule,
		})
	}
	return out, nil
}

// ErrInvalidLabel matches (errors.Is) every *LabelError.
var ErrInvalidLabel = errors.New("invalid lifespan label")

// LabelError reports a lifespan label value that is not an integer in
// [0, Max]. Its message is what the user sees, so it names the label, the
// range and the value.
type LabelError struct {
	Value string
	Max   int
}

func (e *LabelError) Error() string {
	return fmt.Sprintf("label %s must be an integer in [0, %d], got %q", LabelRequested, e.Max, e.Value)
}

// Is makes errors.Is(err, ErrInvalidLabel) hold.
func (e *LabelError) Is(target error) bool { return target == ErrInvalidLabel }

func parseRequested(v string, maxDays int) (int, error) {
	bad := func() (int, error) { return 0, &LabelError{Value: v, Max: maxDays} }
	// strconv.Atoi alone would accept "+3" and "-0"; a day count is digits
	// only (leading zeros are harmless and accepted).
	if v == "" {
		return bad()
	}
	for _, c := range []byte(v) {
		if c < '0' || c > '9' {
			return bad()
		}
	}
	n, err := strconv.Atoi(v)
	if err != nil || n > maxDays {
		return bad()
	}
	return n, nil
}

// Mutate adds the tolerations Tolerations computes that the pod lacks, after
// its own, and returns nil when it lacks none. Tolerations are compared on
// key, operator, value and effect (an empty operator counts as Equal, as the
// API server reads it). A bad label value is refused with 400 and a message
// like `label acme.com/lifespan-requested must be an integer in [0, 14], got
// "15"`; a body that is not a pod JSON also gets 400.
func (p *Policy) Mutate(_ context.Context, req *admission.Request) ([]byte, admission.Verdict) {
	_, _, missing, v := p.plan(req)
	if len(missing) == 0 {
		return nil, v
	}
	out, err := appendTolerations(req.Object.Raw, missing)
	if err != nil {
		return nil, admission.Invalid("%s: cannot edit the pod: %v", Name, err)
	}
	return out, v
}

// MutatePatch is Mutate stated as a JSONPatch against req.Object.Raw, for
// when lifespan is the only mutator on its path: one "add
// /spec/tolerations/-" per missing toleration when the pod has tolerations,
// else one "add" of the whole list (of /spec when the pod has no spec
// object). It never decodes or re-encodes the rest of the pod.
//
// It declines (ok false) when the pod spells metadata, labels, spec or
// tolerations other than exactly so, or twice: the API server never sends
// that, and a patch by exact name could then miss what the decode read.
func (p *Policy) MutatePatch(_ context.Context, req *admission.Request) (_ []jsonpatch.Operation, _ admission.Verdict, ok bool) {
	pod, canonical, missing, v := p.plan(req)
	if len(missing) == 0 {
		return nil, v, true
	}
	if !canonical {
		return nil, admission.Verdict{}, false
	}
	values := make([]any, len(missing))
	for i, t := range missing {
		values[i] = tolerationJSON(t)
	}
	switch {
	case pod.Spec == nil:
		return []jsonpatch.Operation{{Operation: "add", Path: "/spec", Value: map[string]any{"tolerations": values}}}, v, true
	case len(pod.Spec.Tolerations) == 0:
		return []jsonpatch.Operation{{Operation: "add", Path: "/spec/tolerations", Value: values}}, v, true
	}
	ops := make([]jsonpatch.Operation, len(values))
	for i, val := range values {
		ops[i] = jsonpatch.Operation{Operation: "add", Path: "/spec/tolerations/-", Value: val}
	}
	return ops, v, true
}

// podFields is the part of a pod lifespan reads, with corev1's types so that
// a wrongly typed label or toleration is still a 400. Spec is nil when the
// pod has no spec or a null one.
type podFields struct {
	Metadata struct {
		Labels map[string]string `json:"labels"`
	} `json:"metadata"`
	Spec *struct {
		Tolerations []corev1.Toleration `json:"tolerations"`
	} `json:"spec"`
}

var podFieldsKeep = admission.Keep{"metadata": {"labels": nil}, "spec": {"tolerations": nil}}

// plan decodes what lifespan reads from the pod and returns it, whether it
// was spelled canonically (see admission.DecodeFields), the tolerations it
// lacks, in order, and the verdict; a verdict that denies comes with no
// tolerations.
func (p *Policy) plan(req *admission.Request) (podFields, bool, []corev1.Toleration, admission.Verdict) {
	var pod podFields
	canonical, err := admission.DecodeFields(req.Object.Raw, podFieldsKeep, &pod)
	if err != nil {
		return pod, false, nil, admission.Invalid("%s: cannot parse the pod: %v", Name, err)
	}
	var requested *string
	if v, ok := pod.Metadata.Labels[LabelRequested]; ok {
		requested = &v
	}
	want, err := Tolerations(requested, p.cfg.Max)
	if err != nil {
		return pod, false, nil, admission.Invalid("%s", err.Error())
	}
	var have []corev1.Toleration
	if pod.Spec != nil {
		have = pod.Spec.Tolerations
	}
	var missing []corev1.Toleration
	for _, t := range want {
		if !hasToleration(have, t) {
			missing = append(missing, t)
		}
	}
	return pod, canonical, missing, admission.Allow()
}

// tolerationJSON is the JSON form of an added toleration, as in
// appendTolerations.
func tolerationJSON(t corev1.Toleration) map[string]any {
	m := map[string]any{"key": t.Key, "operator": string(t.Operator), "effect": string(t.Effect)}
	if t.Value != "" {
		m["value"] = t.Value
	}
	return m
}

// hasToleration reports whether have holds t, comparing the fields that decide
// what a toleration tolerates: key, operator, value and effect.
func hasToleration(have []corev1.Toleration, t corev1.Toleration) bool {
	for _, h := range have {
		op := h.Operator
		if op == "" {
			op = corev1.TolerationOpEqual
		}
		if h.Key == t.Key && op == t.Operator && h.Value == t.Value && h.Effect == t.Effect {
			return true
		}
	}
	return false
}

// appendTolerations appends add to spec.tolerations of the pod JSON raw.
// It edits the generic JSON rather than re-encoding a corev1.Pod so that
// fields this build of k8s.io/api does not know, and ones the typed encoding
// would rewrite (creationTimestamp: null, number spellings), survive and the
// resulting patch only touches tolerations.
func appendTolerations(raw []byte, add []corev1.Toleration) ([]byte, error) {
	var obj map[string]any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&obj); err != nil {
		return nil, fmt.Errorf("decode pod: %w", err)
	}
	if obj == nil {
		return nil, errors.New("pod is null")
	}
	spec, ok := obj["spec"].(map[string]any)
	if !ok {
		if obj["spec"] != nil {
			return nil, fmt.Errorf("spec is a %T, not an object", obj["spec"])
		}
		spec = map[string]any{}
		obj["spec"] = spec
	}
	tols, ok := spec["tolerations"].([]any)
	if !ok && spec["tolerations"] != nil {
		return nil, fmt.Errorf("spec.tolerations is a %T, not an array", spec["tolerations"])
	}
	for _, t := range add {
		tols = append(tols, tolerationJSON(t))
	}
	spec["tolerations"] = tols
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(obj); err != nil {
		return nil, fmt.Errorf("encode pod: %w", err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}
