package quantity

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
)

// FuzzParse: whatever Parse accepts, resource.ParseQuantity accepts with the
// same value, inside the bound (MilliValue does not overflow: the round trip
// through milli-units is exact up to the sub-milli rounding). Parse itself
// never calls ParseQuantity on a refused string, so refusals cost nothing
// to check here.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"0", "3500m", "16Gi", "1e3", "-1.5", "1e9999999", "1E-9999999", "0e99", "9223372036854775806m", "8Pi", ".5", "1.", "+7k", "1n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		q, err := Parse(s)
		if err != nil {
			return
		}
		want, err := resource.ParseQuantity(s)
		if err != nil {
			t.Fatalf("Parse(%q) accepted what ParseQuantity refuses: %v", s, err)
		}
		if q.Cmp(want) != 0 {
			t.Fatalf("Parse(%q) = %s, ParseQuantity = %s", s, q.String(), want.String())
		}
		m := q.MilliValue()
		back := resource.NewMilliQuantity(m, q.Format)
		diff := back.DeepCopy()
		diff.Sub(q)
		if diff.Cmp(resource.MustParse("1m")) >= 0 || diff.Sign() < 0 {
			t.Fatalf("Parse(%q) = %s: MilliValue %d does not hold it", s, q.String(), m)
		}
	})
}
