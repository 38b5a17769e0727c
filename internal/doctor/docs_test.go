package doctor

import (
	"maps"
	"os"
	"regexp"
	"slices"
	"testing"
)

// Every check ID has a row in docs/troubleshooting.md's check table, and
// every row there is a check.
func TestChecksDocumented(t *testing.T) {
	b, err := os.ReadFile("../../docs/troubleshooting.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\| (KD\d{3}) \|`).FindAllStringSubmatch(string(b), -1) {
		documented[m[1]] = true
	}
	var missing []string
	for _, c := range Checks {
		if !documented[c.ID] {
			missing = append(missing, c.ID)
		}
		delete(documented, c.ID)
	}
	extra := slices.Sorted(maps.Keys(documented))
	if len(missing) > 0 || len(extra) > 0 {
		t.Errorf("checks without a row in docs/troubleshooting.md: %v; rows without a check: %v", missing, extra)
	}
}
