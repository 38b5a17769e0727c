package otlpreceiver

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	collectortracev1 "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonv1 "go.opentelemetry.io/proto/otlp/common/v1"
	tracev1 "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

func start(t *testing.T, o Options) (*Receiver, collectortracev1.TraceServiceClient) {
	t.Helper()
	if o.Addr == "" {
		o.Addr = "127.0.0.1:0"
	}
	r, err := Start(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	conn, err := grpc.NewClient(r.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return r, collectortracev1.NewTraceServiceClient(conn)
}

func str(k, v string) *commonv1.KeyValue {
	return &commonv1.KeyValue{Key: k, Value: &commonv1.AnyValue{Value: &commonv1.AnyValue_StringValue{StringValue: v}}}
}

func id(n int, b byte) []byte {
	out := make([]byte, n)
	for i := range out {
		out[i] = b
	}
	return out
}

func request(spans ...*tracev1.Span) *collectortracev1.ExportTraceServiceRequest {
	return &collectortracev1.ExportTraceServiceRequest{ResourceSpans: []*tracev1.ResourceSpans{{
		ScopeSpans: []*tracev1.ScopeSpans{{Spans: spans}},
	}}}
}

// The three roles are kept with their attributes; anything else is only
// counted.
func TestExportClassifies(t *testing.T) {
	r, c := start(t, Options{})
	call := &tracev1.Span{Name: MutatingCallName, TraceId: id(16, 1), SpanId: id(8, 1), StartTimeUnixNano: 100, EndTimeUnixNano: 900,
		Attributes: []*commonv1.KeyValue{str("webhook", "lifespan.kadmit.io"), str("operation", "CREATE")}}
	client := &tracev1.Span{Name: "HTTP POST", Kind: tracev1.Span_SPAN_KIND_CLIENT, TraceId: id(16, 1), SpanId: id(8, 2), ParentSpanId: id(8, 1), StartTimeUnixNano: 200, EndTimeUnixNano: 800}
	kadmit := &tracev1.Span{Name: KadmitSpanName, Kind: tracev1.Span_SPAN_KIND_SERVER, TraceId: id(16, 1), SpanId: id(8, 3), ParentSpanId: id(8, 2), StartTimeUnixNano: 300, EndTimeUnixNano: 400,
		Attributes: []*commonv1.KeyValue{str("kadmit.webhook", "/mutate-pod"), str("kadmit.operation", "CREATE")}}
	other := &tracev1.Span{Name: "KubernetesAPI", Kind: tracev1.Span_SPAN_KIND_SERVER, TraceId: id(16, 1), SpanId: id(8, 4)}
	bad := &tracev1.Span{Name: ValidatingCallName, TraceId: id(3, 1), SpanId: id(8, 5)}
	resp, err := c.Export(context.Background(), request(call, client, kadmit, other, bad))
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetPartialSuccess() != nil {
		t.Errorf("partial success %v, want none", resp.GetPartialSuccess())
	}
	got := r.Spans()
	if len(got) != 3 {
		t.Fatalf("kept %d spans, want 3: %+v", len(got), got)
	}
	if s := got[0]; s.Role != RoleCall || !s.Mutating || s.Webhook != "lifespan.kadmit.io" || s.Operation != "CREATE" || s.Duration() != 800 {
		t.Errorf("call span %+v", s)
	}
	if s := got[1]; s.Role != RoleClient || s.ParentID != [8]byte(id(8, 1)) {
		t.Errorf("client span %+v", s)
	}
	if s := got[2]; s.Role != RoleKadmit || s.Webhook != "/mutate-pod" || s.ParentID != [8]byte(id(8, 2)) {
		t.Errorf("kadmit span %+v", s)
	}
	want := Stats{Received: 5, Kept: 3, Calls: 1, Ignored: 1, Invalid: 1}
	if st := r.Stats(); st != want {
		t.Errorf("stats %+v, want %+v", st, want)
	}
}

// Past MaxSpans spans are dropped, counted and reported as rejected, and
// the receiver keeps exactly MaxSpans.
func TestMaxSpansBound(t *testing.T) {
	r, c := start(t, Options{MaxSpans: 3})
	var spans []*tracev1.Span
	for i := range 5 {
		spans = append(spans, &tracev1.Span{Name: ValidatingCallName, TraceId: id(16, 1), SpanId: id(8, byte(i+1))})
	}
	resp, err := c.Export(context.Background(), request(spans...))
	if err != nil {
		t.Fatal(err)
	}
	if n := resp.GetPartialSuccess().GetRejectedSpans(); n != 2 {
		t.Errorf("rejected %d, want 2", n)
	}
	if st := r.Stats(); st.Kept != 3 || st.Dropped != 2 || len(r.Spans()) != 3 {
		t.Errorf("stats %+v, want 3 kept and 2 dropped", st)
	}
}

// A request over MaxMessageBytes is refused by gRPC before it is decoded.
func TestMaxMessageBound(t *testing.T) {
	r, c := start(t, Options{MaxMessageBytes: 1024})
	big := &tracev1.Span{Name: ValidatingCallName, TraceId: id(16, 1), SpanId: id(8, 1),
		Attributes: []*commonv1.KeyValue{str("webhook", strings.Repeat("x", 2048))}}
	_, err := c.Export(context.Background(), request(big))
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("Export of a 2 KiB request with a 1 KiB bound: %v, want ResourceExhausted", err)
	}
	if st := r.Stats(); st.Received != 0 {
		t.Errorf("stats %+v after a refused request", st)
	}
}

// Interned strings are cut and bounded in number.
func TestInternBound(t *testing.T) {
	r := &Receiver{strings: map[string]string{}}
	if got := r.intern(strings.Repeat("a", 400)); len(got) != maxStringLen {
		t.Errorf("interned length %d, want %d", len(got), maxStringLen)
	}
	for i := range maxStrings + 10 {
		r.intern(strings.Repeat("b", i%200) + string(rune('A'+i/200)))
	}
	if len(r.strings) != maxStrings {
		t.Errorf("%d strings interned, want the bound %d", len(r.strings), maxStrings)
	}
	if got := r.intern("new one"); got != OtherString {
		t.Errorf("past the bound: %q, want %q", got, OtherString)
	}
}

func TestStartRefuses(t *testing.T) {
	for _, o := range []Options{
		{Addr: "0.0.0.0:0"},
		{Addr: "example.com:4317"},
		{Addr: "127.0.0.1"},
		{Addr: "127.0.0.1:0", MaxSpans: MaxMaxSpans + 1},
		{Addr: "127.0.0.1:0", MaxSpans: -1},
		{Addr: "127.0.0.1:0", MaxMessageBytes: -1},
	} {
		r, err := Start(o)
		if err == nil {
			r.Stop()
			t.Errorf("Start(%+v) succeeded", o)
		}
	}
	if _, err := Start(Options{Addr: "0.0.0.0:0"}); !errors.Is(err, ErrNotLoopback) {
		t.Errorf("non-loopback: %v, want ErrNotLoopback", err)
	}
}

// At most maxConns connections are served at once: one more waits until
// one closes.
func TestMaxConnsBound(t *testing.T) {
	r, c := start(t, Options{})
	var held []net.Conn
	for range maxConns {
		conn, err := net.Dial("tcp", r.Addr())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, conn)
	}
	defer func() {
		for _, conn := range held {
			_ = conn.Close()
		}
	}()
	time.Sleep(100 * time.Millisecond) // let the server accept them
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if _, err := c.Export(ctx, request()); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("Export with %d connections open: %v, want DeadlineExceeded", maxConns, err)
	}
	_ = held[0].Close()
	held = held[1:]
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	if _, err := c.Export(ctx2, request(), grpc.WaitForReady(true)); err != nil {
		t.Fatalf("Export after one connection closed: %v", err)
	}
}
