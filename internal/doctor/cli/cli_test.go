package cli

import (
	"strings"
	"testing"

	"github.com/kadmit/kadmit/internal/doctor"
)

func TestReadFromError(t *testing.T) {
	const msg = `Internal error occurred: failed calling webhook "mpod.kb.io": failed to call webhook: Post "https://s.n.svc:443/m?timeout=10s": connect: connection refused`
	if got, err := readFromError(strings.NewReader("unused"), msg); err != nil || got != msg {
		t.Errorf("flag value: %q, %v", got, err)
	}
	if got, err := readFromError(strings.NewReader(msg+"\n"), "-"); err != nil || got != msg+"\n" {
		t.Errorf("stdin: %q, %v", got, err)
	}
	big := strings.Repeat("x", doctor.MaxErrorMessage+1)
	if _, err := readFromError(strings.NewReader(""), big); err == nil {
		t.Error("oversized flag value accepted")
	}
	// stdin is read only up to the bound plus one byte, then refused.
	r := strings.NewReader(big + strings.Repeat("y", 1<<20))
	if _, err := readFromError(r, "-"); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Errorf("oversized stdin: %v", err)
	}
	if r.Len() != 1<<20 {
		t.Errorf("read %d bytes past the bound", 1<<20-r.Len())
	}
	if _, err := readFromError(strings.NewReader("  \n"), "-"); err == nil {
		t.Error("empty stdin accepted")
	}
}
