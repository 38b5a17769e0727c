package admission

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// Bounds shared by every admission handler of one server. The figures and
// the worst case they add up to are in docs/security.md ("Bounds").
const (
	// DefaultMaxInFlight bounds the requests being read, reviewed or
	// answered at once, plus reviews abandoned after their deadline and
	// still running: 256. The API server's own concurrency towards one
	// webhook is bounded by its --max-mutating-requests-inflight (200 by
	// default) per API server.
	DefaultMaxInFlight = 256
	// DefaultMaxBodyBytesInFlight bounds the request-body buffer capacity
	// held by all requests at once: 32 MiB, four AdmissionReviews of the
	// largest size the API server sends (an UPDATE with two 3 MiB objects).
	DefaultMaxBodyBytesInFlight int64 = 32 << 20
	// MaxTimeout is the largest review deadline honoured: the API server's
	// largest webhook timeoutSeconds is 30, so a larger ?timeout= is a
	// client asking for more than the API server itself would wait.
	MaxTimeout = 30 * time.Second
)

// ErrBusy is wrapped by the errors of requests refused because a Limits
// bound is reached; they are answered with HTTP 503 so the webhook's
// failurePolicy decides, as for any failed call.
var ErrBusy = errors.New("kadmit is at its limit")

// ErrInFlightLimit and ErrBodyBytesLimit tell which bound refused a
// request; both wrap ErrBusy.
var (
	ErrInFlightLimit  = fmt.Errorf("%w of requests in flight", ErrBusy)
	ErrBodyBytesLimit = fmt.Errorf("%w of request bodies buffered at once", ErrBusy)
)

// Limits bound the work that all handlers sharing it do at once: the number
// of requests in flight (including abandoned reviews) and the request-body
// bytes buffered. The zero value is not usable; build one with NewLimits.
// It is safe for concurrent use.
type Limits struct {
	maxInFlight  int64
	maxBodyBytes int64
	inFlight     atomic.Int64
	abandoned    atomic.Int64
	bodyBytes    atomic.Int64
	// Abandoned reviews that released their slot and body bytes at their
	// answer (see call.run): how many run, the bytes they still
	// reference, and the bounds on both.
	maxReleased      int64
	maxReleasedBytes int64
	released         atomic.Int64
	releasedBytes    atomic.Int64
	abandonedTotal   atomic.Int64
}

// NewLimits returns Limits allowing maxInFlight concurrent requests (0:
// DefaultMaxInFlight) and maxBodyBytes of body buffers across them (0:
// DefaultMaxBodyBytesInFlight).
func NewLimits(maxInFlight int, maxBodyBytes int64) *Limits {
	if maxInFlight <= 0 {
		maxInFlight = DefaultMaxInFlight
	}
	if maxBodyBytes <= 0 {
		maxBodyBytes = DefaultMaxBodyBytesInFlight
	}
	return &Limits{maxInFlight: int64(maxInFlight), maxBodyBytes: maxBodyBytes,
		maxReleased: DefaultMaxAbandoned, maxReleasedBytes: maxBodyBytes / 4}
}

// MaxInFlight is the bound on requests in flight, abandoned reviews included.
func (l *Limits) MaxInFlight() int { return int(l.maxInFlight) }

// MaxBodyBytes is the bound on body buffer bytes held at once.
func (l *Limits) MaxBodyBytes() int64 { return l.maxBodyBytes }

// InFlight is the number of requests in flight, abandoned reviews included.
func (l *Limits) InFlight() int64 { return l.inFlight.Load() }

// Abandoned is the number of reviews answered with HTTP 500 at their
// deadline whose policies have not returned yet.
func (l *Limits) Abandoned() int64 { return l.abandoned.Load() }

// BodyBytes is the body buffer capacity currently reserved.
func (l *Limits) BodyBytes() int64 { return l.bodyBytes.Load() }

func (l *Limits) acquire() error {
	for {
		n := l.inFlight.Load()
		if n >= l.maxInFlight {
			return fmt.Errorf("%w: %d (%d of them reviews still running past their deadline)", ErrInFlightLimit, l.maxInFlight, max(0, l.abandoned.Load()-l.released.Load()))
		}
		if l.inFlight.CompareAndSwap(n, n+1) {
			return nil
		}
	}
}

func (l *Limits) release() { l.inFlight.Add(-1) }

// reserve takes n bytes of the body budget, or fails without taking any.
func (l *Limits) reserve(n int64) error {
	for {
		cur := l.bodyBytes.Load()
		if cur+n > l.maxBodyBytes {
			return fmt.Errorf("%w: %d bytes", ErrBodyBytesLimit, l.maxBodyBytes)
		}
		if l.bodyBytes.CompareAndSwap(cur, cur+n) {
			return nil
		}
	}
}

func (l *Limits) unreserve(n int64) { l.bodyBytes.Add(-n) }

// DefaultMaxAbandoned bounds the abandoned reviews that release their
// in-flight slot and body bytes when their 500 is sent: 16. Together they
// may also reference at most a quarter of the body budget (8 MiB by
// default). An abandoned review beyond either bound keeps its slot and its
// bytes in the budget until its policy returns, as every abandoned review
// did before: so review goroutines stay bounded by MaxInFlight plus this,
// the bodies they reference by the body budget plus a quarter of it, and
// a pile-up of runaway policies ends in 503s, never in unbounded memory.
const DefaultMaxAbandoned = 16

// SetMaxAbandoned sets the bound on abandoned reviews that release their
// slot and bytes at their answer (n <= 0: DefaultMaxAbandoned). Call it
// before the Limits are used.
func (l *Limits) SetMaxAbandoned(n int) {
	if n <= 0 {
		n = DefaultMaxAbandoned
	}
	l.maxReleased = int64(n)
}

// MaxAbandoned is the bound set by SetMaxAbandoned.
func (l *Limits) MaxAbandoned() int { return int(l.maxReleased) }

// AbandonedTotal counts the reviews ever abandoned at their deadline.
func (l *Limits) AbandonedTotal() int64 { return l.abandonedTotal.Load() }

// AbandonedBytes is the body bytes that running abandoned reviews released
// from the budget at their answer: memory they still reference (their
// decoded request) until their policy returns.
func (l *Limits) AbandonedBytes() int64 { return l.releasedBytes.Load() }

// takeReleased admits one more abandoned review holding n body bytes among
// those that release their slot and bytes, or reports false.
func (l *Limits) takeReleased(n int64) bool {
	for {
		c := l.released.Load()
		if c >= l.maxReleased {
			return false
		}
		if l.released.CompareAndSwap(c, c+1) {
			break
		}
	}
	for {
		b := l.releasedBytes.Load()
		if b+n > l.maxReleasedBytes {
			l.released.Add(-1)
			return false
		}
		if l.releasedBytes.CompareAndSwap(b, b+n) {
			return true
		}
	}
}

func (l *Limits) returnReleased(n int64) {
	l.releasedBytes.Add(-n)
	l.released.Add(-1)
}

// StatusError is returned by Webhook.Review when a hook declined to decide
// (its Verdict came from Unanswered): the HTTP handler answers the review
// with HTTP Code and the error's text instead of an AdmissionResponse, so
// the webhook's failurePolicy decides, as for any failed call. Code 503
// (errors wrapping ErrBusy) says a shared bound was reached and a retry
// may succeed; 413 says the request itself is beyond a bound.
type StatusError struct {
	Policy string
	Code   int
	Err    error
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("policy %s: %v", e.Policy, e.Err)
}

func (e *StatusError) Unwrap() error { return e.Err }

// Unanswered is the Verdict of a hook that gives no admission decision:
// the chain stops and Webhook.Review returns a *StatusError with code
// (an HTTP status, 500 when out of 400-599) and err. Kadmit's hooks use it
// for bounds (docs/security.md), never for a policy's own verdict.
func Unanswered(code int, err error) Verdict {
	if code < 400 || code > 599 {
		code = 500
	}
	return Verdict{Code: int32(code), Message: err.Error(), unanswered: &StatusError{Code: code, Err: err}}
}
