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
	// exists and day hold the tolerations Tolerations returns, encoded
	// (toleration.AppendJSON) and checked once, at New: exists for a pod
	// without the label, day[i] the Equal toleration of day i,
	// 0 <= i <= cfg.Max. At most MaxLimit+1 values of about 90 bytes.
	exists jsonedit.Fragment
	day    []jsonedit.Fragment
}

// New validates cfg and builds the policy; it returns Config.Validate's error
// unchanged so the caller can prefix the field path.
func New(cfg Config) (*Policy, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	p := &Policy{cfg: cfg}
	all, err := Tolerations(nil, cfg.Max)
	if err != nil {
		return nil, err
	}
	if p.exists, err = jsonedit.NewFragment(toleration.AppendJSON(nil, all[0])); err != nil {
		return nil, err
	}
	zero := "0"
	if all, err = Tolerations(&zero, cfg.Max); err != nil {
		return nil, err
	}
	p.day = make([]jsonedit.Fragment, len(all))
	for i, t := range all {
		if p.day[i], err = jsonedit.NewFragment(toleration.AppendJSON(nil, t)); err != nil {
			return nil, err
		}
	}
	return p, nil
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
	// Only the one label is read: the Doc locates it without decoding the
	// others (labels that are not an object still fail; another label's
	// value of the wrong type, which the API server never sends, is not
	// looked at).
	raw, err := doc.Get("metadata", "labels", LabelRequested)
	if err != nil {
		return nil, admission.Invalid("%s: cannot parse the pod: %v", Name, err)
	}
	// A null member decodes into a map[string]string as "", which the
	// label check refuses, as it refuses an empty value.
	labelled, value := raw != nil, ""
	if labelled {
		if _, err := doc.Decode(&value, "metadata", "labels", LabelRequested); err != nil {
			return nil, admission.Invalid("%s: cannot parse the pod: %v", Name, err)
		}
	}
	first := -1 // the first day whose toleration the pod needs; -1: Exists
	if labelled {
		if first, err = parseRequested(value, p.cfg.Max); err != nil {
			return nil, admission.Invalid("%s", err.Error())
		}
	}
	// have[i] (i >= first): the pod has the toleration of day i, or for
	// first == -1, have[0]: it has the Exists one.
	n := 1
	if first >= 0 {
		n = p.cfg.Max - first + 1
	}
	var small [16]bool
	var have []bool
	if n <= len(small) {
		have = small[:n]
	} else {
		have = make([]bool, n)
	}
	if err := p.markPresent(doc, first, have); err != nil {
		return nil, admission.Invalid("%s: cannot parse the pod: %v", Name, err)
	}
	// The tolerations to add, in Tolerations' order, each encoded at New.
	var missing []jsonedit.Fragment
	for k, ok := range have {
		if ok {
			continue
		}
		if first < 0 {
			missing = append(missing, p.exists)
		} else {
			missing = append(missing, p.day[first+k])
		}
	}
	if err := doc.AppendFragments([]string{"spec", "tolerations"}, missing...); err != nil {
		return nil, admission.Invalid("%s: cannot edit the pod: %v", Name, err)
	}
	return doc.Ops(), admission.Allow()
}

// markPresent sets have[k] for each toleration the pod's spec.tolerations
// already holds, comparing key, operator (empty counts as Equal, as the
// API server reads it), value and effect: have[i-first] for the Equal
// toleration of day i, or have[0] for the Exists one when first is -1.
// The list is read with toleration.ScanAt (no decoding, no allocation), or
// decoded when ScanAt refuses it; the error is the decoder's.
func (p *Policy) markPresent(doc *jsonedit.Doc, first int, have []bool) error {
	mark := func(key, op, value, effect []byte) {
		if string(key) != TaintKey || string(effect) != string(corev1.TaintEffectNoSchedule) {
			return
		}
		if first < 0 {
			if string(op) == string(corev1.TolerationOpExists) && len(value) == 0 {
				have[0] = true
			}
			return
		}
		if len(op) != 0 && string(op) != string(corev1.TolerationOpEqual) {
			return
		}
		if i, ok := day(value, p.cfg.Max); ok && i >= first {
			have[i-first] = true
		}
	}
	ok, err := toleration.ScanAt(doc, []string{"spec", "tolerations"}, func(r toleration.Raw) {
		mark(r.Key, r.Operator, r.Value, r.Effect)
	})
	if err != nil || ok {
		return err
	}
	clear(have) // ScanAt may have read some before it refused
	list, err := toleration.Of(doc, "spec", "tolerations")
	if err != nil {
		return err
	}
	for _, t := range list {
		mark([]byte(t.Key), []byte(t.Operator), []byte(t.Value), []byte(t.Effect))
	}
	return nil
}

// day returns the day v spells as Tolerations writes it (strconv.Itoa: no
// sign, no leading zero) when it is at most maxDays: values are compared
// as strings, so "03" is no day's toleration.
func day(v []byte, maxDays int) (int, bool) {
	if len(v) == 0 || len(v) > 4 || (v[0] == '0' && len(v) > 1) {
		return 0, false
	}
	n := 0
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, n <= maxDays
}

// BoundedReview marks the policy admission.Bounded, so its hooks run on
// the request's goroutine: it reads the pod it is given and nothing else.
func (*Policy) BoundedReview() {}
