package server

import (
	"fmt"
	"strconv"
	"sync/atomic"
	"time"
)

// Defaults of DecisionLog: at 1,000 allowed reviews a second on one
// webhook, 10 + 990/100 ≈ 20 lines a second instead of 1,000; below 10 a
// second (a development cluster, a demo) every decision is still logged.
const (
	// DefaultLogAllowedBurst is how many allowed decisions per webhook are
	// logged in full each second before sampling starts: 10.
	DefaultLogAllowedBurst = 10
	// DefaultLogAllowedSample is the 1-in-N sample of the allowed decisions
	// past the burst: 100.
	DefaultLogAllowedSample = 100
	// DefaultLogSlowReview is the latency above which an allowed decision
	// is always logged: 100ms, 70 times kadmit's own p99 on /mutate-pod
	// (1.4 ms under `kadmit bench -c 1` on a loaded 2-core machine) and a
	// fiftieth of the chart's 5s timeoutSeconds, so a line means something
	// is wrong, not just a busy core.
	DefaultLogSlowReview = 100 * time.Millisecond
)

// sampleWindow is the period the burst is counted over: one second, like
// zap's production sampler (go.uber.org/zap v1.28.0 config.go
// NewProductionConfig: "first 100 ... in the same second").
const sampleWindow = time.Second

// sampleBuckets is how many webhooks are counted apart: webhook paths are
// hashed into this many fixed counters (no map, so a configuration reload
// that renames every path leaves nothing behind). Two paths sharing a
// bucket share its burst; the sample stays 1 in N for both.
const sampleBuckets = 64

// DecisionLog chooses which admission decisions get an "admission
// decision" info line. Denials, answers other than HTTP 200 (throttled
// warnings) and policy panics (throttled errors) are always logged; an
// allowed decision is logged when it took longer than SlowReview, when it
// is among the first AllowedBurst allowed decisions of its webhook in the
// current second, or when it is the AllowedSample-th after those (it then
// carries sampled="1/N": it stands for N allowed decisions, N-1 of them
// unlogged). A logger enabled at debug level logs every decision,
// whatever this says. Metrics count every decision either way.
//
// This is zap's sampler (go.uber.org/zap v1.28.0 zapcore/sampler.go:
// first N per tick, then every Mth), keyed by webhook path instead of
// level and message: a busy /mutate-pod does not use up the burst of a
// quiet /validate-node.
type DecisionLog struct {
	// AllowedBurst is how many allowed decisions per webhook are logged
	// each second before sampling starts; 0: none.
	AllowedBurst int
	// AllowedSample N logs 1 in N of the allowed decisions past the burst;
	// 1: every one, 0: none.
	AllowedSample int
	// SlowReview: an allowed decision whose latency (reading the request
	// to writing the answer) exceeds it is always logged; 0: no such rule.
	SlowReview time.Duration
}

// DefaultDecisionLog is what a nil Options.DecisionLog means.
func DefaultDecisionLog() DecisionLog {
	return DecisionLog{AllowedBurst: DefaultLogAllowedBurst, AllowedSample: DefaultLogAllowedSample, SlowReview: DefaultLogSlowReview}
}

func (c DecisionLog) validate() error {
	if c.AllowedBurst < 0 || c.AllowedSample < 0 || c.SlowReview < 0 {
		return fmt.Errorf("decision log: allowed burst %d, sample 1 in %d, slow review %s: none may be negative",
			c.AllowedBurst, c.AllowedSample, c.SlowReview)
	}
	return nil
}

// sampler decides, per allowed decision, whether it is logged. It costs
// one clock read and two or three atomic operations on the webhook's
// counter, no lock: it runs on every review.
type sampler struct {
	burst, every uint64
	slow         time.Duration
	// attr is the sampled attribute's value, "1/N".
	attr    string
	buckets [sampleBuckets]sampleCounter
	// now returns monotonic nanoseconds; a field so tests move time.
	now func() int64
}

// sampleCounter counts one bucket's allowed decisions in the current
// window; padded to a cache line so that webhooks in different buckets
// do not slow each other down.
type sampleCounter struct {
	resetAt atomic.Int64 // when the current window ends, sampler.now's clock
	n       atomic.Uint64
	_       [48]byte
}

// clockBase anchors the sampler's monotonic clock (time.Since reads the
// monotonic clock, unlike UnixNano).
var clockBase = time.Now()

func newSampler(c DecisionLog) *sampler {
	return &sampler{
		burst: uint64(c.AllowedBurst), every: uint64(c.AllowedSample), slow: c.SlowReview,
		attr: "1/" + strconv.Itoa(c.AllowedSample),
		now:  func() int64 { return int64(time.Since(clockBase)) },
	}
}

// allowed reports whether an allowed decision of webhook taking latency
// is logged, and with sampled set when the line stands for every-1 more
// decisions that are not.
func (s *sampler) allowed(webhook string, latency time.Duration) (log, sampled bool) {
	if s.slow > 0 && latency > s.slow {
		// Not counted: a slow review is logged for its latency, and
		// counting it would take a place of the burst from a fast one.
		return true, false
	}
	n := s.buckets[fnv32a(webhook)%sampleBuckets].inc(s.now())
	switch {
	case n <= s.burst:
		return true, false
	case s.every == 0:
		return false, false
	case (n-s.burst)%s.every == 0:
		return true, s.every > 1
	}
	return false, false
}

// inc counts one decision at now and returns its position in the current
// window, starting a new window when the last one is over. Two callers
// racing at a window's end may both start it, losing a count: a sample,
// like zap's (IncCheckReset), not an audit.
func (c *sampleCounter) inc(now int64) uint64 {
	end := c.resetAt.Load()
	if now < end {
		return c.n.Add(1)
	}
	if c.resetAt.CompareAndSwap(end, now+int64(sampleWindow)) {
		c.n.Store(1)
		return 1
	}
	return c.n.Add(1)
}

// fnv32a is FNV-1a: a few nanoseconds for a webhook path, and the same
// bucket in every process, so tests can tell which paths share one.
func fnv32a(s string) uint32 {
	const offset32, prime32 = 2166136261, 16777619
	h := uint32(offset32)
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= prime32
	}
	return h
}
