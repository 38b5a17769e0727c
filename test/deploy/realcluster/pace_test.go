package realcluster

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// Pace stops at its count, at its duration and at ctx's end, never runs
// more than PaceInFlight sends at once, and returns only when every send
// has finished.
func TestPaceBounds(t *testing.T) {
	var n atomic.Int32
	if !Pace(context.Background(), 1000, 10, time.Minute, func() { n.Add(1) }) || n.Load() != 10 {
		t.Fatalf("count bound: bounded=false or %d sends, want 10", n.Load())
	}

	n.Store(0)
	start := time.Now()
	if !Pace(context.Background(), 100, 1<<20, 200*time.Millisecond, func() { n.Add(1) }) {
		t.Fatal("duration bound not reported")
	}
	if took := time.Since(start); took > 2*time.Second || n.Load() == 0 || n.Load() > 25 {
		t.Fatalf("duration bound: %d sends in %s at 100/s for 200ms", n.Load(), took)
	}

	ctx, cancel := context.WithCancel(context.Background())
	var inFlight, peak atomic.Int32
	release := make(chan struct{})
	var finished atomic.Int32
	done := make(chan bool)
	go func() {
		done <- Pace(ctx, 10000, 1<<20, time.Minute, func() {
			if v := inFlight.Add(1); v > peak.Load() {
				peak.Store(v)
			}
			<-release
			inFlight.Add(-1)
			finished.Add(1)
		})
	}()
	for deadline := time.Now().Add(5 * time.Second); inFlight.Load() < PaceInFlight; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("only %d sends in flight", inFlight.Load())
		}
	}
	time.Sleep(50 * time.Millisecond)
	if p := peak.Load(); p > PaceInFlight {
		t.Fatalf("%d sends in flight, want at most %d", p, PaceInFlight)
	}
	cancel()
	close(release)
	if <-done {
		t.Fatal("ctx's end reported as a bound")
	}
	if f := finished.Load(); f != PaceInFlight {
		t.Fatalf("Pace returned with %d of %d sends finished", f, PaceInFlight)
	}
}
