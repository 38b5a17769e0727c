// Package tracing is kadmit serve's optional OpenTelemetry tracing: one
// server span per admission review, a child of the API server's webhook
// call when the API server sends a W3C traceparent, exported over OTLP/gRPC
// with a bounded queue. Off unless Options.Endpoint is set; when off nothing
// here runs on the request path (the server does not wrap its handlers).
//
// The API server propagates its trace context to webhooks since KEP-647
// (APIServerTracing, GA in 1.34): k8s.io/apiserver v0.37.1
// pkg/admission/plugin/webhook/mutating/dispatcher.go:266 and
// validating/dispatcher.go:267 open a span "Call mutating webhook" /
// "Call validating webhook" around each call, and the webhook REST client's
// transport is wrapped by k8s.io/component-base v0.37.1
// tracing/utils.go:119 WrapperFor (otelhttp.NewTransport with the
// TraceContext and Baggage propagators; wired in
// pkg/util/webhook/authentication.go:60 and :83), whose client span "HTTP
// POST" is the parent named in the traceparent kadmit receives.
package tracing

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/credentials"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/version"
)

// SpanName is the name of kadmit's span around one admission review.
const SpanName = "kadmit.review"

// Attribute keys of a SpanName span. Every value is bounded: the webhook
// path is one of kadmit's own routes, kind and operation are cut to
// maxAttrLen, and no object name, namespace, user or message is recorded.
const (
	AttrWebhook   = "kadmit.webhook"   // the path served, e.g. "/mutate-pod"
	AttrOperation = "kadmit.operation" // CREATE, UPDATE, DELETE, CONNECT
	AttrKind      = "kadmit.kind"      // request.kind.kind, e.g. "Pod"
	AttrAllowed   = "kadmit.allowed"   // the decision, when HTTP 200
	AttrPatched   = "kadmit.patched"   // a JSONPatch was returned
	AttrHTTPCode  = "http.response.status_code"
)

// Bounds of the exporter (sdktrace's BatchSpanProcessor): spans beyond
// MaxQueue waiting for export are dropped, never blocking a review.
const (
	MaxQueue       = 2048
	MaxExportBatch = 512
	// BatchTimeout is the longest a finished span waits before export: a
	// bench run's spans arrive within it of the run's end.
	BatchTimeout  = time.Second
	ExportTimeout = 10 * time.Second
	// ShutdownTimeout bounds the final flush at serve's stop.
	ShutdownTimeout = 5 * time.Second
	// maxAttrLen bounds a string attribute taken from a request (kind,
	// operation): the API server sends short ones, anyone else reaching
	// the port might not.
	maxAttrLen = 63
	// errorLogEvery bounds the exporter's error log (a collector that is
	// down fails every batch).
	errorLogEvery = time.Minute
)

// Options configure New.
type Options struct {
	// Endpoint is the OTLP/gRPC collector, HOST:PORT. Required.
	Endpoint string
	// CAFile, when set, is a PEM file of the CAs that verify the
	// collector's certificate; the connection is then TLS whatever the
	// host. Without it, a loopback host (an IP literal or "localhost") is
	// dialled in plaintext (a sidecar or node-local collector on the same
	// host), any other host with TLS verified by the system roots: spans
	// are never sent unencrypted off the host.
	CAFile string
	// SamplingRatio, 0..1, is the share of reviews traced when the
	// request carries no sampled parent. Reviews whose traceparent is
	// sampled are always recorded and those whose traceparent is not
	// sampled never are (ParentBased), so with 0 (the default) kadmit
	// records exactly the calls the API server traces.
	SamplingRatio float64
	// Logger receives the exporter's errors, at most one per minute.
	Logger *slog.Logger
}

// Tracer records review spans; nil means tracing is off. Build it with New
// and call Shutdown at stop to flush what is queued.
type Tracer struct {
	tp     *sdktrace.TracerProvider
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
	// followOnly is SamplingRatio 0: only a sampled traceparent is
	// recorded, so a request without one skips the SDK entirely.
	followOnly bool
}

// ErrOptions is wrapped by New's errors in Options themselves.
var ErrOptions = errors.New("tracing options")

// New validates o and starts the exporter. The gRPC connection is made
// lazily: a collector that is not up yet costs dropped spans and one log
// line a minute, never a failed start.
func New(ctx context.Context, o Options) (*Tracer, error) {
	if o.SamplingRatio < 0 || o.SamplingRatio > 1 {
		return nil, fmt.Errorf("%w: --tracing-sampling-ratio %g: must be 0..1", ErrOptions, o.SamplingRatio)
	}
	host, _, err := net.SplitHostPort(o.Endpoint)
	if err != nil || host == "" {
		return nil, fmt.Errorf("%w: --tracing-endpoint %q: want HOST:PORT", ErrOptions, o.Endpoint)
	}
	opts := []otlptracegrpc.Option{otlptracegrpc.WithEndpoint(o.Endpoint), otlptracegrpc.WithTimeout(ExportTimeout)}
	switch {
	case o.CAFile != "":
		pem, err := os.ReadFile(o.CAFile)
		if err != nil {
			return nil, fmt.Errorf("%w: --tracing-ca-file: %w", ErrOptions, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%w: --tracing-ca-file %s: no PEM certificate found", ErrOptions, o.CAFile)
		}
		opts = append(opts, otlptracegrpc.WithTLSCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})))
	case IsLoopbackHost(host):
		opts = append(opts, otlptracegrpc.WithInsecure())
	default:
		opts = append(opts, otlptracegrpc.WithTLSCredentials(credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12})))
	}
	exp, err := otlptracegrpc.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter for %s: %w", o.Endpoint, err)
	}
	res := resource.NewSchemaless(semconv.ServiceName("kadmit"), semconv.ServiceVersion(version.String()))
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(o.SamplingRatio))),
		sdktrace.WithBatcher(exp,
			sdktrace.WithMaxQueueSize(MaxQueue), sdktrace.WithMaxExportBatchSize(MaxExportBatch),
			sdktrace.WithBatchTimeout(BatchTimeout), sdktrace.WithExportTimeout(ExportTimeout)),
	)
	if o.Logger != nil {
		otel.SetErrorHandler(&throttledErrors{log: o.Logger})
	}
	return newTracer(tp, o.SamplingRatio == 0), nil
}

func newTracer(tp *sdktrace.TracerProvider, followOnly bool) *Tracer {
	return &Tracer{
		tp:         tp,
		followOnly: followOnly,
		tracer:     tp.Tracer("github.com/kadmit/kadmit/internal/tracing"),
		// The API server's own propagators (component-base tracing.Propagators).
		prop: propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}),
	}
}

// IsLoopbackHost reports whether host is a loopback IP literal or
// "localhost".
func IsLoopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Shutdown exports the queued spans and stops the exporter, within ctx.
func (t *Tracer) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	if err := t.tp.Shutdown(ctx); err != nil {
		return fmt.Errorf("tracing: flush spans at stop: %w", err)
	}
	return nil
}

// Wrap returns the traced form of one admission route h. A sampled request
// runs h under a server span, SpanName, whose parent is the request's
// traceparent, carried in the request's context; h's Observe records the
// decision on it with Record. The span is recorded only when sampled (see
// Options.SamplingRatio). With ratio 0 a request without a sampled
// traceparent costs one header lookup; with a ratio above 0 one that is not
// sampled costs the extraction and a non-recording span (~1 µs, 9
// allocations, BenchmarkWrap).
func (t *Tracer) Wrap(path string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if t.followOnly && !sampledFlag(r.Header.Get("Traceparent")) {
			// Would not be sampled (ParentBased, root ratio 0): no
			// extraction, no span, no allocation.
			h.ServeHTTP(w, r)
			return
		}
		ctx := t.prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		ctx, span := t.tracer.Start(ctx, SpanName, trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(attribute.String(AttrWebhook, path)))
		if !span.IsRecording() {
			span.End()
			h.ServeHTTP(w, r)
			return
		}
		defer span.End()
		h.ServeHTTP(w, r.WithContext(ctx))
	})
}

// Record records the decision d on the span Wrap put in ctx, if it is
// recording; otherwise it does nothing (one context lookup).
func Record(ctx context.Context, d admission.Decision) {
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		annotate(span, d)
	}
}

// sampledFlag reports whether a W3C traceparent
// ("00-<trace-id>-<parent-id>-<flags>") has the sampled bit of its flags
// set; a malformed one may say true (the propagator then decides).
func sampledFlag(tp string) bool {
	if len(tp) < 2 {
		return false
	}
	c := tp[len(tp)-1]
	var v byte
	switch {
	case c >= '0' && c <= '9':
		v = c - '0'
	case c >= 'a' && c <= 'f':
		v = c - 'a' + 10
	default:
		return true
	}
	return v&1 == 1
}

// annotate records d on span: bounded values only (see the Attr keys).
func annotate(span trace.Span, d admission.Decision) {
	attrs := []attribute.KeyValue{
		attribute.String(AttrOperation, cut(d.Operation)),
		attribute.String(AttrKind, cut(d.Kind)),
		attribute.Int(AttrHTTPCode, d.HTTPCode),
	}
	if d.HTTPCode == http.StatusOK {
		attrs = append(attrs, attribute.Bool(AttrAllowed, d.Allowed), attribute.Bool(AttrPatched, d.Patched))
	}
	span.SetAttributes(attrs...)
	if d.HTTPCode >= 500 {
		// The reason is kadmit's own text (a panic, a deadline, a limit),
		// never the object's; still cut.
		msg := "answered " + http.StatusText(d.HTTPCode)
		if d.Panic != nil {
			msg = "policy panicked"
		}
		span.SetStatus(codes.Error, msg)
	}
}

func cut(s string) string {
	if len(s) > maxAttrLen {
		return s[:maxAttrLen]
	}
	return s
}

// throttledErrors logs the SDK's errors (failed exports, dropped spans) at
// most once per errorLogEvery, counting the rest.
type throttledErrors struct {
	log        *slog.Logger
	mu         sync.Mutex
	last       time.Time
	suppressed int
}

func (h *throttledErrors) Handle(err error) {
	h.mu.Lock()
	now := time.Now()
	if !h.last.IsZero() && now.Sub(h.last) < errorLogEvery {
		h.suppressed++
		h.mu.Unlock()
		return
	}
	n := h.suppressed
	h.last, h.suppressed = now, 0
	h.mu.Unlock()
	msg := err.Error()
	if len(msg) > 300 {
		msg = msg[:300] + "..."
	}
	h.log.Warn("tracing: span export failed; spans are dropped until the collector answers",
		slog.String("error", msg), slog.Int("suppressedSinceLast", n))
}
