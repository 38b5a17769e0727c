package celtest

import (
	"context"
	"strings"
	"testing"
)

// The example suite records the API server's decisions (test/e2e/celdiff
// checks it against kube-apiserver) and says defaults: true; run as
// written, without the defaults, the JSONPatch appending to tolerations
// fails on every pod that has none and the limits-only pod has no
// requests: the offline/server difference the option closes.
func TestDefaultsSuite(t *testing.T) {
	s, err := ReadSuite("../../examples/cel/defaults-tolerations/suite.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !s.Defaults {
		t.Fatal("the example suite must say defaults: true")
	}
	for _, defaults := range []bool{true, false} {
		s.Defaults = defaults
		rs, err := Run(context.Background(), s)
		if err != nil {
			t.Fatal(err)
		}
		failed := map[string]string{}
		for _, r := range rs {
			if len(r.Failures) > 0 {
				failed[r.Test] = strings.Join(r.Failures, "; ")
			}
		}
		if defaults {
			if len(failed) > 0 {
				t.Errorf("with defaults: %v", failed)
			}
			continue
		}
		if len(failed) != len(rs) {
			t.Errorf("without defaults: %d of %d tests failed, want all: %v", len(failed), len(rs), failed)
		}
		if f := failed[rs[0].Test]; !strings.Contains(f, `doc is missing path: "/spec/tolerations/-"`) {
			t.Errorf("without defaults, %s: got %s, want the JSONPatch failure", rs[0].Test, f)
		}
	}
}
