package main

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kadmit/kadmit/internal/cmdexit"
)

// The cluster flags of kadmit test do something only with --server: alone
// they are refused (exit 2) rather than silently ignored. With --server,
// a kubeconfig that does not load is an input error naming it. The run
// against a real API server is test/e2e/testserver's.
func TestTestServerFlags(t *testing.T) {
	suite := filepath.Join("..", "..", "examples", "cel", "pod-name")
	for _, args := range [][]string{
		{suite, "--kubeconfig", "/nonexistent"},
		{suite, "--context", "kind"},
		{suite, "--server-wait", "5s"},
	} {
		_, err := runTrustCmd(newTestCmd(), args...)
		var ee *cmdexit.Error
		if !errors.As(err, &ee) || ee.Code != 2 || !strings.Contains(err.Error(), "needs --server") {
			t.Errorf("%v: %v, want exit 2: needs --server", args[1:], err)
		}
	}
	_, err := runTrustCmd(newTestCmd(), suite, "--server", "--kubeconfig", filepath.Join(t.TempDir(), "missing"))
	var ee *cmdexit.Error
	if !errors.As(err, &ee) || ee.Code != 2 || !strings.Contains(err.Error(), "load kubeconfig") {
		t.Errorf("--server with a missing kubeconfig: %v, want exit 2 naming the kubeconfig", err)
	}
}
