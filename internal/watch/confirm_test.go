package watch

import (
	"testing"
	"time"

	"github.com/kadmit/kadmit/internal/doctor"
)

func TestConfirmer(t *testing.T) {
	c := newConfirmer()
	w := wkey{doctor.KindValidating, "c", "w"}
	t0 := time.Unix(1_800_000_000, 0)
	refused := doctor.Finding{ID: doctor.IDEndpointRefused, Severity: doctor.SeverityError, Endpoint: "10.0.0.1:9443"}
	collision := doctor.Finding{ID: doctor.IDSelectorCollision, Severity: doctor.SeverityError}
	info := doctor.Finding{ID: doctor.IDAccessGap, Severity: doctor.SeverityInfo}
	seq := uint64(7)
	seqOf := func(string) (uint64, bool) { return seq, true }
	step := func(at time.Duration, fs ...doctor.Finding) ([]doctor.Finding, []string, bool) {
		kept, recheck, reeval := c.filter(t0.Add(at), w, fs, seqOf, 500*time.Millisecond)
		c.sweep()
		return kept, recheck, reeval
	}
	kept, recheck, reeval := step(0, refused, collision, info)
	if len(kept) != 1 || kept[0].ID != doctor.IDAccessGap || len(recheck) != 1 || !reeval {
		t.Fatalf("first sight: kept %v, recheck %v, reeval %v", kept, recheck, reeval)
	}
	// Same handshake result, 100ms later: neither is confirmed yet.
	if kept, recheck, _ = step(100*time.Millisecond, refused, collision); len(kept) != 0 || len(recheck) != 1 {
		t.Fatalf("same handshake: kept %v, recheck %v", kept, recheck)
	}
	// A later handshake shows it again; the informer finding is old enough.
	seq = 8
	if kept, recheck, reeval = step(600*time.Millisecond, refused, collision); len(kept) != 2 || len(recheck) != 0 || reeval {
		t.Fatalf("confirmed: kept %v, recheck %v, reeval %v", kept, recheck, reeval)
	}
	// Gone for one evaluation: it must be confirmed afresh.
	step(700 * time.Millisecond)
	if kept, _, _ = step(800*time.Millisecond, refused, collision); len(kept) != 0 {
		t.Fatalf("after a gap: kept %v", kept)
	}
	step(900 * time.Millisecond)
	if len(c.first) != 0 {
		t.Fatalf("entries kept for findings gone: %v", c.first)
	}
}
