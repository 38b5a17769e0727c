package logging

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Defaults of the buffered log writer `kadmit serve` uses: one line per
// admission decision stays, but a decision costs a copy into memory rather
// than a write system call. At 10,000 decisions/s of about 300 bytes, 64 KiB
// holds about 20 ms of lines; the flusher is woken when a buffer is half
// full, so the interval matters only when traffic is light.
const (
	// DefaultBufferBytes is the size of each of the two buffers.
	DefaultBufferBytes = 64 << 10
	// DefaultFlushInterval bounds how long a line waits in memory.
	DefaultFlushInterval = 100 * time.Millisecond
	// DefaultMaxBlock bounds how long a Write waits for room when both
	// buffers are full (the output is not draining) before the line is
	// dropped and counted.
	DefaultMaxBlock = 100 * time.Millisecond
	// DefaultCloseTimeout bounds the final flush at shutdown.
	DefaultCloseTimeout = 5 * time.Second
)

// BufferedOptions configure NewBuffered; zero fields take the defaults.
type BufferedOptions struct {
	BufferBytes   int
	FlushInterval time.Duration
	MaxBlock      time.Duration
	// DropNotice, when set, renders the line written before the next
	// flushed lines after n lines were dropped (New sets one in the
	// logger's own format).
	DropNotice func(n uint64) []byte
}

// Buffered is an io.Writer for log lines that copies each Write into one of
// two bounded buffers and lets a background goroutine write them out, at
// least every FlushInterval and as soon as a buffer is half full. It is safe
// for concurrent use; slog handlers write each record with one Write, so
// lines are never interleaved.
//
// Memory is bounded: two buffers of BufferBytes each (a single line longer
// than a buffer is taken alone into an empty one, and its buffer is dropped
// after the flush; slog lines are bounded by the field caps of this
// package). When both buffers are full because the output does not drain (a
// stalled pipe), Write waits at most MaxBlock for room, then drops the line
// and counts it: admission never waits on the log for longer than MaxBlock,
// and never holds more than the two buffers. Dropped lines are counted by
// Dropped (exported as kadmit_log_lines_dropped_total by Collector) and
// reported by a notice line once the output drains again.
//
// Close flushes what is buffered (bounded by a timeout) and stops the
// goroutine; later Writes go straight to the output, unbuffered, so lines
// logged while shutting down are not lost.
type Buffered struct {
	out      io.Writer
	size     int
	interval time.Duration
	maxBlock time.Duration
	notice   func(uint64) []byte

	wmu sync.Mutex // held while writing to out: one writer, lines in order

	mu sync.Mutex
	// Two buffers: active takes lines; the other is spare (free),
	// pending (full, handed to the flusher) or being written out.
	active   []byte
	spare    []byte
	pending  []byte
	drained  chan struct{} // closed (and replaced) each time a buffer is written out
	closed   bool
	unseen   uint64 // dropped lines not yet reported in the output
	signaled bool   // the flusher was kicked and has not run since

	dropped   atomic.Uint64
	closeOnce sync.Once
	kick      chan struct{}
	stop      chan struct{}
	done      chan struct{}
	errMu     sync.Mutex
	err       error // the first output error, returned by Flush and Close
}

// NewBuffered starts a Buffered writer on out; Close stops it.
func NewBuffered(out io.Writer, o BufferedOptions) *Buffered {
	if o.BufferBytes <= 0 {
		o.BufferBytes = DefaultBufferBytes
	}
	if o.FlushInterval <= 0 {
		o.FlushInterval = DefaultFlushInterval
	}
	if o.MaxBlock <= 0 {
		o.MaxBlock = DefaultMaxBlock
	}
	b := &Buffered{
		out: out, size: o.BufferBytes, interval: o.FlushInterval, maxBlock: o.MaxBlock, notice: o.DropNotice,
		active:  make([]byte, 0, o.BufferBytes),
		spare:   make([]byte, 0, o.BufferBytes),
		drained: make(chan struct{}),
		kick:    make(chan struct{}, 1),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	go b.run()
	return b
}

// Write copies p (one log line) into the active buffer; see Buffered for
// what happens when there is no room. It never returns an error for a
// dropped line: logging must not fail the request that logs.
func (b *Buffered) Write(p []byte) (int, error) {
	var deadline *time.Timer
	defer func() {
		if deadline != nil {
			deadline.Stop()
		}
	}()
	for {
		b.mu.Lock()
		if b.closed {
			b.mu.Unlock()
			b.wmu.Lock()
			defer b.wmu.Unlock()
			return b.out.Write(p)
		}
		room := len(b.active)+len(p) <= b.size || len(b.active) == 0
		if !room && b.spare != nil {
			// Hand the full buffer to the flusher and go on in the other.
			b.pending, b.active, b.spare = b.active, b.spare[:0], nil
			room = true
		}
		if room {
			b.active = append(b.active, p...)
			kick := (b.pending != nil || len(b.active) >= b.size/2) && !b.signaled
			if kick {
				b.signaled = true
			}
			b.mu.Unlock()
			if kick {
				b.wake()
			}
			return len(p), nil
		}
		// Both buffers are full: the output has not taken the older one
		// yet. Wait, boundedly, for it to.
		wait := b.drained
		b.mu.Unlock()
		b.wake()
		if deadline == nil {
			deadline = time.NewTimer(b.maxBlock)
		}
		select {
		case <-wait:
			continue
		case <-deadline.C:
		}
		b.mu.Lock()
		b.unseen++
		b.mu.Unlock()
		b.dropped.Add(1)
		return len(p), nil
	}
}

func (b *Buffered) wake() {
	select {
	case b.kick <- struct{}{}:
	default:
	}
}

// run is the flusher: it writes the buffers out every interval or when
// kicked, until Close.
func (b *Buffered) run() {
	defer close(b.done)
	t := time.NewTicker(b.interval)
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-t.C:
		case <-b.kick:
		}
		b.flush(false)
	}
}

// flush writes out the full buffer handed over by Write, if any, then what
// the active buffer holds, each preceded by a notice of dropped lines if
// any, and returns the first output error seen so far.
//
// With final, it writes until nothing is left and closes the writer in the
// same step that finds nothing left, so a line written concurrently is
// either in a buffer it writes or written directly after.
func (b *Buffered) flush(final bool) error {
	b.wmu.Lock()
	defer b.wmu.Unlock()
	for round := 0; final || round < 2; round++ {
		b.mu.Lock()
		b.signaled = false
		var w []byte
		switch {
		case b.pending != nil:
			w, b.pending = b.pending, nil
		case len(b.active) > 0 || b.unseen > 0:
			// pending is nil and no buffer is being written, so spare
			// holds the other buffer.
			w, b.active, b.spare = b.active, b.spare, nil
			if b.active == nil {
				b.active = make([]byte, 0, b.size)
			}
		default:
			if final {
				b.closed = true
			}
			b.mu.Unlock()
			return b.firstErr()
		}
		unseen := b.unseen
		b.unseen = 0
		b.mu.Unlock()

		if unseen > 0 && b.notice != nil {
			b.setErr(writeAll(b.out, b.notice(unseen)))
		}
		b.setErr(writeAll(b.out, w))

		if cap(w) > b.size { // grown by one long line: give the memory back
			w = make([]byte, 0, b.size)
		}
		b.mu.Lock()
		b.spare = w[:0]
		close(b.drained) // writers waiting for room may go on
		b.drained = make(chan struct{})
		b.mu.Unlock()
	}
	return b.firstErr()
}

func writeAll(w io.Writer, p []byte) error {
	if len(p) == 0 {
		return nil
	}
	_, err := w.Write(p)
	return err
}

func (b *Buffered) setErr(err error) {
	if err == nil {
		return
	}
	b.errMu.Lock()
	if b.err == nil {
		b.err = fmt.Errorf("write log: %w", err)
	}
	b.errMu.Unlock()
}

func (b *Buffered) firstErr() error {
	b.errMu.Lock()
	defer b.errMu.Unlock()
	return b.err
}

// Flush writes out every line written so far. It blocks while the output
// does.
func (b *Buffered) Flush() error { return b.flush(false) }

// Close stops the flusher and writes out what is buffered, waiting at most
// timeout (0: DefaultCloseTimeout) for the output; later Writes are
// unbuffered. It returns the first output error, or an error when the
// output did not take the lines in time. Closing twice is harmless.
func (b *Buffered) Close(timeout time.Duration) error {
	if timeout <= 0 {
		timeout = DefaultCloseTimeout
	}
	first := false
	b.closeOnce.Do(func() { first = true })
	if !first {
		return b.firstErr()
	}
	close(b.stop)
	<-b.done
	flushed := make(chan error, 1)
	go func() { flushed <- b.flush(true) }()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case err := <-flushed:
		return err
	case <-t.C:
		return errors.New("write log: the output did not take the last lines in time")
	}
}

// Dropped is the number of lines dropped because the output did not drain.
func (b *Buffered) Dropped() uint64 { return b.dropped.Load() }

// Collector exports Dropped as the counter kadmit_log_lines_dropped_total.
func (b *Buffered) Collector() prometheus.Collector {
	return prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "kadmit_log_lines_dropped_total",
		Help: "Log lines dropped because the log output (stderr) did not drain for longer than the bounded wait.",
	}, func() float64 { return float64(b.Dropped()) })
}
