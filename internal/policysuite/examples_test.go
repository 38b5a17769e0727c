package policysuite

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
)

// TestExampleSuites is `kadmit test examples` inside `make unit`: every
// suite anywhere under examples/ passes — the corpus of examples/cel and
// the per-feature examples of examples/policy-testing (docs/policy-testing.md)
// alike, so an example the documentation shows cannot silently rot. The
// examples/cel suites record what the API server decides (test/e2e/celdiff
// checks those records against a real kube-apiserver), so a loading or
// evaluation bug that changes a decision (a binding's namespaceSelector
// dropped, a missing param let through) fails here without a control plane.
func TestExampleSuites(t *testing.T) {
	files, err := Find("../../examples")
	if err != nil {
		t.Fatal(err)
	}
	// A Find that silently found nothing (or lost a directory) would pass
	// every suite.
	perDir := map[string]int{}
	for _, f := range files {
		rel, _ := filepath.Rel("../../examples", f)
		perDir[strings.SplitN(filepath.ToSlash(rel), "/", 2)[0]]++
	}
	if perDir["cel"] < 10 || perDir["policy-testing"] < 4 {
		t.Fatalf("found suites per examples directory %v, want at least 10 under cel and 4 under policy-testing: %v", perDir, files)
	}
	tests := 0
	for _, f := range files {
		rel, _ := filepath.Rel("../../examples", f)
		t.Run(filepath.ToSlash(rel), func(t *testing.T) {
			s, err := ReadSuite(f)
			if err != nil {
				t.Fatal(err)
			}
			rs, err := Run(context.Background(), s)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range rs {
				tests++
				if len(r.Failures) > 0 {
					t.Errorf("%s: %s:\n  %s", r.Suite, r.Test, strings.Join(r.Failures, "\n  "))
				}
			}
		})
	}
	if tests < 40 {
		t.Errorf("ran %d tests, want at least 40", tests)
	}
}
