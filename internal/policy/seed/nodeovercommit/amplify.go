package nodeovercommit

import (
	"errors"
	"fmt"
	"regexp"

	"gopkg.in/inf.v0"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// ErrInvalidRatio is wrapped by every error about a ratio that is not a
// decimal string or is out of range.
var ErrInvalidRatio = errors.New("invalid overcommit ratio")

// ratioSyntax is the only spelling a ratio may have: plain digits with an
// optional fraction ("2", "1.5"). Exponents, signs and SI suffixes are refused
// so a ratio reads the same to people and to the policy; the length cap keeps
// annotation-supplied numbers cheap to compute with.
var ratioSyntax = regexp.MustCompile(`^[0-9]{1,12}(\.[0-9]{1,12})?$`)

var one = inf.NewDec(1, 0)

// RatioError reports a ratio that is not a decimal string in [1, Max] (or
// ≥ 1 when Max is empty). Its message is meant to follow a field or resource
// name: `must be a decimal in [1, 4], got "0.5"`. It matches ErrInvalidRatio.
type RatioError struct {
	Value string
	Max   string
}

func (e *RatioError) Error() string {
	if e.Max == "" {
		return fmt.Sprintf("must be a decimal >= 1, got %q", e.Value)
	}
	return fmt.Sprintf("must be a decimal in [1, %s], got %q", e.Max, e.Value)
}

// Is makes errors.Is(err, ErrInvalidRatio) hold.
func (e *RatioError) Is(target error) bool { return target == ErrInvalidRatio }

// ParseRatio parses a ratio: a decimal string like "1.5" (digits with an
// optional fraction, at most 12 digits each side), ≥ 1. It returns a
// *RatioError (matching ErrInvalidRatio) otherwise. Upper bounds are
// ParseBoundedRatio's.
func ParseRatio(s string) (*inf.Dec, error) {
	if !ratioSyntax.MatchString(s) {
		return nil, &RatioError{Value: s}
	}
	d, ok := new(inf.Dec).SetString(s)
	if !ok || d.Cmp(one) < 0 {
		return nil, &RatioError{Value: s}
	}
	return d, nil
}

// ParseBoundedRatio is ParseRatio with an upper bound: s must be a decimal in
// [1, maxRatio]; maxRatio is a decimal string ≥ 1. It returns a *RatioError
// (matching ErrInvalidRatio) naming the range, or ParseRatio's error when
// maxRatio itself is invalid.
func ParseBoundedRatio(s, maxRatio string) (*inf.Dec, error) {
	m, err := ParseRatio(maxRatio)
	if err != nil {
		return nil, fmt.Errorf("maximum ratio: %w", err)
	}
	return parseBoundedRatio(s, maxRatio, m)
}

func parseBoundedRatio(s, maxText string, maxRatio *inf.Dec) (*inf.Dec, error) {
	r, err := ParseRatio(s)
	if err != nil || r.Cmp(maxRatio) > 0 {
		return nil, &RatioError{Value: s, Max: maxText}
	}
	return r, nil
}

// Amplify overcommits one resource of a node while keeping what the kubelet
// reserves for the system.
//
// ratio: decimal ≥ 1; reserved = capacity − allocatable (0 when allocatable >
// capacity, which a kubelet should never report, so that capacity' never drops
// below allocatable'); allocatable' = allocatable × ratio, capacity' =
// allocatable' + reserved. Both results are rounded down, to milli-units for
// cpu and to whole units for every other resource (bytes, pods, devices),
// because the scheduler cannot hand out fractions of those; 3500m × 2 = 7,
// never 6. Results keep the inputs' Format (DecimalSI, BinarySI...). Returns
// an error wrapping ErrInvalidRatio when ratio is nil or below 1.
func Amplify(capacity, allocatable resource.Quantity, ratio *inf.Dec, name corev1.ResourceName) (newCapacity, newAllocatable resource.Quantity, err error) {
	if ratio == nil {
		return resource.Quantity{}, resource.Quantity{}, fmt.Errorf("%w: amplify %s: ratio is missing", ErrInvalidRatio, name)
	}
	if ratio.Cmp(one) < 0 {
		return resource.Quantity{}, resource.Quantity{}, fmt.Errorf("%w: amplify %s: ratio %s is below 1", ErrInvalidRatio, name, ratio)
	}
	// AsDec converts the receiver in place; work on copies so callers'
	// quantities keep their representation.
	capDec := new(inf.Dec).Set(capacity.AsDec())
	allocDec := new(inf.Dec).Set(allocatable.AsDec())

	reserved := new(inf.Dec).Sub(capDec, allocDec)
	if reserved.Sign() < 0 {
		reserved.SetUnscaled(0).SetScale(0)
	}
	scale := inf.Scale(0)
	if name == corev1.ResourceCPU {
		scale = 3
	}
	a := new(inf.Dec).Mul(allocDec, ratio)
	a.Round(a, scale, inf.RoundFloor)
	c := new(inf.Dec).Add(a, reserved)
	c.Round(c, scale, inf.RoundFloor)
	return *resource.NewDecimalQuantity(*c, capacity.Format), *resource.NewDecimalQuantity(*a, allocatable.Format), nil
}
