package kueuecluster

import (
	"fmt"
	"os"
	"testing"

	"github.com/kadmit/kadmit/test/cluster"
)

// EnvCompare opts in to the comparison: it takes about 20 minutes, so
// `make test` (whose test-deploy runs `go test ./...` in this module) skips
// it; `make kueue-compare` sets it.
const EnvCompare = "KADMIT_KUEUE_COMPARE"

// TestMain re-executes the test binary in the private namespaces a real
// cluster needs (cluster.Main: SKIP without them, FAIL with
// KADMIT_E2E_REQUIRED=1), unless the comparison is not asked for.
func TestMain(m *testing.M) {
	if os.Getenv(EnvCompare) != "1" {
		fmt.Fprintf(os.Stderr, "kueuecluster: %s is not 1: the comparison (about 20 minutes) runs with make kueue-compare\n", EnvCompare)
		os.Exit(m.Run())
	}
	os.Exit(cluster.Main(m.Run))
}
