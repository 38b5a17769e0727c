package celpolicy_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/kadmit/kadmit/internal/celpolicy"
)

// In-memory documents are bounded as files are: their number, each one's
// size, and the objects of all of them together.
func TestLoadAllBounds(t *testing.T) {
	if _, err := celpolicy.LoadAll(nil, make([]celpolicy.Document, celpolicy.MaxFiles+1)); !errors.Is(err, celpolicy.ErrInput) {
		t.Errorf("too many documents: %v", err)
	}
	big := celpolicy.Document{Name: "big", Data: strings.Repeat("#", celpolicy.MaxFileBytes+1)}
	if _, err := celpolicy.LoadAll(nil, []celpolicy.Document{big}); !errors.Is(err, celpolicy.ErrInput) || !strings.Contains(err.Error(), "big: larger than") {
		t.Errorf("oversized document: %v", err)
	}
	var b strings.Builder
	for i := range celpolicy.MaxDocuments/2 + 1 {
		fmt.Fprintf(&b, "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: p%d, namespace: default}\n---\n", i)
	}
	half := celpolicy.Document{Name: "half", Data: b.String()}
	other := celpolicy.Document{Name: "other", Data: strings.ReplaceAll(b.String(), "name: p", "name: q")}
	if _, err := celpolicy.LoadAll(nil, []celpolicy.Document{half, other}); !errors.Is(err, celpolicy.ErrInput) || !strings.Contains(err.Error(), "more than") {
		t.Errorf("too many objects over two documents: %v", err)
	}
	if _, err := celpolicy.LoadAll(nil, []celpolicy.Document{half}); err != nil {
		t.Errorf("one half: %v", err)
	}
}
