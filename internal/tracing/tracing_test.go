package tracing

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/otlpreceiver"
)

const (
	sampledParent   = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	unsampledParent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
)

// recorded returns a Tracer that records finished spans in memory, sampled
// as New samples with ratio 0.
func recorded() (*Tracer, *tracetest.SpanRecorder) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0))))
	return newTracer(tp, true), rec
}

// webhook is a route whose handler reports decision d to Record, as
// kadmit's Observe does, and counts how it was served: traced (its request
// carries a span) or plain.
type webhook struct {
	d             admission.Decision
	plain, traced int
}

func (wh *webhook) handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if trace.SpanContextFromContext(r.Context()).IsValid() {
			wh.traced++
		} else {
			wh.plain++
		}
		w.WriteHeader(wh.d.HTTPCode)
		Record(r.Context(), wh.d)
	})
}

func wrap(tr *Tracer, path string, wh *webhook) http.Handler {
	return tr.Wrap(path, wh.handler())
}

func serve(h http.Handler, traceparent string) {
	r := httptest.NewRequest(http.MethodPost, "/mutate-pod?timeout=10s", strings.NewReader("{}"))
	if traceparent != "" {
		r.Header.Set("traceparent", traceparent)
	}
	h.ServeHTTP(httptest.NewRecorder(), r)
}

// A sampled traceparent gives one server span, child of the API server's
// client span, with the decision's bounded attributes and nothing else.
func TestWrapSampledParent(t *testing.T) {
	tr, rec := recorded()
	wh := &webhook{d: admission.Decision{Webhook: "/mutate-pod", Kind: "Pod", Operation: "CREATE", HTTPCode: 200, Allowed: true, Patched: true,
		Name: "secret-name", Namespace: "ns", Message: "user text", UID: "u"}}
	h := wrap(tr, "/mutate-pod", wh)
	serve(h, sampledParent)
	spans := rec.Ended()
	if len(spans) != 1 || wh.traced != 1 || wh.plain != 0 {
		t.Fatalf("%d spans, traced %d, plain %d; want 1, 1, 0", len(spans), wh.traced, wh.plain)
	}
	s := spans[0]
	if s.Name() != SpanName || s.SpanKind() != trace.SpanKindServer {
		t.Errorf("span %q kind %v", s.Name(), s.SpanKind())
	}
	if got := s.Parent().SpanID().String(); got != "b7ad6b7169203331" || !s.Parent().IsRemote() {
		t.Errorf("parent %s (remote %v), want the traceparent's b7ad6b7169203331", got, s.Parent().IsRemote())
	}
	if got := s.SpanContext().TraceID().String(); got != "0af7651916cd43dd8448eb211c80319c" {
		t.Errorf("trace id %s", got)
	}
	want := map[attribute.Key]attribute.Value{
		AttrWebhook: attribute.StringValue("/mutate-pod"), AttrOperation: attribute.StringValue("CREATE"),
		AttrKind: attribute.StringValue("Pod"), AttrHTTPCode: attribute.IntValue(200),
		AttrAllowed: attribute.BoolValue(true), AttrPatched: attribute.BoolValue(true),
	}
	got := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		got[kv.Key] = kv.Value
	}
	if len(got) != len(want) {
		t.Errorf("attributes %v, want exactly %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("attribute %s = %v, want %v", k, got[k].String(), v.String())
		}
	}
}

// Without a traceparent, or with an unsampled one, nothing is recorded and
// the plain handler serves (ratio 0: kadmit follows the API server).
func TestWrapNotSampled(t *testing.T) {
	for _, tp := range []string{"", unsampledParent, "garbage"} {
		tr, rec := recorded()
		wh := &webhook{d: admission.Decision{HTTPCode: 200}}
		serve(wrap(tr, "/validate-pod", wh), tp)
		if n := len(rec.Ended()); n != 0 || wh.plain != 1 || wh.traced != 0 {
			t.Errorf("traceparent %q: %d spans, plain %d, traced %d; want 0, 1, 0", tp, n, wh.plain, wh.traced)
		}
	}
}

// Strings from the request are cut; a 5xx marks the span as an error
// without the message.
func TestWrapBoundsAndErrors(t *testing.T) {
	tr, rec := recorded()
	wh := &webhook{d: admission.Decision{Kind: strings.Repeat("K", 500), Operation: "CREATE", HTTPCode: 500, Err: errors.New("user text")}}
	serve(wrap(tr, "/mutate-pod", wh), sampledParent)
	s := rec.Ended()[0]
	for _, kv := range s.Attributes() {
		if kv.Key == AttrKind && len(kv.Value.AsString()) != maxAttrLen {
			t.Errorf("kind of %d bytes kept, want %d", len(kv.Value.AsString()), maxAttrLen)
		}
		if kv.Key == AttrAllowed {
			t.Error("allowed recorded for a 500")
		}
	}
	if s.Status().Description != "answered Internal Server Error" {
		t.Errorf("status %+v", s.Status())
	}
}

func TestNewRefuses(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(notPEM, []byte("no"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, o := range []Options{
		{Endpoint: "collector"},
		{Endpoint: ":4317"},
		{Endpoint: "127.0.0.1:4317", SamplingRatio: 1.5},
		{Endpoint: "127.0.0.1:4317", SamplingRatio: -0.1},
		{Endpoint: "127.0.0.1:4317", CAFile: filepath.Join(dir, "missing")},
		{Endpoint: "127.0.0.1:4317", CAFile: notPEM},
	} {
		if _, err := New(context.Background(), o); !errors.Is(err, ErrOptions) {
			t.Errorf("New(%+v): %v, want ErrOptions", o, err)
		}
	}
}

func TestSampledFlag(t *testing.T) {
	for tp, want := range map[string]bool{
		sampledParent: true, unsampledParent: false, "": false, "x": false,
		"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0b": true,
		"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0a": false,
		"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0Z": true,
	} {
		if got := sampledFlag(tp); got != want {
			t.Errorf("sampledFlag(%q) = %v, want %v", tp, got, want)
		}
	}
}

func TestIsLoopbackHost(t *testing.T) {
	for host, want := range map[string]bool{
		"127.0.0.1": true, "::1": true, "localhost": true, "LOCALHOST": true, "127.1.2.3": true,
		"10.0.0.1": false, "otel-collector.monitoring.svc": false, "localhost.example.com": false, "": false,
	} {
		if got := IsLoopbackHost(host); got != want {
			t.Errorf("IsLoopbackHost(%q) = %v, want %v", host, got, want)
		}
	}
}

// The real exporter: New to a loopback receiver, one sampled review, and
// Shutdown flushes it there with its parent.
func TestExportToReceiver(t *testing.T) {
	rcv, err := otlpreceiver.Start(otlpreceiver.Options{Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer rcv.Stop()
	tr, err := New(context.Background(), Options{Endpoint: rcv.Addr(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	wh := &webhook{d: admission.Decision{Kind: "Pod", Operation: "UPDATE", HTTPCode: 200, Allowed: true}}
	h := wrap(tr, "/validate-pod", wh)
	serve(h, sampledParent)
	serve(h, "") // not sampled: not exported
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans := rcv.Spans()
	if len(spans) != 1 {
		t.Fatalf("receiver holds %d spans, want 1: %+v", len(spans), spans)
	}
	s := spans[0]
	if s.Role != otlpreceiver.RoleKadmit || s.Webhook != "/validate-pod" || s.Operation != "UPDATE" ||
		trace.SpanID(s.ParentID).String() != "b7ad6b7169203331" || s.Duration() <= 0 {
		t.Errorf("span %+v", s)
	}
}

// BenchmarkWrap is the cost of tracing on: the plain handler alone, Wrap
// with a request that is not sampled, and Wrap with a sampled one
// (recorded, not exported).
func BenchmarkWrap(b *testing.B) {
	wh := &webhook{d: admission.Decision{Kind: "Pod", Operation: "CREATE", HTTPCode: 200, Allowed: true}}
	plain := wh.handler()
	tr := newTracer(sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0)))), true)
	trRatio := newTracer(sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(1e-9)))), false)
	for _, c := range []struct {
		name, traceparent string
		h                 http.Handler
	}{
		{"off", "", plain},
		{"on-no-traceparent", "", tr.Wrap("/mutate-pod", plain)},
		{"on-unsampled-traceparent", unsampledParent, tr.Wrap("/mutate-pod", plain)},
		{"on-ratio-not-sampled", "", trRatio.Wrap("/mutate-pod", plain)},
		{"on-sampled", sampledParent, tr.Wrap("/mutate-pod", plain)},
	} {
		b.Run(c.name, func(b *testing.B) {
			r := httptest.NewRequest(http.MethodPost, "/mutate-pod", nil)
			if c.traceparent != "" {
				r.Header.Set("traceparent", c.traceparent)
			}
			w := httptest.NewRecorder()
			b.ReportAllocs()
			for b.Loop() {
				c.h.ServeHTTP(w, r)
			}
		})
	}
}
