package e2eenv

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLogTailKeepsTheLastLines(t *testing.T) {
	p := filepath.Join(t.TempDir(), "controlplane.log")
	var b strings.Builder
	for i := 1; i <= 5000; i++ {
		fmt.Fprintf(&b, "line %d\n", i)
	}
	if err := os.WriteFile(p, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	got := logTail(p, 3)
	if got != "line 4998\nline 4999\nline 5000" {
		t.Errorf("logTail = %q", got)
	}
	if got := logTail(filepath.Join(t.TempDir(), "absent"), 3); !strings.Contains(got, "cannot read") {
		t.Errorf("logTail of a missing file = %q; want it to say so", got)
	}
}
