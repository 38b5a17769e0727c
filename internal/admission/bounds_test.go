package admission

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync"
	"testing"
	"time"
)

// TestReviewDeadline: a review's deadline is 90 % of the API server's
// ?timeout=, which counts at most 30 s.
func TestReviewDeadline(t *testing.T) {
	for _, tc := range []struct {
		query string
		want  time.Duration
	}{
		{"timeout=2s", 1800 * time.Millisecond},
		{"timeout=30s", 27 * time.Second},
		{"timeout=1h", 27 * time.Second},
	} {
		var left time.Duration
		h := NewHandler(validating(func(ctx context.Context, _ *Request) Verdict {
			d, _ := ctx.Deadline()
			left = time.Until(d)
			return Allow()
		}), HandlerOptions{})
		r := httptest.NewRequest(http.MethodPost, "/x?"+tc.query, bytes.NewReader(reviewBody(APIVersionV1, "u", podJSON)))
		r.Header.Set("Content-Type", "application/json")
		h.ServeHTTP(httptest.NewRecorder(), r)
		if left > tc.want || left < tc.want-time.Second {
			t.Errorf("%s: the policy had %s left, want %s", tc.query, left.Round(time.Millisecond), tc.want)
		}
	}
}

// TestParkedReviewersBound: after a burst of 100 concurrent reviews, 32
// review goroutines stay parked for reuse and the rest exit.
func TestParkedReviewersBound(t *testing.T) {
	const burst = 100
	release := make(chan struct{})
	var started sync.WaitGroup
	started.Add(burst)
	h := NewHandler(validating(func(context.Context, *Request) Verdict {
		started.Done()
		<-release
		return Allow()
	}), HandlerOptions{})
	base := runtime.NumGoroutine() - len(idleReviewers)
	var wg sync.WaitGroup
	for i := 0; i < burst; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := httptest.NewRequest(http.MethodPost, "/x?timeout=10s", bytes.NewReader(reviewBody(APIVersionV1, "u", podJSON)))
			r.Header.Set("Content-Type", "application/json")
			h.ServeHTTP(httptest.NewRecorder(), r)
		}()
	}
	started.Wait() // 100 reviews running at once, on 100 review goroutines
	close(release)
	wg.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for {
		parked, extra := len(idleReviewers), runtime.NumGoroutine()-base
		if parked == 32 && extra <= 32 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %d concurrent reviews: %d review goroutines parked, %d goroutines beyond the start; bound 32", burst, parked, extra)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestDeclaredOversizeRefusedAtOnce: a Content-Length beyond
// MaxRequestBytes is answered 413 before any of the body is read.
func TestDeclaredOversizeRefusedAtOnce(t *testing.T) {
	h := NewHandler(validating(func(context.Context, *Request) Verdict { return Allow() }), HandlerOptions{MaxRequestBytes: 4096})
	pr, pw := io.Pipe() // never written: reading it blocks
	defer pw.Close()
	r := httptest.NewRequest(http.MethodPost, "/x?timeout=10s", pr)
	r.ContentLength = 7 << 20
	r.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	done := make(chan struct{})
	go func() { defer close(done); h.ServeHTTP(w, r) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		pw.CloseWithError(io.ErrUnexpectedEOF)
		<-done
		t.Fatal("a declared 7 MiB body was read instead of refused at once")
	}
	if w.Code != http.StatusRequestEntityTooLarge {
		t.Fatalf("declared 7 MiB: HTTP %d %s", w.Code, w.Body)
	}
}
