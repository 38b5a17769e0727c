package kueuecluster

import (
	"os"
	"testing"

	"github.com/kadmit/kadmit/test/cluster"
)

// TestMain re-executes the test binary in the private namespaces a real
// cluster needs (cluster.Main: SKIP without them, FAIL with
// KADMIT_E2E_REQUIRED=1). The package takes 6-10 minutes: make
// test-deploy leaves it out, make kueue-compare runs it.
func TestMain(m *testing.M) { os.Exit(cluster.Main(m.Run)) }
