package quantity

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
)

// FuzzParse: whatever Parse accepts, resource.ParseQuantity accepts with the
// same value, inside the bound. Parse itself
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
		// The bound by comparison, not MilliValue: apimachinery v0.37.1
		// parses some negative binary spellings inconsistently ("-1Pi" has
		// Value -2882303760), which is ParseQuantity's own behaviour.
		if err := Check(q); err != nil {
			t.Fatalf("Parse(%q) accepted an out-of-range value: %v", s, err)
		}
	})
}
