package logging

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer is an output that can be stalled.
type syncBuffer struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	gate  chan struct{} // while not nil and open, Write blocks
	calls int
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	gate := s.gate
	s.mu.Unlock()
	if gate != nil {
		<-gate
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	return s.buf.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

func line(i int) string { return fmt.Sprintf("line %05d %s\n", i, strings.Repeat("x", 80)) }

// Lines reach the output within the flush interval, without Flush, in
// far fewer writes than lines.
func TestBufferedFlushesOnInterval(t *testing.T) {
	out := &syncBuffer{}
	b := NewBuffered(out, BufferedOptions{FlushInterval: 10 * time.Millisecond})
	defer b.Close(0)
	var want strings.Builder
	for i := range 100 {
		want.WriteString(line(i))
		if _, err := b.Write([]byte(line(i))); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for out.String() != want.String() {
		if time.Now().After(deadline) {
			t.Fatalf("after 10 s the output holds %d of %d bytes", len(out.String()), want.Len())
		}
		time.Sleep(5 * time.Millisecond)
	}
	out.mu.Lock()
	calls := out.calls
	out.mu.Unlock()
	if calls >= 100 {
		t.Errorf("%d output writes for 100 lines: not buffered", calls)
	}
}

// Close writes every buffered line, in order, and later lines go straight
// to the output.
func TestBufferedCloseFlushes(t *testing.T) {
	out := &syncBuffer{}
	b := NewBuffered(out, BufferedOptions{FlushInterval: time.Hour, BufferBytes: 1 << 20})
	var want strings.Builder
	for i := range 500 {
		want.WriteString(line(i))
		b.Write([]byte(line(i)))
	}
	if out.String() != "" {
		t.Fatal("written before the interval or a full buffer")
	}
	if err := b.Close(0); err != nil {
		t.Fatal(err)
	}
	if out.String() != want.String() {
		t.Fatalf("after Close the output holds %d of %d bytes", len(out.String()), want.Len())
	}
	b.Write([]byte("after close\n"))
	if !strings.HasSuffix(out.String(), "after close\n") {
		t.Fatal("a line written after Close was not written through")
	}
	if err := b.Close(0); err != nil {
		t.Fatal("second Close:", err)
	}
}

// Lines written by many goroutines all arrive once, whole.
func TestBufferedConcurrentWriters(t *testing.T) {
	out := &syncBuffer{}
	// MaxBlock is long: writers that never block can starve the flusher
	// on a loaded machine, and this test is about lines arriving whole.
	b := NewBuffered(out, BufferedOptions{BufferBytes: 4 << 10, FlushInterval: time.Millisecond, MaxBlock: time.Minute})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 500 {
				b.Write([]byte(line(g*1000 + i)))
			}
		}()
	}
	wg.Wait()
	if err := b.Close(0); err != nil {
		t.Fatal(err)
	}
	if b.Dropped() != 0 {
		t.Fatalf("%d lines dropped with a draining output", b.Dropped())
	}
	seen := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n") {
		if seen[l] || !strings.HasPrefix(l, "line ") || len(l) != len(line(0))-1 {
			t.Fatalf("line %q duplicated or torn", l)
		}
		seen[l] = true
	}
	if len(seen) != 8*500 {
		t.Fatalf("%d lines, want %d", len(seen), 8*500)
	}
}

// A stalled output neither blocks writers beyond MaxBlock per line nor
// grows memory beyond the two buffers: lines beyond them are dropped and
// counted, and a notice reports them once the output drains.
func TestBufferedStalledOutputIsBounded(t *testing.T) {
	gate := make(chan struct{})
	out := &syncBuffer{gate: gate}
	const size = 1 << 10
	b := NewBuffered(out, BufferedOptions{BufferBytes: size, FlushInterval: time.Millisecond, MaxBlock: 5 * time.Millisecond,
		DropNotice: func(n uint64) []byte { return fmt.Appendf(nil, "dropped %d\n", n) }})
	const n = 300
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range n {
			b.Write([]byte(line(i)))
			b.mu.Lock()
			held := cap(b.active) + cap(b.spare) + cap(b.pending)
			b.mu.Unlock()
			if held > 2*size {
				t.Errorf("buffers hold %d bytes, bound %d", held, 2*size)
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(time.Minute): // 300 lines × 5 ms is 1.5 s at worst
		t.Fatal("writers blocked on a stalled output")
	}
	dropped := b.Dropped()
	if dropped == 0 || dropped >= n {
		t.Fatalf("%d of %d lines dropped; want some kept (the buffers) and the rest dropped", dropped, n)
	}
	out.mu.Lock()
	out.gate = nil
	out.mu.Unlock()
	close(gate)
	b.Write([]byte("after\n"))
	if err := b.Close(0); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	kept := strings.Count(got, "line ")
	if uint64(kept)+dropped != n {
		t.Fatalf("%d lines written + %d dropped != %d", kept, dropped, n)
	}
	if !strings.Contains(got, fmt.Sprintf("dropped %d\n", dropped)) || !strings.HasSuffix(got, "after\n") {
		t.Fatalf("no drop notice or last line in output:\n%s", got[max(0, len(got)-300):])
	}
}

// NewBufferedLogger writes JSON lines through the buffer, flushed by Close.
func TestNewBufferedLogger(t *testing.T) {
	out := &syncBuffer{}
	l, b, err := NewBufferedLogger(out, "json", "info")
	if err != nil {
		t.Fatal(err)
	}
	l.Info("admission decision", "uid", "u1")
	if err := b.Close(0); err != nil {
		t.Fatal(err)
	}
	var rec map[string]any
	if err := json.Unmarshal([]byte(out.String()), &rec); err != nil || rec["uid"] != "u1" {
		t.Fatalf("%q: %v", out.String(), err)
	}
	if _, _, err := NewBufferedLogger(out, "xml", "info"); err == nil {
		t.Fatal("bad format accepted")
	}
	if n := b.notice; n != nil {
		if !strings.Contains(string(n(3)), `"dropped":3`) {
			t.Fatalf("notice %s", n(3))
		}
	}
}
