// Package quantity is the one range check for Kubernetes resource quantities
// that kadmit reads from objects, annotations and configuration.
//
// resource.ParseQuantity (k8s.io/apimachinery/pkg/api/resource/quantity.go)
// turns a spelling like "1e9999999" or "1E-9999999" into an inf.Dec and
// rounds it to nano-units, which rescales a big.Int by 10^9999999: seconds of
// CPU and hundreds of MB before any policy arithmetic, and minutes more for
// String or AsDec afterwards. Parse refuses such spellings by reading the
// string alone, before any big-number arithmetic, and only then calls
// ParseQuantity on a string whose cost is bounded.
//
// The accepted set is: at most MaxLen characters; |value| below MaxMilli
// milli-units (so Quantity.MilliValue and Value never overflow int64); a
// nonzero |value| at least 1n (Kubernetes would round smaller values up to
// 1n; no node, quota or request means them); an exponent ("e"/"E" suffix)
// within ±MaxExponent.
package quantity

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

const (
	// MaxLen is the longest quantity string accepted, in bytes. int64 has
	// 19 digits; 64 leaves room for a fraction and a suffix.
	MaxLen = 64
	// MaxMilli is the exclusive bound on |value| in milli-units:
	// math.MaxInt64, what Quantity.MilliValue can represent.
	MaxMilli = math.MaxInt64
	// MaxExponent bounds the "e"/"E" exponent of a quantity, in decimal
	// digits, even for zero ("0e9999999").
	MaxExponent = 64
)

// ErrOutOfRange is wrapped by every error about a quantity outside the
// accepted set; syntax errors wrap resource.ErrFormatWrong instead.
var ErrOutOfRange = errors.New("quantity out of range")

var maxQuantity = resource.NewMilliQuantity(MaxMilli, resource.DecimalSI)
var minQuantity = resource.NewMilliQuantity(-MaxMilli, resource.DecimalSI)

// RangeText is the accepted magnitude as it appears in errors.
var RangeText = fmt.Sprintf("|value| must be below %dm", int64(MaxMilli))

type rangeError struct{ value, why string }

func (e *rangeError) Error() string {
	return fmt.Sprintf("quantity %s is out of range (%s)", e.value, e.why)
}
func (e *rangeError) Is(target error) bool { return target == ErrOutOfRange }

// shown is s as it appears in an error: whole when short, else its first
// characters and its length.
func shown(s string) string {
	if len(s) <= MaxLen {
		return s
	}
	return fmt.Sprintf("%q... (%d characters)", s[:24], len(s))
}

// decimal orders of the SI suffixes; binary suffixes by their power of ten
// rounded down (2^10 ≈ 10^3.01), which only decides whether the exact check
// after ParseQuantity is cheap.
var suffixOrder = map[string]int{
	"": 0, "n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18,
	"Ki": 3, "Mi": 6, "Gi": 9, "Ti": 12, "Pi": 15, "Ei": 18,
}

// Parse is resource.ParseQuantity with bounded cost: it checks length,
// syntax and the order of magnitude from the string alone, parses, and then
// checks |value| < MaxMilli milli-units exactly. Errors read like
// `quantity 1e9999999 is out of range (|value| must be below
// 9223372036854775807m)` and wrap ErrOutOfRange, or wrap
// resource.ErrFormatWrong for a string that is no quantity.
func Parse(s string) (resource.Quantity, error) {
	if len(s) > MaxLen {
		return resource.Quantity{}, &rangeError{shown(s), fmt.Sprintf("at most %d characters", MaxLen)}
	}
	order, zero, ok := magnitude(s)
	if !ok {
		return resource.Quantity{}, fmt.Errorf("quantity %q: %w", s, resource.ErrFormatWrong)
	}
	if order == expOut {
		return resource.Quantity{}, &rangeError{s, fmt.Sprintf("the exponent must be within ±%d", MaxExponent)}
	}
	if !zero && order > 18 {
		return resource.Quantity{}, &rangeError{s, RangeText}
	}
	if !zero && order < -9 {
		return resource.Quantity{}, &rangeError{s, "a nonzero |value| must be at least 1n"}
	}
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return resource.Quantity{}, fmt.Errorf("quantity %q: %w", s, err)
	}
	if err := Check(q); err != nil {
		return resource.Quantity{}, &rangeError{s, RangeText}
	}
	return q, nil
}

// Check reports (wrapping ErrOutOfRange) a parsed quantity whose |value| is
// not below MaxMilli milli-units. Use it for quantities built in code; a
// quantity parsed from untrusted text must come from Parse, since parsing
// itself is the expensive step.
func Check(q resource.Quantity) error {
	if q.Cmp(*maxQuantity) >= 0 || q.Cmp(*minQuantity) <= 0 {
		return &rangeError{q.String(), RangeText}
	}
	return nil
}

const (
	tooBig   = math.MaxInt32
	tooSmall = math.MinInt32
	expOut   = math.MinInt32 + 1
)

// magnitude scans s with the grammar of apimachinery's parseQuantityString
// (resource/quantity.go, v0.37.1: [+-] digits [. digits] [suffix]) and returns
// the decimal order of its leading nonzero digit (value in
// [10^order, 10^(order+1)) up to the binary-suffix approximation), whether
// the mantissa is zero, and false when s is no quantity. order is tooBig /
// tooSmall for exponents beyond ±MaxExponent with a nonzero mantissa and
// expOut for a zero one. It does no arithmetic beyond small ints.
func magnitude(s string) (order int, zero, ok bool) {
	i := 0
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		i++
	}
	intStart := i
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	intDigits := s[intStart:i]
	var fracDigits string
	if i < len(s) && s[i] == '.' {
		i++
		fs := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		fracDigits = s[fs:i]
	}
	if intDigits == "" && fracDigits == "" {
		return 0, false, false
	}
	lead := 0
	zero = true
	if t := trimZeros(intDigits); t != "" {
		lead, zero = len(t)-1, false
	} else if j := firstNonZero(fracDigits); j >= 0 {
		lead, zero = -(j + 1), false
	}
	suffix := s[i:]
	if o, known := suffixOrder[suffix]; known {
		return lead + o, zero, true
	}
	if suffix[0] != 'e' && suffix[0] != 'E' {
		return 0, false, false
	}
	exp := suffix[1:]
	neg := false
	if exp != "" && (exp[0] == '+' || exp[0] == '-') {
		neg = exp[0] == '-'
		exp = exp[1:]
	}
	if exp == "" {
		return 0, false, false
	}
	for k := 0; k < len(exp); k++ {
		if exp[k] < '0' || exp[k] > '9' {
			return 0, false, false
		}
	}
	exp = trimZeros(exp)
	e := 0
	if len(exp) > 4 {
		e = MaxExponent + 1
	} else {
		for k := 0; k < len(exp); k++ {
			e = e*10 + int(exp[k]-'0')
		}
	}
	if e > MaxExponent {
		switch {
		case zero:
			return expOut, true, true
		case neg:
			return tooSmall, false, true
		default:
			return tooBig, false, true
		}
	}
	if neg {
		e = -e
	}
	return lead + e, zero, true
}

func trimZeros(d string) string {
	for len(d) > 0 && d[0] == '0' {
		d = d[1:]
	}
	return d
}

func firstNonZero(d string) int {
	for k := 0; k < len(d); k++ {
		if d[k] != '0' {
			return k
		}
	}
	return -1
}

// ParseJSON is Parse for a JSON value the way resource.Quantity's
// UnmarshalJSON reads it: a string, or a bare JSON number; null is the zero
// quantity.
func ParseJSON(raw []byte) (resource.Quantity, error) {
	raw = bytes.TrimSpace(raw)
	if bytes.Equal(raw, []byte("null")) {
		return resource.Quantity{}, nil
	}
	if len(raw) > 0 && raw[0] == '"' {
		if len(raw) > MaxLen+2 {
			return resource.Quantity{}, &rangeError{shown(string(raw)), fmt.Sprintf("at most %d characters", MaxLen)}
		}
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return resource.Quantity{}, err
		}
		return Parse(s)
	}
	return Parse(string(raw))
}

// List is a corev1.ResourceList whose quantities come from Parse: use it in
// place of corev1.ResourceList in any struct decoded from untrusted JSON.
// Its errors name the resource: `cpu: quantity 1e9999999 is out of range
// (...)`; resources are checked in name order so the error is stable.
type List corev1.ResourceList

// UnmarshalJSON decodes a JSON object of resource name to quantity.
func (l *List) UnmarshalJSON(b []byte) error {
	var raw map[corev1.ResourceName]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	if raw == nil {
		*l = nil
		return nil
	}
	out := make(List, len(raw))
	for _, n := range slices.Sorted(maps.Keys(raw)) {
		q, err := ParseJSON(raw[n])
		if err != nil {
			return &FieldError{Field: string(n), Err: err}
		}
		out[n] = q
	}
	*l = out
	return nil
}

// FieldError is an error about one field, read as "<field>: <err>". Callers
// decoding nested structures prefix the outer path with Prefix.
type FieldError struct {
	Field string
	Err   error
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Err.Error() }
func (e *FieldError) Unwrap() error { return e.Err }

// Prefix returns err with path prepended to its field ("status.allocatable"
// + "cpu" → "status.allocatable.cpu") when err holds a FieldError, else
// "path: err".
func Prefix(path string, err error) error {
	var fe *FieldError
	if errors.As(err, &fe) {
		return &FieldError{Field: path + "." + fe.Field, Err: fe.Err}
	}
	return &FieldError{Field: path, Err: err}
}
