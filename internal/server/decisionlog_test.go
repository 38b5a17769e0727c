package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/logging"
	"github.com/kadmit/kadmit/pkg/webhookcerts"
)

// fakeClock returns a sampler clock tests move by hand.
func fakeClock(s *sampler) *int64 {
	var t int64 = 1 // past the zero window end
	s.now = func() int64 { return t }
	return &t
}

// TestSamplerCounts: with a burst of 10 and 1 in 100, 1,000 fast allowed
// decisions of one webhook in one second give exactly 19 lines (the first
// 10, then the 110th, 210th ... 910th, each marked sampled), and the next
// second starts over.
func TestSamplerCounts(t *testing.T) {
	s := newSampler(DecisionLog{AllowedBurst: 10, AllowedSample: 100})
	now := fakeClock(s)
	count := func(n int) (logged, sampled []int) {
		for i := 1; i <= n; i++ {
			l, sm := s.allowed("/mutate-pod", time.Millisecond)
			if l {
				logged = append(logged, i)
			}
			if sm {
				sampled = append(sampled, i)
			}
		}
		return logged, sampled
	}
	for second := 0; second < 3; second++ {
		logged, sampled := count(1000)
		want := []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 110, 210, 310, 410, 510, 610, 710, 810, 910}
		if fmt.Sprint(logged) != fmt.Sprint(want) {
			t.Fatalf("second %d: logged %v, want %v", second, logged, want)
		}
		if fmt.Sprint(sampled) != fmt.Sprint(want[10:]) {
			t.Fatalf("second %d: sampled %v, want %v", second, sampled, want[10:])
		}
		*now += int64(sampleWindow)
	}
	// Within one window the count carries on: 999 ms later is still the
	// same second.
	*now += int64(sampleWindow)
	count(50)
	*now += int64(999 * time.Millisecond)
	if logged, _ := count(60); fmt.Sprint(logged) != "[60]" {
		t.Fatalf("same window: logged %v, want [60] (the 110th of the second)", logged)
	}
}

// TestSamplerSettings: 1 in 1 logs every decision unmarked, 1 in 0 none
// past the burst, burst 0 starts sampling at once, and a slow review is
// always logged without taking a place of the burst.
func TestSamplerSettings(t *testing.T) {
	tally := func(c DecisionLog, n int, latency time.Duration) (logged, sampled int) {
		s := newSampler(c)
		fakeClock(s)
		for i := 0; i < n; i++ {
			l, sm := s.allowed("/validate-pod", latency)
			if l {
				logged++
			}
			if sm {
				sampled++
			}
		}
		return logged, sampled
	}
	for _, tc := range []struct {
		c               DecisionLog
		latency         time.Duration
		logged, sampled int
	}{
		{DecisionLog{AllowedBurst: 10, AllowedSample: 1}, 0, 1000, 0},
		{DecisionLog{AllowedBurst: 10, AllowedSample: 0}, 0, 10, 0},
		{DecisionLog{AllowedBurst: 0, AllowedSample: 100}, 0, 10, 10},
		{DecisionLog{AllowedBurst: 0, AllowedSample: 0}, 0, 0, 0},
		{DefaultDecisionLog(), 0, 19, 9},
		{DefaultDecisionLog(), DefaultLogSlowReview, 19, 9}, // not over the threshold
		{DefaultDecisionLog(), DefaultLogSlowReview + 1, 1000, 0},
		{DecisionLog{AllowedSample: 100}, time.Hour, 10, 10}, // no slow rule
	} {
		if l, sm := tally(tc.c, 1000, tc.latency); l != tc.logged || sm != tc.sampled {
			t.Errorf("%+v, latency %s: %d logged, %d sampled of 1000; want %d, %d", tc.c, tc.latency, l, sm, tc.logged, tc.sampled)
		}
	}

	// Slow reviews are not counted: after 1,000 of them the burst is whole.
	s := newSampler(DefaultDecisionLog())
	fakeClock(s)
	for i := 0; i < 1000; i++ {
		s.allowed("/validate-pod", time.Second)
	}
	for i := 1; i <= DefaultLogAllowedBurst; i++ {
		if l, _ := s.allowed("/validate-pod", 0); !l {
			t.Fatalf("fast decision %d after 1,000 slow ones not logged: slow ones used the burst", i)
		}
	}
}

// TestSamplerPerWebhook: a busy webhook does not use up another's burst.
func TestSamplerPerWebhook(t *testing.T) {
	busy, quiet := "/mutate-pod", "/validate-node"
	if fnv32a(busy)%sampleBuckets == fnv32a(quiet)%sampleBuckets {
		t.Fatalf("%s and %s share a bucket: pick other paths", busy, quiet)
	}
	s := newSampler(DefaultDecisionLog())
	fakeClock(s)
	for i := 0; i < 10000; i++ {
		s.allowed(busy, 0)
	}
	for i := 1; i <= DefaultLogAllowedBurst; i++ {
		if l, sm := s.allowed(quiet, 0); !l || sm {
			t.Fatalf("%s decision %d: logged %v, sampled %v after 10,000 on %s; want its own burst", quiet, i, l, sm, busy)
		}
	}
}

// TestSamplerConcurrent: 8 goroutines counting 80,000 decisions in one
// window log exactly the burst plus 1 in 100 of the rest: the counter
// loses nothing under contention inside a window.
func TestSamplerConcurrent(t *testing.T) {
	s := newSampler(DefaultDecisionLog())
	fakeClock(s)
	var mu sync.Mutex
	logged, sampled := 0, 0
	// The first call opens the window; after it no caller resets it.
	if l, _ := s.allowed("/mutate-pod", 0); l {
		logged++
	}
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nl, ns := 0, 0
			for i := 0; i < 10000; i++ {
				l, sm := s.allowed("/mutate-pod", 0)
				if l {
					nl++
				}
				if sm {
					ns++
				}
			}
			mu.Lock()
			logged, sampled = logged+nl, sampled+ns
			mu.Unlock()
		}()
	}
	wg.Wait()
	// 80,001 decisions: 10, then (80,001-10)/100 = 799 sampled.
	if logged != 809 || sampled != 799 {
		t.Fatalf("%d logged, %d sampled of 80,001; want 809, 799", logged, sampled)
	}
}

// TestSamplerBound: the sampler's memory is fixed whatever the webhook
// paths (64 counters of one cache line), and an allowed decision that is
// not logged costs no allocation in observe.
func TestSamplerBound(t *testing.T) {
	s := newSampler(DefaultDecisionLog())
	if size := unsafe.Sizeof(*s); size > sampleBuckets*64+256 {
		t.Fatalf("sampler is %d bytes, want at most %d", size, sampleBuckets*64+256)
	}
	if unsafe.Sizeof(sampleCounter{}) != 64 {
		t.Fatalf("sampleCounter is %d bytes, want one 64-byte cache line", unsafe.Sizeof(sampleCounter{}))
	}
	fakeClock(s)
	// 100,000 distinct paths land in the same 64 counters: nothing grows.
	for i := 0; i < 100000; i++ {
		s.allowed(fmt.Sprintf("/p%d", i), 0)
	}
	srv, _ := newObserveServer(t, slog.LevelInfo, nil)
	fakeClock(srv.sampler)
	d := admission.Decision{Webhook: "/mutate-pod", UID: "u", Kind: "Pod", Namespace: "default", Name: "p",
		Operation: "CREATE", HTTPCode: 200, Allowed: true, Patched: true, Latency: time.Millisecond}
	for i := 0; i < DefaultLogAllowedBurst; i++ {
		srv.observe(context.Background(), d)
	}
	// Sampled-out decisions: the sampled-in one every 100 allocates (it
	// is logged), the other 99 allocate only what the metrics do (the
	// label values' slice).
	metricsOnly := testing.AllocsPerRun(99, func() { srv.metrics.Observe(d) })
	for i := 0; i < 100; i++ { // up to the 110th, logged: 111th to 209th are not
		srv.observe(context.Background(), d)
	}
	// AllocsPerRun: one warm-up call and 98 counted, the 111th to 209th.
	if a := testing.AllocsPerRun(98, func() { srv.observe(context.Background(), d) }); a > metricsOnly {
		t.Fatalf("an unlogged allowed decision allocates %.2f times, the metrics alone %.2f: logging allocates", a, metricsOnly)
	}
}

// newObserveServer is a Server (not listening) whose log goes to a buffer
// at level.
func newObserveServer(t *testing.T, level slog.Level, c *DecisionLog) (*Server, *bytes.Buffer) {
	t.Helper()
	var buf bytes.Buffer
	s, err := New(Options{MetricsAddr: "0", Certs: &webhookcerts.Holder{}, DecisionLog: c,
		Logger: slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: level}))})
	if err != nil {
		t.Fatal(err)
	}
	return s, &buf
}

// TestObserveLogs: through observe, denials are always logged, errors and
// panics always (throttled), slow reviews always, allowed decisions past
// the burst 1 in 100 with sampled="1/100"; at debug level every one; and
// kadmit_admission_requests_total counts every decision either way.
func TestObserveLogs(t *testing.T) {
	allowed := admission.Decision{Webhook: "/mutate-pod", UID: "u", Kind: "Pod", Namespace: "default", Name: "p",
		Operation: "CREATE", HTTPCode: 200, Allowed: true, Latency: time.Millisecond}
	denied := allowed
	denied.Allowed, denied.Policy, denied.ResultCode, denied.Message = false, "pod-name", 403, "no"
	slow := allowed
	slow.Latency = 150 * time.Millisecond
	failed := allowed
	failed.Allowed, failed.HTTPCode, failed.Err = false, 400, errors.New("bad review")
	panicked := allowed
	panicked.Allowed, panicked.HTTPCode, panicked.Panic = false, 500, &admission.PanicError{Policy: "p", Value: "boom"}

	const n = 1000
	lines := func(level slog.Level, c *DecisionLog) (out map[string]int, s *Server) {
		s, buf := newObserveServer(t, level, c)
		fakeClock(s.sampler)
		for i := 0; i < n; i++ {
			s.observe(context.Background(), allowed)
			s.observe(context.Background(), denied)
			if i < 10 { // within the throttle's burst of 20
				s.observe(context.Background(), failed)
				s.observe(context.Background(), panicked)
			}
			if i < 5 {
				s.observe(context.Background(), slow)
			}
		}
		out = map[string]int{}
		for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
			switch {
			case strings.Contains(l, `"sampled":"1/100"`):
				out["sampled"]++
			case strings.Contains(l, `"allowed":true`) && strings.Contains(l, `"latency":150000000`):
				out["slow"]++
			case strings.Contains(l, `"allowed":true`):
				out["allowed"]++
			case strings.Contains(l, `"allowed":false`):
				out["denied"]++
			case strings.Contains(l, "request not admitted: bad review"):
				out["failed"]++
			case strings.Contains(l, "policy panicked"):
				out["panicked"]++
			default:
				t.Errorf("unexpected line %s", l)
			}
		}
		return out, s
	}

	got, s := lines(slog.LevelInfo, nil)
	// Allowed: 10 in full, then the 110th ... 910th of the 1,000 fast ones
	// (the slow ones are not counted).
	want := map[string]int{"allowed": 10, "sampled": 9, "slow": 5, "denied": n, "failed": 10, "panicked": 10}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("default: lines %v, want %v", got, want)
	}
	total := n + n + 10 + 10 + 5
	mfs, err := s.opts.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var counted float64
	for _, mf := range mfs {
		if mf.GetName() == "kadmit_admission_requests_total" {
			for _, m := range mf.GetMetric() {
				counted += m.GetCounter().GetValue()
			}
		}
	}
	if int(counted) != total {
		t.Fatalf("kadmit_admission_requests_total counts %v decisions, want every one of %d", counted, total)
	}

	got, _ = lines(slog.LevelDebug, nil)
	want = map[string]int{"allowed": n, "slow": 5, "denied": n, "failed": 10, "panicked": 10}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("debug: lines %v, want %v", got, want)
	}

	// 1 in 1, no slow rule: every allowed decision, none marked.
	got, _ = lines(slog.LevelInfo, &DecisionLog{AllowedBurst: 10, AllowedSample: 1})
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("1 in 1: lines %v, want %v", got, want)
	}
}

// TestDecisionLogValidate: negative settings are refused by New.
func TestDecisionLogValidate(t *testing.T) {
	for _, c := range []DecisionLog{{AllowedBurst: -1}, {AllowedSample: -1}, {SlowReview: -time.Second}} {
		_, err := New(Options{MetricsAddr: "0", Certs: &webhookcerts.Holder{}, DecisionLog: &c, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err == nil || !strings.Contains(err.Error(), "negative") {
			t.Errorf("%+v: err %v, want a refusal", c, err)
		}
	}
}

// BenchmarkObserve: the CPU of observe per allowed decision through
// kadmit serve's own logger (logging.NewBufferedLogger, JSON) to
// io.Discard: sampled (the default; 1 line in ~100 at this rate) against
// every decision logged (--log-level debug).
func BenchmarkObserve(b *testing.B) {
	for _, level := range []string{"info", "debug"} {
		b.Run(map[string]string{"info": "sampled", "debug": "all"}[level], func(b *testing.B) {
			l, w, err := logging.NewBufferedLogger(io.Discard, "json", level)
			if err != nil {
				b.Fatal(err)
			}
			defer w.Close(time.Second)
			s, err := New(Options{MetricsAddr: "0", Certs: &webhookcerts.Holder{}, Logger: l})
			if err != nil {
				b.Fatal(err)
			}
			d := admission.Decision{Webhook: "/mutate-pod", UID: "0f6e9d52-3c1a-4b7e-9a55-2f9d2b0c8e11", Kind: "Pod",
				Namespace: "shop", Name: "checkout-api-7d9f8b6c5d-x2k4p", Operation: "CREATE", HTTPCode: 200,
				Allowed: true, Patched: true, Latency: 180 * time.Microsecond}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				s.observe(context.Background(), d)
			}
		})
	}
}
