package logging

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

type otherKey struct{}

// TestFromContextAbsent: a context without a logger still yields a usable
// one, slog.Default(), never nil.
func TestFromContextAbsent(t *testing.T) {
	l := FromContext(context.Background())
	if l == nil || l != slog.Default() {
		t.Fatalf("FromContext(Background) = %p, want slog.Default() %p", l, slog.Default())
	}
	l.Debug("usable") // must not panic
	if got := FromContext(IntoContext(context.Background(), nil)); got != slog.Default() {
		t.Fatalf("FromContext after IntoContext(nil) = %p, want slog.Default()", got)
	}
}

// TestIntoContext: FromContext returns the logger IntoContext stored, also
// through contexts derived from it.
func TestIntoContext(t *testing.T) {
	l := slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil))
	ctx, cancel := context.WithCancel(IntoContext(context.Background(), l))
	defer cancel()
	if got := FromContext(context.WithValue(ctx, otherKey{}, 1)); got != l {
		t.Fatalf("FromContext = %p, want the stored %p", got, l)
	}
}

func jsonLogger(buf *bytes.Buffer) *slog.Logger {
	return slog.New(slog.NewJSONHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func decodeLine(t *testing.T, buf *bytes.Buffer) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
		t.Fatalf("log line %q: %v", buf.String(), err)
	}
	return m
}

// TestRequestContextCarriesWebhookAndUID: the request-scoped logger's lines
// carry the webhook path and uid, the uid cut to MaxUIDBytes and escaped
// whatever the base handler, and the context answers the parent's
// deadline, values and cancellation.
func TestRequestContextCarriesWebhookAndUID(t *testing.T) {
	var buf bytes.Buffer
	deadline := time.Now().Add(time.Hour)
	parent, cancel := context.WithDeadline(context.WithValue(context.Background(), otherKey{}, "v"), deadline)
	var rc RequestContext
	rc.Reset(parent, jsonLogger(&buf), "/mutate-pod", "0b6c2a6e-uid")
	var ctx context.Context = &rc

	FromContext(ctx).Info("hello", "k", 1)
	m := decodeLine(t, &buf)
	if m["webhook"] != "/mutate-pod" || m["uid"] != "0b6c2a6e-uid" || m["msg"] != "hello" {
		t.Fatalf("line = %v, want webhook=/mutate-pod uid=0b6c2a6e-uid msg=hello", m)
	}
	if first, second := FromContext(ctx), FromContext(ctx); first != second {
		t.Fatal("FromContext built a second logger for the same request")
	}
	if d, ok := ctx.Deadline(); !ok || !d.Equal(deadline) {
		t.Fatalf("Deadline = %v %v, want the parent's %v", d, ok, deadline)
	}
	if ctx.Value(otherKey{}) != "v" {
		t.Fatal("Value does not reach the parent's values")
	}
	cancel()
	<-ctx.Done()

	// An attacker's uid: a megabyte with a newline, through a handler
	// that neither caps nor escapes (slog's JSON handler).
	buf.Reset()
	huge := "forged\n" + strings.Repeat("u", 1<<20)
	rc.Reset(context.Background(), jsonLogger(&buf), "/validate-pod", huge)
	FromContext(&rc).Warn("x")
	if buf.Len() > 2*MaxUIDBytes+200 {
		t.Fatalf("a 1 MiB uid made a %d-byte line", buf.Len())
	}
	uid, _ := decodeLine(t, &buf)["uid"].(string)
	if !strings.HasPrefix(uid, `forged\nuuu`) || !strings.Contains(uid, "bytes cut]") {
		t.Fatalf("uid = %q, want escaped and cut", uid)
	}
}

// TestRequestContextReuse: Reset for the next request forgets the previous
// request's logger; Clear leaves a usable, never-done context.
func TestRequestContextReuse(t *testing.T) {
	var buf bytes.Buffer
	var rc RequestContext
	rc.Reset(context.Background(), jsonLogger(&buf), "/a", "first")
	FromContext(&rc).Info("one")
	buf.Reset()
	rc.Reset(context.Background(), jsonLogger(&buf), "/b", "second")
	FromContext(&rc).Info("two")
	if m := decodeLine(t, &buf); m["uid"] != "second" || m["webhook"] != "/b" {
		t.Fatalf("after Reset: %v, want the second request's attributes", m)
	}
	rc.Clear()
	if rc.Done() != nil || rc.Err() != nil {
		t.Fatal("a cleared RequestContext is done")
	}
	if FromContext(&rc) == nil {
		t.Fatal("FromContext of a cleared RequestContext is nil")
	}
}

// TestRequestContextConcurrent: policies of one review may ask at once;
// they all get the same logger (run with -race).
func TestRequestContextConcurrent(t *testing.T) {
	var rc RequestContext
	rc.Reset(context.Background(), jsonLogger(&bytes.Buffer{}), "/a", "u")
	var wg sync.WaitGroup
	got := make([]*slog.Logger, 8)
	for i := range got {
		wg.Add(1)
		go func() { defer wg.Done(); got[i] = FromContext(&rc) }()
	}
	wg.Wait()
	for _, l := range got {
		if l != got[0] {
			t.Fatal("concurrent FromContext calls returned different loggers")
		}
	}
}

// TestRequestContextCostsNothingUnlogged: attaching the logger to a
// request (Reset), the lookups a request makes of its context (a
// deadline, a value of another key) and Clear allocate nothing; only a
// FromContext call builds the logger, once.
func TestRequestContextCostsNothingUnlogged(t *testing.T) {
	parent, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	base := jsonLogger(&bytes.Buffer{})
	rc := new(RequestContext)
	var ctx context.Context = rc
	if a := testing.AllocsPerRun(100, func() {
		rc.Reset(parent, base, "/mutate-pod", "0b6c2a6e-uid")
		_, _ = ctx.Deadline()
		_ = ctx.Value(otherKey{})
		_ = ctx.Done()
		rc.Clear()
	}); a != 0 {
		t.Fatalf("an unlogged request allocates %.1f times for its logger, want 0", a)
	}
	rc.Reset(parent, base, "/mutate-pod", "0b6c2a6e-uid")
	FromContext(ctx)
	if a := testing.AllocsPerRun(100, func() { FromContext(ctx) }); a != 0 {
		t.Fatalf("FromContext after the first call allocates %.1f times, want 0", a)
	}
}

func BenchmarkRequestContextUnlogged(b *testing.B) {
	parent, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	base := slog.New(slog.DiscardHandler)
	rc := new(RequestContext)
	b.ReportAllocs()
	for b.Loop() {
		rc.Reset(parent, base, "/mutate-pod", "0b6c2a6e-uid")
		_ = rc.Value(otherKey{})
		rc.Clear()
	}
}

func BenchmarkRequestContextLogged(b *testing.B) {
	base := slog.New(slog.DiscardHandler)
	rc := new(RequestContext)
	b.ReportAllocs()
	for b.Loop() {
		rc.Reset(context.Background(), base, "/mutate-pod", "0b6c2a6e-uid")
		FromContext(rc).Info("x")
		rc.Clear()
	}
}
