package celtest

import (
	"context"
	"strings"
	"testing"
)

// TestExampleSuites is `kadmit test examples/cel` inside `make unit`: every
// suite under examples/cel passes. The suites record what the API server
// decides (test/e2e/celdiff checks those records against a real
// kube-apiserver), so a loading or evaluation bug that changes a decision
// (a binding's namespaceSelector dropped, a missing param let through)
// fails here without a control plane.
func TestExampleSuites(t *testing.T) {
	files, err := Find("../../examples/cel")
	if err != nil {
		t.Fatal(err)
	}
	// A Find that silently found nothing would pass every suite.
	if len(files) < 10 {
		t.Fatalf("found %d suites under examples/cel, want at least 10: %v", len(files), files)
	}
	tests := 0
	for _, f := range files {
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
	}
	if tests < 30 {
		t.Errorf("ran %d tests, want at least 30", tests)
	}
}
