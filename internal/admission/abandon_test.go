package admission

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// namedReview is reviewBody with request.name set to name and the object obj.
func namedReview(name, obj string) []byte {
	return bytes.Replace(reviewBody(APIVersionV1, "u-"+name, obj), []byte(`"namespace":"default","name":"p"`), []byte(`"namespace":"default","name":"`+name+`"`), 1)
}

// padded is a pod object of about n bytes (a long label value).
func padded(n int) string {
	return `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","labels":{"a":"` + strings.Repeat("a", n) + `"}},"spec":{"containers":[{"name":"c","image":"i"}]}}`
}

func serve(h http.Handler, target string, body []byte) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, target, bytes.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// TestAbandonedReviewReleasesBudget: a review abandoned at its deadline
// gives its in-flight slot and body bytes back when its 500 is sent, so a
// request needing the whole budget is served while the runaway policy
// still runs; beyond MaxAbandoned an abandoned review keeps both, and every
// abandoned review is counted and timed.
func TestAbandonedReviewReleasesBudget(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	defer once.Do(func() { close(release) })
	lim := NewLimits(0, 1<<20) // 1 MiB: a 600 KB review's buffer grows to all of it
	lim.SetMaxAbandoned(1)
	var mu sync.Mutex
	var ran []time.Duration
	h := NewHandler(validating(func(_ context.Context, req *Request) Verdict {
		if strings.HasPrefix(req.Name, "slow") {
			<-release // ignores its context, like a CEL evaluation between checks
		}
		return Allow()
	}), HandlerOptions{Limits: lim, AbandonedRan: func(webhook string, d time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		if webhook != "/validate" || d <= 0 {
			t.Errorf("AbandonedRan(%q, %v)", webhook, d)
		}
		ran = append(ran, d)
	}})

	if w := serve(h, "/x?timeout=200ms", namedReview("slow-1", podJSON)); w.Code != http.StatusInternalServerError {
		t.Fatalf("slow review: HTTP %d %s", w.Code, w.Body)
	}
	if lim.BodyBytes() != 0 || lim.InFlight() != 0 || lim.Abandoned() != 1 || lim.AbandonedTotal() != 1 || lim.AbandonedBytes() == 0 {
		t.Fatalf("after the abandoned answer: body bytes %d, in flight %d, abandoned %d (total %d, bytes %d); want 0, 0, 1 (1, >0)",
			lim.BodyBytes(), lim.InFlight(), lim.Abandoned(), lim.AbandonedTotal(), lim.AbandonedBytes())
	}
	big := namedReview("big", padded(600<<10))
	if w := serve(h, "/x?timeout=5s", big); w.Code != http.StatusOK {
		t.Fatalf("a review needing the whole body budget, beside an abandoned one: HTTP %d %s", w.Code, w.Body)
	}

	// The second abandoned review is beyond MaxAbandoned 1: it keeps its
	// slot and bytes, and the big review no longer fits.
	if w := serve(h, "/x?timeout=200ms", namedReview("slow-2", podJSON)); w.Code != http.StatusInternalServerError {
		t.Fatalf("second slow review: HTTP %d %s", w.Code, w.Body)
	}
	if lim.BodyBytes() == 0 || lim.InFlight() != 1 || lim.Abandoned() != 2 || lim.AbandonedTotal() != 2 {
		t.Fatalf("beyond MaxAbandoned: body bytes %d, in flight %d, abandoned %d (total %d); want >0, 1, 2 (2)",
			lim.BodyBytes(), lim.InFlight(), lim.Abandoned(), lim.AbandonedTotal())
	}
	if w := serve(h, "/x?timeout=5s", big); w.Code != http.StatusServiceUnavailable {
		t.Fatalf("big review while an abandoned one holds its bytes: HTTP %d, want 503", w.Code)
	}

	once.Do(func() { close(release) })
	deadline := time.Now().Add(5 * time.Second)
	for lim.Abandoned() != 0 || lim.InFlight() != 0 || lim.BodyBytes() != 0 || lim.AbandonedBytes() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("after the policies returned: abandoned %d, in flight %d, body bytes %d, abandoned bytes %d",
				lim.Abandoned(), lim.InFlight(), lim.BodyBytes(), lim.AbandonedBytes())
		}
		time.Sleep(5 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(ran) != 2 || lim.AbandonedTotal() != 2 {
		t.Fatalf("AbandonedRan called %d times, total %d; want 2", len(ran), lim.AbandonedTotal())
	}
}

// TestAbandonedBytesBound: abandoned reviews release at most a quarter of
// the body budget between them, whatever MaxAbandoned says.
func TestAbandonedBytesBound(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	lim := NewLimits(0, 4<<20) // a quarter: 1 MiB
	lim.SetMaxAbandoned(100)
	h := NewHandler(validating(func(context.Context, *Request) Verdict { <-release; return Allow() }), HandlerOptions{Limits: lim})
	for i := 0; i < 3; i++ { // each 600 KB review holds a 1 MiB buffer
		if w := serve(h, "/x?timeout=200ms", namedReview("slow", padded(600<<10))); w.Code != http.StatusInternalServerError {
			t.Fatalf("slow review %d: HTTP %d", i, w.Code)
		}
	}
	if got := lim.AbandonedBytes(); got > lim.MaxBodyBytes()/4 || got == 0 {
		t.Fatalf("abandoned reviews released %d bytes, want 0 < n <= %d", got, lim.MaxBodyBytes()/4)
	}
	if lim.BodyBytes() < 2<<20 || lim.InFlight() != 2 {
		t.Fatalf("the two beyond the bytes bound hold %d bytes and %d slots, want 2 MiB and 2", lim.BodyBytes(), lim.InFlight())
	}
}

// hideLength hides a reader's length, so net/http sends it chunked
// (HTTP/1.1) or with no content-length (HTTP/2).
type hideLength struct{ r io.Reader }

func (h hideLength) Read(p []byte) (int, error) { return h.r.Read(p) }

// TestOversizedBodyOfUndeclaredLength: a body with no Content-Length is
// held to MaxRequestBytes as it arrives, over HTTP/1.1 (chunked) and
// HTTP/2.
func TestOversizedBodyOfUndeclaredLength(t *testing.T) {
	h := NewHandler(validating(func(context.Context, *Request) Verdict { return Allow() }), HandlerOptions{MaxRequestBytes: 64 << 10})
	var declared int64
	var mu sync.Mutex
	record := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		declared = r.ContentLength
		mu.Unlock()
		h.ServeHTTP(w, r)
	})
	for _, h2 := range []bool{false, true} {
		srv := httptest.NewUnstartedServer(record)
		srv.EnableHTTP2 = h2
		srv.StartTLS()
		c := srv.Client()
		if !h2 {
			c.Transport.(*http.Transport).TLSClientConfig.NextProtos = []string{"http/1.1"}
			c.Transport.(*http.Transport).ForceAttemptHTTP2 = false
			c.Transport.(*http.Transport).TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
		}
		for _, size := range []int{16 << 10, 200 << 10} {
			body := namedReview("p", padded(size))
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/x?timeout=5s", hideLength{bytes.NewReader(body)})
			req.Header.Set("Content-Type", "application/json")
			resp, err := c.Do(req)
			if err != nil {
				t.Fatalf("http2=%v, %d bytes: %v", h2, len(body), err)
			}
			resp.Body.Close()
			mu.Lock()
			cl := declared
			mu.Unlock()
			wantProto := 1
			if h2 {
				wantProto = 2
			}
			if resp.ProtoMajor != wantProto || cl != -1 {
				t.Fatalf("http2=%v: served over HTTP/%d with Content-Length %d; the test needs HTTP/%d and no declared length", h2, resp.ProtoMajor, cl, wantProto)
			}
			want := http.StatusOK
			if len(body) > 64<<10 {
				want = http.StatusRequestEntityTooLarge
			}
			if resp.StatusCode != want {
				t.Errorf("http2=%v, %d bytes of undeclared length: HTTP %d, want %d", h2, len(body), resp.StatusCode, want)
			}
		}
		srv.Close()
	}
}
