package gcpace

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"testing"
	"time"

	"github.com/kadmit/kadmit/internal/testkit"
)

func TestPercentFor(t *testing.T) {
	for _, c := range []struct {
		live  uint64
		floor int64
		base  int
		want  int
	}{
		{live: 8 << 20, floor: 64 << 20, base: 100, want: 700},        // goal 8 MiB × 8 = 64 MiB
		{live: 32 << 20, floor: 64 << 20, base: 100, want: 100},       // the base already reaches the floor
		{live: 100 << 20, floor: 64 << 20, base: 100, want: 100},      // above the floor: GOGC unchanged
		{live: 8 << 20, floor: 64 << 20, base: 1000, want: 1000},      // a larger GOGC is kept
		{live: 1 << 10, floor: 64 << 20, base: 100, want: maxPercent}, // bounded
		{live: 0, floor: 64 << 20, base: 100, want: 6300},             // no collection yet: 1 MiB assumed
	} {
		if got := percentFor(c.live, c.floor, c.base); got != c.want {
			t.Errorf("percentFor(%d, %d, %d) = %d, want %d", c.live, c.floor, c.base, got, c.want)
		}
	}
}

// TestPacerFollowsCollections: the Pacer raises GOGC after collections
// while the live heap is far below the floor, and Stop restores the base.
func TestPacerFollowsCollections(t *testing.T) {
	t.Setenv("GOGC", "100")
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	p := Start(256 << 20)
	if p == nil {
		t.Fatal("Start returned nil for a positive floor")
	}
	// Between calls the finalizer goroutine runs after the forced cycle.
	testkit.EventuallyNil(t, 10*time.Second, "three collections seen", func() error {
		if runtime.GC(); p.Cycles() < 3 {
			return fmt.Errorf("saw %d collections after forcing one more", p.Cycles())
		}
		return nil
	})
	got := p.Percent()
	if got <= 100 {
		t.Fatalf("GOGC %d with a test's few-MiB live heap under a 256 MiB floor; want it raised", got)
	}
	if cur := debug.SetGCPercent(got); cur != got {
		t.Fatalf("runtime GOGC %d, Pacer says %d", cur, got)
	}
	p.Stop()
	if cur := debug.SetGCPercent(100); cur != 100 {
		t.Fatalf("GOGC %d after Stop, want the base 100", cur)
	}
	n := p.Cycles()
	runtime.GC()
	runtime.GC()
	time.Sleep(20 * time.Millisecond)
	if p.Cycles() > n+1 {
		t.Fatalf("a stopped Pacer kept tuning: %d cycles after %d", p.Cycles(), n)
	}
}

// TestFloorBelowHalfTheLimit: a floor above half of GOMEMLIMIT is lowered
// to half of it, so the floor never takes the room the limit leaves.
func TestFloorBelowHalfTheLimit(t *testing.T) {
	t.Setenv("GOGC", "100")
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(100 << 20))
	p := Start(1 << 30)
	defer p.Stop()
	if p.Floor() != 50<<20 {
		t.Fatalf("floor %d under a 100 MiB limit, want 50 MiB", p.Floor())
	}
}

func TestOffWhenAskedTo(t *testing.T) {
	t.Setenv("GOGC", "off")
	if p := Start(DefaultFloor); p != nil {
		p.Stop()
		t.Fatal("GOGC=off: want no Pacer")
	}
	t.Setenv("GOGC", "100")
	if p := Start(0); p != nil {
		p.Stop()
		t.Fatal("floor 0: want no Pacer")
	}
}
