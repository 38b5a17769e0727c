package server

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/logging"
	"github.com/kadmit/kadmit/pkg/webhookcerts"
)

type traceKey struct{}

// ctxHandler records, per message, the traceKey value of the context each
// line was logged with (what a tracing-aware handler would read) and the
// attributes the logger carried.
type ctxHandler struct {
	mu    *sync.Mutex
	seen  map[string]any
	attrs []slog.Attr
	lines map[string][]slog.Attr
}

func (h ctxHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h ctxHandler) Handle(ctx context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.seen[r.Message] = ctx.Value(traceKey{})
	h.lines[r.Message] = h.attrs
	return nil
}
func (h ctxHandler) WithAttrs(as []slog.Attr) slog.Handler {
	h.attrs = append(append([]slog.Attr(nil), h.attrs...), as...)
	return h
}
func (h ctxHandler) WithGroup(string) slog.Handler { return h }

// TestDecisionLogUsesRequestContext: the decision line is logged with the
// request's context (not context.Background()), and a policy's line,
// through logging.FromContext, carries the webhook path and uid.
func TestDecisionLogUsesRequestContext(t *testing.T) {
	h := ctxHandler{mu: &sync.Mutex{}, seen: map[string]any{}, lines: map[string][]slog.Attr{}}
	s, err := New(Options{MetricsAddr: "0", Certs: &webhookcerts.Holder{}, Logger: slog.New(h)})
	if err != nil {
		t.Fatal(err)
	}
	denied := admission.Decision{Webhook: "/validate", UID: "u", Kind: "Pod", HTTPCode: 200, Policy: "p", ResultCode: 403, Message: "no"}
	s.observe(context.WithValue(context.Background(), traceKey{}, "span-1"), denied)
	failed := denied
	failed.HTTPCode, failed.Err = 400, context.Canceled
	s.observe(context.WithValue(context.Background(), traceKey{}, "span-2"), failed)
	h.mu.Lock()
	if h.seen["admission decision"] != "span-1" {
		t.Errorf("decision logged with context value %v, want the request's span-1", h.seen["admission decision"])
	}
	for msg, v := range h.seen {
		if strings.HasPrefix(msg, "request not admitted") && v != "span-2" {
			t.Errorf("%q logged with context value %v, want the request's span-2", msg, v)
		}
	}
	h.mu.Unlock()

	// Through the server's handler: the policy's context carries s.log
	// with the webhook and uid.
	wh := webhook(t, "p", "/validate", func(ctx context.Context, _ *admission.Request) admission.Verdict {
		logging.FromContext(ctx).Info("from the policy")
		return admission.Allow()
	})
	hh := admission.NewHandler(wh, admission.HandlerOptions{Logger: s.log, Observe: s.observe})
	rec := &recorder{header: http.Header{}}
	r, _ := http.NewRequest(http.MethodPost, "/validate", strings.NewReader(string(reviewBody("uid-7", "pod-a"))))
	r.Header.Set("Content-Type", "application/json")
	hh.ServeHTTP(rec, r)
	if rec.code != http.StatusOK {
		t.Fatalf("HTTP %d", rec.code)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	got := map[string]string{}
	for _, a := range h.lines["from the policy"] {
		got[a.Key] = a.Value.String()
	}
	if got["webhook"] != "/validate" || got["uid"] != "uid-7" {
		t.Fatalf("policy's line carried %v, want webhook=/validate uid=uid-7", got)
	}
}

type recorder struct {
	header http.Header
	code   int
}

func (w *recorder) Header() http.Header { return w.header }
func (w *recorder) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
}
func (w *recorder) Write(p []byte) (int, error) { w.WriteHeader(http.StatusOK); return len(p), nil }
