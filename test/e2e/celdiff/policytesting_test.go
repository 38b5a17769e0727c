package celdiff

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/kadmit/kadmit/internal/policysuite"
)

// TestPolicyTestingExamples runs the examples of docs/policy-testing.md
// through both kadmit and the API server, as TestCorpus does the corpus:
// the page shows them as what the API server decides, so they must be.
// Listed by name, not found: request-context is left out because this
// harness sends every request as a server-side dry run with the API
// server's default options and its own user, and that suite's policy
// reads request.dryRun, request.options and request.userInfo (kadmit
// test --server covers it); suites other features add there come with
// their own checks.
func TestPolicyTestingExamples(t *testing.T) {
	requireWorld(t)
	for _, d := range []string{"cluster-state", "mutate-then-validate", "file-formats"} {
		files, err := policysuite.Find(filepath.Join("..", "..", "..", "examples", "policy-testing", d))
		if err != nil {
			t.Fatal(err)
		}
		if len(files) != 1 {
			t.Fatalf("%s: want one suite, found %v", d, files)
		}
		s, err := policysuite.ReadSuite(files[0])
		if err != nil {
			t.Fatal(err)
		}
		t.Run(d, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			diffSuite(ctx, t, files[0], s)
		})
	}
}
