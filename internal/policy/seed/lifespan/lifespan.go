// Package lifespan implements the lifespan policy. Nodes are tainted
// acme.com/lifespan-remaining=<days>:NoSchedule as they age; a pod states how
// many days of node lifetime it needs with the label
// acme.com/lifespan-requested, and the policy turns that into the tolerations
// that let it land only on nodes with at least that many days left.
package lifespan

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/jsonedit"
	"github.com/kadmit/kadmit/internal/policy/shared/toleration"
)

// The policy states its change as JSONPatch operations.
var _ admission.Mutator = (*Policy)(nil)

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
// its own: one "add /spec/tolerations/-" each, or one "add" of the list
// (or of spec) when the pod has none. It returns no operations when the pod
// lacks none. Tolerations are compared on key, operator, value and effect
// (an empty operator counts as Equal, as the API server reads it). A bad
// label value is refused with 400 and a message like `label
// acme.com/lifespan-requested must be an integer in [0, 14], got "15"`; a
// body that is not a pod JSON also gets 400.
func (p *Policy) Mutate(_ context.Context, req *admission.Request) ([]jsonedit.Op, admission.Verdict) {
	doc := req.ObjectDoc()
	var labels map[string]string
	if _, err := doc.Decode(&labels, "metadata", "labels"); err != nil {
		return nil, admission.Invalid("%s: cannot parse the pod: %v", Name, err)
	}
	have, err := toleration.Of(doc, "spec", "tolerations")
	if err != nil {
		return nil, admission.Invalid("%s: cannot parse the pod: %v", Name, err)
	}
	var requested *string
	if v, ok := labels[LabelRequested]; ok {
		requested = &v
	}
	want, err := Tolerations(requested, p.cfg.Max)
	if err != nil {
		return nil, admission.Invalid("%s", err.Error())
	}
	// The tolerations to add (want is a new slice: filtered in place), each
	// encoded once into one buffer.
	missing := slices.DeleteFunc(want, func(t corev1.Toleration) bool { return hasToleration(have, t) })
	if err := doc.AppendJSON([]string{"spec", "tolerations"}, toleration.Encode(missing)...); err != nil {
		return nil, admission.Invalid("%s: cannot edit the pod: %v", Name, err)
	}
	return doc.Ops(), admission.Allow()
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
