package nodeovercommit

import (
	"errors"
	"testing"

	"gopkg.in/inf.v0"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func TestParseRatio(t *testing.T) {
	tests := []struct {
		in   string
		want string // "" when an error is expected
	}{
		{"1", "1"}, {"2", "2"}, {"1.5", "1.5"}, {"1.0", "1.0"}, {"4.25", "4.25"}, {"100", "100"},
		{"0.5", ""}, {"0", ""}, {"0.999", ""}, {"-2", ""}, {"+2", ""}, {"", ""}, {"abc", ""},
		{"1.", ""}, {".5", ""}, {"1e2", ""}, {"2 ", ""}, {" 2", ""}, {"2m", ""}, {"1,5", ""},
		{"1234567890123", ""}, {"1.1234567890123", ""},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseRatio(tt.in)
			if tt.want == "" {
				if err == nil {
					t.Fatalf("ParseRatio(%q) = %s, want error", tt.in, got)
				}
				if !errors.Is(err, ErrInvalidRatio) {
					t.Fatalf("error %v does not match ErrInvalidRatio", err)
				}
				if want := `must be a decimal >= 1, got "` + tt.in + `"`; err.Error() != want {
					t.Fatalf("error = %q, want %q", err, want)
				}
				return
			}
			if err != nil || got.String() != tt.want {
				t.Fatalf("ParseRatio(%q) = %v, %v; want %s", tt.in, got, err, tt.want)
			}
		})
	}
}

func TestParseBoundedRatio(t *testing.T) {
	tests := []struct{ in, max, wantErr string }{
		{"4", "4", ""},
		{"1", "1", ""},
		{"3.99", "4", ""},
		{"4.01", "4", `must be a decimal in [1, 4], got "4.01"`},
		{"0.5", "4", `must be a decimal in [1, 4], got "0.5"`},
		{"x", "2.5", `must be a decimal in [1, 2.5], got "x"`},
		{"2", "0.5", `maximum ratio: must be a decimal >= 1, got "0.5"`},
	}
	for _, tt := range tests {
		t.Run(tt.in+"/"+tt.max, func(t *testing.T) {
			_, err := ParseBoundedRatio(tt.in, tt.max)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || err.Error() != tt.wantErr || !errors.Is(err, ErrInvalidRatio) {
				t.Fatalf("err = %v, want %q matching ErrInvalidRatio", err, tt.wantErr)
			}
		})
	}
}

func TestAmplify(t *testing.T) {
	tests := []struct {
		name                        string
		resource                    corev1.ResourceName
		capacity, allocatable       string
		ratio                       string
		wantCapacity, wantAllocated string
	}{
		{"cpu keeps milli precision", "cpu", "4", "3500m", "2", "7500m", "7"},
		{"cpu new raw", "cpu", "4", "3", "2", "7", "6"},
		{"cpu ratio 1 is identity", "cpu", "4", "3500m", "1", "4", "3500m"},
		{"cpu fractional ratio", "cpu", "3", "2500m", "1.5", "4250m", "3750m"},
		{"cpu rounds down to milli", "cpu", "1", "333m", "1.5", "1166m", "499m"},
		{"cpu sub-milli ratio effect dropped", "cpu", "1", "1", "1.0005", "1", "1"},
		{"cpu 1.9 of a millicore rounds down", "cpu", "2", "1", "1.0019", "2001m", "1001m"},
		{"memory binary", "memory", "16Gi", "15Gi", "1.2", "19Gi", "18Gi"},
		{"memory kubelet Ki", "memory", "16318412Ki", "16216012Ki", "1.5", "24426418Ki", "24324018Ki"},
		{"memory rounds down to bytes", "memory", "2001", "1001", "1.5", "2501", "1501"},
		{"memory not a binary multiple", "memory", "1Ki", "1Ki", "1.5", "1536", "1536"},
		{"memory decimal SI", "memory", "2G", "1G", "1.5", "2500M", "1500M"},
		{"pods whole units", "pods", "110", "110", "1.25", "137", "137"},
		{"ephemeral storage", "ephemeral-storage", "100Gi", "90Gi", "2", "190Gi", "180Gi"},
		{"extended resource", "example.com/gpu", "3", "3", "1.5", "4", "4"},
		{"allocatable above capacity: no reserve", "cpu", "2", "3", "2", "6", "6"},
		{"zero", "cpu", "0", "0", "2", "0", "0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			capacity := resource.MustParse(tt.capacity)
			allocatable := resource.MustParse(tt.allocatable)
			ratio, err := ParseRatio(tt.ratio)
			if err != nil {
				t.Fatal(err)
			}
			c, a, err := Amplify(capacity, allocatable, ratio, tt.resource)
			if err != nil {
				t.Fatal(err)
			}
			if c.String() != tt.wantCapacity || a.String() != tt.wantAllocated {
				t.Fatalf("Amplify(%s, %s, %s) = capacity %s, allocatable %s; want %s, %s",
					tt.capacity, tt.allocatable, tt.ratio, c.String(), a.String(), tt.wantCapacity, tt.wantAllocated)
			}
			if c.Format != capacity.Format || a.Format != allocatable.Format {
				t.Errorf("formats %s/%s, want %s/%s", c.Format, a.Format, capacity.Format, allocatable.Format)
			}
			// The inputs must be left as they were.
			wantCap, wantAlloc := resource.MustParse(tt.capacity), resource.MustParse(tt.allocatable)
			if capacity.String() != wantCap.String() || allocatable.String() != wantAlloc.String() {
				t.Errorf("inputs changed: %s, %s", capacity.String(), allocatable.String())
			}
			// Amplifying is deterministic: the idempotency check relies on it.
			c2, a2, _ := Amplify(capacity, allocatable, ratio, tt.resource)
			if c2.Cmp(c) != 0 || a2.Cmp(a) != 0 {
				t.Errorf("second call gave %s, %s", c2.String(), a2.String())
			}
		})
	}
}

func TestAmplifyErrors(t *testing.T) {
	q := resource.MustParse("1")
	for _, ratio := range []*inf.Dec{nil, inf.NewDec(5, 1), inf.NewDec(0, 0), inf.NewDec(-2, 0)} {
		if _, _, err := Amplify(q, q, ratio, corev1.ResourceCPU); !errors.Is(err, ErrInvalidRatio) {
			t.Errorf("Amplify with ratio %v: err = %v, want ErrInvalidRatio", ratio, err)
		}
	}
}
