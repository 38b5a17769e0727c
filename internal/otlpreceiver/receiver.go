// Package otlpreceiver is a minimal OTLP/gRPC trace receiver on loopback for
// `kadmit bench --through-apiserver --trace-receiver`: it implements
// opentelemetry.proto.collector.trace.v1.TraceService/Export
// (go.opentelemetry.io/proto/otlp) in plaintext, as the API server's
// exporter dials it (k8s.io/component-base v0.37.1 tracing/utils.go:67
// NewProvider: otlptracegrpc.WithInsecure), and keeps, in a compact form,
// only the spans a webhook-latency split needs:
//
//   - the API server's webhook call spans, "Call mutating webhook" and "Call
//     validating webhook" (k8s.io/apiserver v0.37.1
//     pkg/admission/plugin/webhook/mutating/dispatcher.go:266,
//     validating/dispatcher.go:267), with their "webhook" and "operation"
//     attributes;
//   - client spans (SpanKind CLIENT): among them the webhook REST client's
//     "HTTP POST" (otelhttp.NewTransport via component-base tracing
//     WrapperFor), a child of the call span;
//   - kadmit's server spans "kadmit.review" (internal/tracing), children of
//     that client span through the traceparent.
//
// Everything is bounded: the listener's connections, concurrent streams,
// the size of one message, the spans kept (beyond MaxSpans they are
// counted as dropped) and the distinct strings interned.
package otlpreceiver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"

	collectortracev1 "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonv1 "go.opentelemetry.io/proto/otlp/common/v1"
	tracev1 "go.opentelemetry.io/proto/otlp/trace/v1"
	"golang.org/x/net/netutil"
	"google.golang.org/grpc"
)

// Span names and attribute keys the receiver recognises.
const (
	MutatingCallName   = "Call mutating webhook"
	ValidatingCallName = "Call validating webhook"
	KadmitSpanName     = "kadmit.review" // internal/tracing.SpanName
	attrWebhook        = "webhook"       // the call span's webhook name
	attrOperation      = "operation"
	attrKadmitWebhook  = "kadmit.webhook" // internal/tracing.AttrWebhook
	attrKadmitOp       = "kadmit.operation"
)

// Defaults and bounds of Options.
const (
	// DefaultMaxSpans keeps ~45 MB of Span records: 1,000 creates/s for
	// 60 s through two webhooks is 360,000 spans of the three roles.
	DefaultMaxSpans = 500_000
	MaxMaxSpans     = 5_000_000
	// DefaultMaxMessageBytes bounds one Export request: a batch of 512
	// spans (the SDK's default batch) is ~200 KB.
	DefaultMaxMessageBytes = 8 << 20
	// maxConns and maxStreams bound the exporters served at once (the API
	// server and kadmit need one connection each).
	maxConns   = 16
	maxStreams = 16
	// maxStrings bounds the distinct strings (webhook names, operations)
	// interned; further ones are kept as OtherString. maxStringLen cuts
	// each (a webhook name is a DNS subdomain, at most 253).
	maxStrings   = 1024
	maxStringLen = 253
	// OtherString replaces a string once maxStrings are interned.
	OtherString = "(other)"
)

// Role is what a kept span is to the latency split.
type Role uint8

// Roles of kept spans.
const (
	RoleCall   Role = iota + 1 // the API server's webhook call span
	RoleClient                 // any CLIENT span (the webhook HTTP client's among them)
	RoleKadmit                 // kadmit's review span
)

// Span is one kept span. Times are Unix nanoseconds.
type Span struct {
	TraceID  [16]byte
	SpanID   [8]byte
	ParentID [8]byte
	Role     Role
	// Mutating is set on a RoleCall span named MutatingCallName.
	Mutating bool
	// Webhook is the call span's "webhook" attribute (the webhook's name),
	// or kadmit's "kadmit.webhook" (its path); "" for client spans.
	Webhook string
	// Operation is the call span's "operation" or kadmit's
	// "kadmit.operation".
	Operation  string
	Start, End int64
}

// Duration is End - Start in nanoseconds (0 if End is before Start).
func (s Span) Duration() int64 { return max(s.End-s.Start, 0) }

// Options configure Start.
type Options struct {
	// Addr is the loopback address to listen on, e.g. "127.0.0.1:4317" or
	// "127.0.0.1:0". A non-loopback host is refused.
	Addr string
	// MaxSpans bounds the spans kept, 1..MaxMaxSpans; 0 means
	// DefaultMaxSpans.
	MaxSpans int
	// MaxMessageBytes bounds one Export request; 0 means
	// DefaultMaxMessageBytes. Larger requests fail with ResourceExhausted.
	MaxMessageBytes int
}

// Stats counts what the receiver saw.
type Stats struct {
	Received int64 // spans in Export requests
	Kept     int64 // spans kept (Spans)
	Calls    int64 // of them, the API server's webhook call spans
	Ignored  int64 // spans of no role (other API server spans)
	Dropped  int64 // spans of a role not kept because MaxSpans were kept
	Invalid  int64 // spans without a valid trace or span id
}

// ErrNotLoopback is returned by Start for a non-loopback Addr.
var ErrNotLoopback = errors.New("the trace receiver listens on loopback only")

// Receiver is a running OTLP/gRPC trace receiver.
type Receiver struct {
	collectortracev1.UnimplementedTraceServiceServer
	ln       net.Listener
	srv      *grpc.Server
	maxSpans int
	done     chan struct{}

	received, ignored, dropped, invalid, calls atomic.Int64

	mu      sync.Mutex
	spans   []Span
	strings map[string]string
}

// Start listens on o.Addr and serves until Stop.
func Start(o Options) (*Receiver, error) {
	if o.MaxSpans == 0 {
		o.MaxSpans = DefaultMaxSpans
	}
	if o.MaxSpans < 1 || o.MaxSpans > MaxMaxSpans {
		return nil, fmt.Errorf("trace receiver: max spans %d: must be 1..%d", o.MaxSpans, MaxMaxSpans)
	}
	if o.MaxMessageBytes == 0 {
		o.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if o.MaxMessageBytes < 1 {
		return nil, fmt.Errorf("trace receiver: max message bytes %d: must be positive", o.MaxMessageBytes)
	}
	host, _, err := net.SplitHostPort(o.Addr)
	if err != nil {
		return nil, fmt.Errorf("trace receiver %q: want HOST:PORT: %w", o.Addr, err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return nil, fmt.Errorf("%w: %q is not a loopback IP address", ErrNotLoopback, o.Addr)
	}
	ln, err := net.Listen("tcp", o.Addr)
	if err != nil {
		return nil, fmt.Errorf("trace receiver: %w", err)
	}
	r := &Receiver{
		ln:       netutil.LimitListener(ln, maxConns),
		maxSpans: o.MaxSpans,
		done:     make(chan struct{}),
		strings:  map[string]string{},
	}
	r.srv = grpc.NewServer(grpc.MaxRecvMsgSize(o.MaxMessageBytes), grpc.MaxConcurrentStreams(maxStreams))
	collectortracev1.RegisterTraceServiceServer(r.srv, r)
	go func() {
		defer close(r.done)
		_ = r.srv.Serve(r.ln) // returns at Stop
	}()
	return r, nil
}

// Addr is the address the receiver listens on (with the port chosen for
// ":0").
func (r *Receiver) Addr() string { return r.ln.Addr().String() }

// Stop ends the server: in-flight Export calls finish first.
func (r *Receiver) Stop() {
	r.srv.GracefulStop()
	<-r.done
}

// Stats returns the counters so far.
func (r *Receiver) Stats() Stats {
	r.mu.Lock()
	kept := int64(len(r.spans))
	r.mu.Unlock()
	return Stats{Received: r.received.Load(), Kept: kept, Calls: r.calls.Load(), Ignored: r.ignored.Load(), Dropped: r.dropped.Load(), Invalid: r.invalid.Load()}
}

// Spans returns a copy of the spans kept so far, in arrival order.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// CountCalls counts the call spans (RoleCall) among the kept spans from
// index offset on whose start is within [from, to] (Unix ns), and returns
// the index to continue from: a caller polling for a run's spans scans each
// span once.
func (r *Receiver) CountCalls(offset int, from, to int64) (n int64, next int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	offset = min(max(offset, 0), len(r.spans))
	for i := offset; i < len(r.spans); i++ {
		if s := &r.spans[i]; s.Role == RoleCall && s.Start >= from && s.Start <= to {
			n++
		}
	}
	return n, len(r.spans)
}

// Export implements TraceServiceServer. It never refuses a well-formed
// request: spans past MaxSpans are counted as dropped and reported as
// rejected in the partial success, so the exporter does not retry them.
func (r *Receiver) Export(_ context.Context, req *collectortracev1.ExportTraceServiceRequest) (*collectortracev1.ExportTraceServiceResponse, error) {
	var rejected int64
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			spans := ss.GetSpans()
			r.received.Add(int64(len(spans)))
			r.mu.Lock()
			for _, s := range spans {
				if !r.keep(s) {
					rejected++
				}
			}
			r.mu.Unlock()
		}
	}
	resp := &collectortracev1.ExportTraceServiceResponse{}
	if rejected > 0 {
		resp.PartialSuccess = &collectortracev1.ExportTracePartialSuccess{
			RejectedSpans: rejected, ErrorMessage: fmt.Sprintf("kadmit bench trace receiver: %d spans kept, its bound", r.maxSpans),
		}
	}
	return resp, nil
}

// keep classifies s and keeps it if it has a role; it reports false only
// for a span dropped by the bound. Called with r.mu held.
func (r *Receiver) keep(s *tracev1.Span) bool {
	var role Role
	name := s.GetName()
	switch {
	case name == MutatingCallName || name == ValidatingCallName:
		role = RoleCall
	case name == KadmitSpanName && s.GetKind() == tracev1.Span_SPAN_KIND_SERVER:
		role = RoleKadmit
	case s.GetKind() == tracev1.Span_SPAN_KIND_CLIENT:
		role = RoleClient
	default:
		r.ignored.Add(1)
		return true
	}
	if len(s.GetTraceId()) != 16 || len(s.GetSpanId()) != 8 || (len(s.GetParentSpanId()) != 0 && len(s.GetParentSpanId()) != 8) {
		r.invalid.Add(1)
		return true
	}
	if len(r.spans) >= r.maxSpans {
		r.dropped.Add(1)
		return false
	}
	k := Span{Role: role, Mutating: name == MutatingCallName,
		Start: int64(s.GetStartTimeUnixNano()), End: int64(s.GetEndTimeUnixNano())}
	copy(k.TraceID[:], s.GetTraceId())
	copy(k.SpanID[:], s.GetSpanId())
	copy(k.ParentID[:], s.GetParentSpanId())
	switch role {
	case RoleCall:
		k.Webhook = r.intern(stringAttr(s.GetAttributes(), attrWebhook))
		k.Operation = r.intern(stringAttr(s.GetAttributes(), attrOperation))
	case RoleKadmit:
		k.Webhook = r.intern(stringAttr(s.GetAttributes(), attrKadmitWebhook))
		k.Operation = r.intern(stringAttr(s.GetAttributes(), attrKadmitOp))
	}
	r.spans = append(r.spans, k)
	if role == RoleCall {
		r.calls.Add(1)
	}
	return true
}

// intern returns one shared copy of s, cut to maxStringLen, or
// OtherString once maxStrings distinct strings are held. Called with r.mu
// held.
func (r *Receiver) intern(s string) string {
	if len(s) > maxStringLen {
		s = s[:maxStringLen]
	}
	if v, ok := r.strings[s]; ok {
		return v
	}
	if len(r.strings) >= maxStrings {
		return OtherString
	}
	s = string([]byte(s)) // detach from the request's buffer
	r.strings[s] = s
	return s
}

func stringAttr(kvs []*commonv1.KeyValue, key string) string {
	for _, kv := range kvs {
		if kv.GetKey() == key {
			return kv.GetValue().GetStringValue()
		}
	}
	return ""
}
