package logging

import (
	"io"
	"testing"
	"time"
)

// TestBufferedLoggerDefaults pins the figures of docs/security.md's "log
// output buffer" bound for the writer `kadmit serve` uses: two 64 KiB
// buffers, flushed every 100 ms, a line waiting at most 100 ms for room,
// and 5 s for the final flush. TestBufferedStalledOutputIsBounded and
// TestBufferedFlushesOnInterval prove the mechanism with smaller values.
func TestBufferedLoggerDefaults(t *testing.T) {
	_, b, err := NewBufferedLogger(io.Discard, "json", "info")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close(0)
	b.mu.Lock()
	held := cap(b.active) + cap(b.spare)
	b.mu.Unlock()
	if b.size != 64<<10 || held != 2*64<<10 || b.interval != 100*time.Millisecond || b.maxBlock != 100*time.Millisecond {
		t.Fatalf("buffer %d bytes (%d held), flush every %s, wait for room %s; want 64 KiB (two), 100ms, 100ms", b.size, held, b.interval, b.maxBlock)
	}
	if DefaultCloseTimeout != 5*time.Second {
		t.Fatalf("final flush bounded by %s, want 5s", DefaultCloseTimeout)
	}
}
