package logging

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
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

// TestFieldCaps pins the log field bounds: 1 KiB for a field, 8 KiB for
// a panic's stack, each cut with its count of bytes cut.
func TestFieldCaps(t *testing.T) {
	var buf bytes.Buffer
	log, err := New(&buf, "json", "info")
	if err != nil {
		t.Fatal(err)
	}
	log.Info("m", "uid", strings.Repeat("u", 100_000), "stack", strings.Repeat("s", 100_000))
	var m map[string]string
	if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	for key, keep := range map[string]int{"uid": 1024, "stack": 8192} {
		want := strings.Repeat(key[:1], keep) + fmt.Sprintf("…[%d bytes cut]", 100_000-keep)
		if m[key] != want {
			t.Errorf("%s: %d bytes logged, want %d kept and the rest counted: tail %q", key, len(m[key]), keep, m[key][max(0, len(m[key])-40):])
		}
	}
}
