package watch

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"sync"
	"syscall"
	"time"

	"github.com/kadmit/kadmit/internal/doctor"
)

// hsKey names one handshake: the endpoint and the ServerName (SNI) the API
// server would use for it. Webhooks sharing a Service share handshakes.
type hsKey struct{ Addr, ServerName string }

// hsResult is the outcome of the latest handshake of one key.
type hsResult struct {
	chain []*x509.Certificate
	err   error
	// seq counts completed handshakes of the key (1 for the first): a
	// finding seen with a higher seq than when it first appeared was seen
	// by two consecutive handshakes.
	seq  uint64
	at   time.Time
	took time.Duration
}

// class sums up a result for change detection: the failure kind, or the
// leaf certificate's hash.
func (r *hsResult) class() string {
	switch {
	case r == nil:
		return ""
	case r.err != nil:
		return "error:" + failureReason(r.err)
	case len(r.chain) == 0:
		return "nochain"
	default:
		h := sha256.Sum256(r.chain[0].Raw)
		return string(h[:])
	}
}

// failureReason maps a dial or handshake error to the reason label of
// kadmit_watch_handshake_failures_total.
func failureReason(err error) string {
	var ne interface{ Timeout() bool }
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH), errors.Is(err, doctor.ErrDialNotAllowed):
		return "unreachable"
	default:
		return "tls"
	}
}

// handshaker makes the periodic TLS handshakes: every wanted key once per
// interval, new keys at once, and a key whose finding awaits confirmation
// again after the confirmation delay. At most workers handshakes run at
// once; keys, schedule and results are bounded by the wanted set, which the
// evaluation bounds (MaxWebhooks × MaxEndpoints).
type handshaker struct {
	dial     doctor.DialFunc
	timeout  time.Duration
	interval time.Duration
	workers  int
	now      func() time.Time
	// done is called after each handshake of a wanted key; notable says
	// its class differs from the previous result's, it failed, it is one of
	// the key's first two, or a finding awaits it (recheck).
	done func(k hsKey, r hsResult, notable bool)

	mu       sync.Mutex
	results  map[hsKey]*hsResult
	wanted   map[hsKey]bool
	due      map[hsKey]time.Time
	inFlight map[hsKey]bool
	awaited  map[hsKey]bool
	wake     chan struct{}
}

func newHandshaker(o *Options, done func(hsKey, hsResult, bool)) *handshaker {
	return &handshaker{dial: o.Dial, timeout: o.HandshakeTimeout, interval: o.HandshakeInterval, workers: o.HandshakeWorkers, now: o.Now, done: done,
		results: map[hsKey]*hsResult{}, wanted: map[hsKey]bool{}, due: map[hsKey]time.Time{}, inFlight: map[hsKey]bool{}, awaited: map[hsKey]bool{}, wake: make(chan struct{}, 1)}
}

// lookup returns the latest result of k.
func (h *handshaker) lookup(k hsKey) (hsResult, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.results[k]
	if r == nil {
		return hsResult{}, false
	}
	return *r, true
}

// setWanted replaces the set of keys to handshake: results and schedule of
// keys no longer wanted are dropped; new keys are scheduled at once.
func (h *handshaker) setWanted(keys map[hsKey]bool) {
	h.mu.Lock()
	now := h.now()
	for k := range h.wanted {
		if !keys[k] {
			delete(h.results, k)
			delete(h.due, k)
			delete(h.awaited, k)
		}
	}
	h.wanted = keys
	for k := range keys {
		if h.results[k] == nil && !h.inFlight[k] {
			h.scheduleLocked(k, now)
		}
	}
	h.mu.Unlock()
	h.poke()
}

// recheck schedules k again after delay, unless it is already due sooner
// or in flight (whose result is the recheck).
func (h *handshaker) recheck(k hsKey, delay time.Duration) {
	h.mu.Lock()
	if h.wanted[k] {
		h.awaited[k] = true
		if !h.inFlight[k] {
			h.scheduleLocked(k, h.now().Add(delay))
		}
	}
	h.mu.Unlock()
	h.poke()
}

func (h *handshaker) scheduleLocked(k hsKey, at time.Time) {
	if d, ok := h.due[k]; !ok || at.Before(d) {
		h.due[k] = at
	}
}

func (h *handshaker) poke() {
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// run dispatches due handshakes to the workers until ctx ends.
func (h *handshaker) run(ctx context.Context) {
	jobs := make(chan hsKey, h.workers)
	var wg sync.WaitGroup
	for range h.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range jobs {
				h.handshake(ctx, k)
			}
		}()
	}
	defer wg.Wait()
	defer close(jobs)
	tick := time.NewTicker(h.interval)
	defer tick.Stop()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		ready, next := h.takeDue()
		for _, k := range ready {
			select {
			case jobs <- k:
			case <-ctx.Done():
				return
			}
		}
		if len(ready) > 0 {
			continue // more may have become due while dispatching
		}
		wait := time.Hour
		if !next.IsZero() {
			wait = max(next.Sub(h.now()), time.Millisecond)
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			h.mu.Lock()
			now := h.now()
			for k := range h.wanted {
				if !h.inFlight[k] {
					h.scheduleLocked(k, now)
				}
			}
			h.mu.Unlock()
		case <-h.wake:
		case <-timer.C:
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// takeDue marks the due keys in flight and returns them, with the next
// due time of the others (zero when none).
func (h *handshaker) takeDue() (ready []hsKey, next time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.now()
	for k, at := range h.due {
		if h.inFlight[k] {
			continue
		}
		if !at.After(now) {
			ready = append(ready, k)
			h.inFlight[k] = true
			delete(h.due, k)
			if len(ready) == h.workers {
				return ready, now
			}
			continue
		}
		if next.IsZero() || at.Before(next) {
			next = at
		}
	}
	return ready, next
}

// handshake makes one handshake and stores its result if k is still wanted.
func (h *handshaker) handshake(ctx context.Context, k hsKey) {
	start := h.now()
	chain, err := doctor.Handshake(ctx, h.dial, h.timeout, k.Addr, k.ServerName)
	took := h.now().Sub(start)
	if ctx.Err() != nil {
		return
	}
	h.mu.Lock()
	delete(h.inFlight, k)
	if !h.wanted[k] {
		h.mu.Unlock()
		return
	}
	prev := h.results[k]
	r := &hsResult{chain: chain, err: err, at: h.now(), took: took, seq: 1}
	if prev != nil {
		r.seq = prev.seq + 1
	}
	h.results[k] = r
	notable := prev.class() != r.class() || err != nil || r.seq <= 2 || h.awaited[k]
	delete(h.awaited, k)
	res := *r
	h.mu.Unlock()
	h.done(k, res, notable)
}
