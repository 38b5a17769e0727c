package admission

import (
	"bytes"
	"context"
	"net/http"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kadmit/kadmit/internal/jsonedit"
)

// goid is the calling goroutine's id, from its stack header ("goroutine N
// [running]:"); for telling goroutines apart in tests only.
func goid() uint64 {
	var b [64]byte
	s := b[:runtime.Stack(b[:], false)]
	s = bytes.TrimPrefix(s, []byte("goroutine "))
	n, _ := strconv.ParseUint(string(s[:bytes.IndexByte(s, ' ')]), 10, 64)
	return n
}

// boundedMutator is a MutatorFunc that is Bounded.
type boundedMutator MutatorFunc

func (f boundedMutator) Mutate(ctx context.Context, req *Request) ([]jsonedit.Op, Verdict) {
	return f(ctx, req)
}

func (boundedMutator) BoundedReview() {}

// TestBoundedHooksRunInline: a path whose hooks are all Bounded reviews on
// the request's goroutine; one hook that is not moves every review of the
// path to a review goroutine, which the handler abandons at the deadline
// while that hook runs on.
func TestBoundedHooksRunInline(t *testing.T) {
	var ran atomic.Uint64
	seen := func(_ context.Context, _ *Request) ([]jsonedit.Op, Verdict) {
		ran.Store(goid())
		return nil, Allow()
	}
	release := make(chan struct{})
	defer close(release)
	stuck := func(_ context.Context, req *Request) ([]jsonedit.Op, Verdict) {
		if req.Name == "stuck" {
			<-release // ignores its context
		}
		return nil, Allow()
	}
	for _, c := range []struct {
		name   string
		hooks  []Mutator
		inline bool
	}{
		{"all bounded", []Mutator{boundedMutator(seen), boundedMutator(stuck)}, true},
		{"one not bounded", []Mutator{boundedMutator(seen), MutatorFunc(stuck)}, false},
	} {
		var hs []Hook
		for i, m := range c.hooks {
			hs = append(hs, Hook{Policy: "p" + strconv.Itoa(i), Path: "/m", Type: Mutating, Rules: podRule, Mutator: m})
		}
		whs, err := NewWebhooks(hs)
		if err != nil {
			t.Fatal(err)
		}
		h := NewHandler(whs[0], HandlerOptions{})
		if w := serve(h, "/x?timeout=5s", namedReview("p", podJSON)); w.Code != http.StatusOK {
			t.Fatalf("%s: HTTP %d %s", c.name, w.Code, w.Body)
		}
		if inline := ran.Load() == goid(); inline != c.inline {
			t.Fatalf("%s: reviewed on the request's goroutine: %v, want %v", c.name, inline, c.inline)
		}
		if c.inline {
			continue
		}
		// Only a path that reviews on its own goroutine can answer at the
		// deadline while a policy ignores it.
		start := time.Now()
		if w := serve(h, "/x?timeout=300ms", namedReview("stuck", podJSON)); w.Code != http.StatusInternalServerError || time.Since(start) > 3*time.Second {
			t.Fatalf("%s: a policy past its deadline: HTTP %d after %v, want 500 at the deadline", c.name, w.Code, time.Since(start))
		}
	}
}
