package quantity

import (
	"errors"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
)

func TestParseAccepts(t *testing.T) {
	for _, s := range []string{"0", "1", "3500m", "4", "16Gi", "1e3", "1.5", "-2", "0e64", "1n", "9223372036854775m", "8Pi", "9P", "+1", ".5", "1e-9"} {
		q, err := Parse(s)
		if err != nil {
			t.Errorf("Parse(%q): %v", s, err)
			continue
		}
		if want := resource.MustParse(s); q.Cmp(want) != 0 {
			t.Errorf("Parse(%q) = %s, ParseQuantity gives %s", s, q.String(), want.String())
		}
	}
}

// TestParseRefusesBeforeArithmetic: each hostile spelling is refused with the
// bound in the message. Parsing any of them with resource.ParseQuantity
// takes seconds (1e9999999) or is unbounded; the coarse time bound below is
// a sanity check, the real proof is that magnitude() decides from the
// string alone.
func TestParseRefusesBeforeArithmetic(t *testing.T) {
	long := "1" + strings.Repeat("0", 10000)
	cases := map[string]string{
		"1e9999999":              "quantity 1e9999999 is out of range (|value| must be below 9223372036854775807m)",
		"-1e9999999":             "quantity -1e9999999 is out of range (|value| must be below 9223372036854775807m)",
		"1E-9999999":             "quantity 1E-9999999 is out of range (a nonzero |value| must be at least 1n)",
		"0e9999999":              "quantity 0e9999999 is out of range (the exponent must be within ±64)",
		long:                     "is out of range (at most 64 characters)",
		"9223372036854775807m":   "out of range (|value| must be below 9223372036854775807m)",
		"-9223372036854775807m":  "out of range (|value| must be below 9223372036854775807m)",
		"10E":                    "out of range (|value| must be below 9223372036854775807m)",
		"1e99999999999999999999": "out of range (|value| must be below 9223372036854775807m)",
		"1e-10":                  "at least 1n",
	}
	start := time.Now()
	for s, want := range cases {
		_, err := Parse(s)
		if err == nil || !strings.Contains(err.Error(), want) || !errors.Is(err, ErrOutOfRange) {
			t.Errorf("Parse(%.30q) = %v, want ErrOutOfRange containing %q", s, err, want)
		}
		if o, _, ok := magnitude(s); ok && len(s) <= MaxLen && o >= -9 && o <= 18 && s != "9223372036854775807m" && s != "-9223372036854775807m" {
			t.Errorf("magnitude(%q) = %d: would reach ParseQuantity", s, o)
		}
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("refusing %d hostile quantities took %v", len(cases), d)
	}
}

func TestParseSyntax(t *testing.T) {
	for _, s := range []string{"", "abc", "1x", "1e", "1e+", "1ee3", "--1", "1.2.3", "Ki"} {
		if _, err := Parse(s); err == nil || !errors.Is(err, resource.ErrFormatWrong) {
			t.Errorf("Parse(%q) = %v, want ErrFormatWrong", s, err)
		}
	}
}

func TestList(t *testing.T) {
	var l List
	if err := l.UnmarshalJSON([]byte(`{"memory":"1Gi","cpu":1e9999999}`)); err == nil ||
		err.Error() != "cpu: quantity 1e9999999 is out of range (|value| must be below 9223372036854775807m)" {
		t.Fatalf("got %v", err)
	}
	err := Prefix("status.allocatable", l.UnmarshalJSON([]byte(`{"cpu":"1E-9999999"}`)))
	if !strings.HasPrefix(err.Error(), "status.allocatable.cpu: quantity 1E-9999999") {
		t.Fatalf("got %v", err)
	}
	if err := l.UnmarshalJSON([]byte(`{"cpu":"2","memory":1024}`)); err != nil || func() bool { m := l["memory"]; return m.Value() != 1024 }() {
		t.Fatalf("got %v %v", l, err)
	}
}
