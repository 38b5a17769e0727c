package bench

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kadmit/kadmit/internal/otlpreceiver"
)

// trio records one webhook call as the API server and kadmit trace it:
// the call span [start, start+call], its client span starting clientAt
// after it for client, and (kadmit > 0) kadmit's span inside that.
func trio(trace byte, seq byte, mutating bool, name string, start, call, clientAt, client, kadmit int64) []otlpreceiver.Span {
	tid := [16]byte{trace}
	callID, clientID, kadmitID := [8]byte{seq, 1}, [8]byte{seq, 2}, [8]byte{seq, 3}
	out := []otlpreceiver.Span{
		{TraceID: tid, SpanID: callID, Role: otlpreceiver.RoleCall, Mutating: mutating, Webhook: name, Operation: "CREATE", Start: start, End: start + call},
		{TraceID: tid, SpanID: clientID, ParentID: callID, Role: otlpreceiver.RoleClient, Start: start + clientAt, End: start + clientAt + client},
	}
	if kadmit > 0 {
		out = append(out, otlpreceiver.Span{TraceID: tid, SpanID: kadmitID, ParentID: clientID, Role: otlpreceiver.RoleKadmit,
			Webhook: "/mutate-pod", Start: start + clientAt + 10, End: start + clientAt + 10 + kadmit})
	}
	return out
}

func TestSplitSpans(t *testing.T) {
	const ms = int64(time.Millisecond)
	var spans []otlpreceiver.Span
	// lifespan (mutating): 100 calls, call i takes (i+1) ms, its client
	// span 0.5 ms less, kadmit's span 0.1 ms.
	for i := range int64(100) {
		spans = append(spans, trio(byte(i), 1, true, "lifespan.kadmit.io", 1000*ms+i*ms, (i+1)*ms, ms/4, (i+1)*ms-ms/2, ms/10)...)
	}
	// pod-name (validating): two calls, one served by another server (no
	// kadmit span), one with a retried client span.
	spans = append(spans, trio(200, 2, false, "pod-name.kadmit.io", 1000*ms, 4*ms, ms, 2*ms, 0)...)
	retry := trio(201, 2, false, "pod-name.kadmit.io", 1001*ms, 4*ms, ms, 2*ms, ms)
	first := retry[1]
	first.SpanID, first.Start, first.End = [8]byte{9, 9}, first.Start-ms/2, first.Start-ms/4
	spans = append(spans, append(retry, first)...)
	// Outside the window: a warm-up's leftover and a span after the run.
	spans = append(spans, trio(250, 3, false, "pod-name.kadmit.io", 10*ms, 4*ms, ms, 2*ms, ms)...)
	spans = append(spans, trio(251, 3, false, "pod-name.kadmit.io", 5000*ms, 4*ms, ms, 2*ms, ms)...)

	rows := splitSpans(spans, 1000*ms, 2000*ms)
	if len(rows) != 2 {
		t.Fatalf("%d rows, want 2: %+v", len(rows), rows)
	}
	l, p := rows[0], rows[1]
	if l.Name != "lifespan.kadmit.io" || l.Type != "admit" || p.Name != "pod-name.kadmit.io" || p.Type != "validating" {
		t.Fatalf("rows %s/%s, %s/%s: want lifespan admit first", l.Name, l.Type, p.Name, p.Type)
	}
	if l.Calls != 100 || l.WithClient != 100 || l.WithKadmit != 100 || l.Retried != 0 {
		t.Errorf("lifespan counts %d/%d/%d/%d", l.Calls, l.WithClient, l.WithKadmit, l.Retried)
	}
	// Nearest rank over 1..100 ms: p50 50 ms, p90 90, p99 99, max 100.
	if l.Call.P50 != 50*time.Millisecond || l.Call.P90 != 90*time.Millisecond || l.Call.P99 != 99*time.Millisecond || l.Call.Max != 100*time.Millisecond {
		t.Errorf("call distribution %+v", l.Call)
	}
	if l.Call.Mean != 50500*time.Microsecond {
		t.Errorf("call mean %s, want 50.5ms", l.Call.Mean)
	}
	if l.APIServer.P50 != 500*time.Microsecond || l.APIServer.Max != 500*time.Microsecond {
		t.Errorf("API server part %+v, want 0.5 ms each", l.APIServer)
	}
	if l.Client.P50 != 49500*time.Microsecond || l.Client.Count != 100 {
		t.Errorf("HTTP part %+v", l.Client)
	}
	if l.Kadmit.Max != 100*time.Microsecond || l.Kadmit.Count != 100 {
		t.Errorf("kadmit part %+v", l.Kadmit)
	}
	// network+TLS = client - kadmit: (i+1) ms - 0.6 ms.
	if l.Network.P50 != 50*time.Millisecond-600*time.Microsecond {
		t.Errorf("network part p50 %s", l.Network.P50)
	}
	// The means add up: call = kadmit + network + API server.
	if sum := l.Kadmit.Mean + l.Network.Mean + l.APIServer.Mean; sum != l.Call.Mean {
		t.Errorf("means add to %s, call mean %s", sum, l.Call.Mean)
	}
	if got := l.KadmitShare(); got < 0.00197 || got > 0.00199 {
		t.Errorf("kadmit share %g, want 0.1/50.5", got)
	}
	if l.MeetsSpanTarget() {
		t.Error("a 99 ms p99 meets the 5 ms target")
	}

	if p.Calls != 2 || p.WithClient != 2 || p.WithKadmit != 1 || p.Retried != 1 {
		t.Errorf("pod-name counts calls %d client %d kadmit %d retried %d, want 2, 2, 1, 1", p.Calls, p.WithClient, p.WithKadmit, p.Retried)
	}
	if p.Kadmit.Count != 1 || p.Network.Count != 1 || p.APIServer.Count != 2 {
		t.Errorf("pod-name part counts %d/%d/%d", p.Kadmit.Count, p.Network.Count, p.APIServer.Count)
	}
	// The retried call uses its last client span (2 ms), not the first.
	if p.APIServer.Max != 2*time.Millisecond {
		t.Errorf("pod-name API server part %+v, want 2 ms (call 4 ms - last client 2 ms)", p.APIServer)
	}
	if !p.MeetsSpanTarget() {
		t.Error("a 4 ms p99 misses the 5 ms target")
	}
}

func TestNearestRank(t *testing.T) {
	for _, c := range []struct {
		n    int
		q    float64
		want int // 1-based rank
	}{{1, 0.5, 1}, {1, 0.99, 1}, {2, 0.5, 1}, {3, 0.5, 2}, {10, 0.9, 9}, {1000, 0.99, 990}, {1001, 0.99, 991}} {
		ds := make([]time.Duration, c.n)
		for i := range ds {
			ds[i] = time.Duration(i + 1)
		}
		if got := nearestRank(ds, c.q); got != time.Duration(c.want) {
			t.Errorf("n=%d q=%g: rank %d, want %d", c.n, c.q, got, c.want)
		}
	}
	if d := distOf(nil); d.Count != 0 || d.Max != 0 {
		t.Errorf("empty distribution %+v", d)
	}
}

// The report prints and encodes the span table next to the histogram one.
func TestSpanReportOutput(t *testing.T) {
	rows := splitSpans(trio(1, 1, true, "lifespan.kadmit.io", 10, int64(3*time.Millisecond), 5, int64(2*time.Millisecond), int64(time.Millisecond)), 0, 100)
	r := &APIServerReport{Rate: SpanTargetRate, Planned: 1, Sent: 1, Created: 1, Answered: 1, client: &histogram{}, StoppedBy: "count",
		Spans: &SpanReport{Receiver: "127.0.0.1:4317", Stats: otlpreceiver.Stats{Received: 3, Kept: 3}, Webhooks: rows}}
	var b bytes.Buffer
	if err := r.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"webhook call spans, exact", "network+TLS", "API server", "lifespan.kadmit.io: 1 calls traced, 1 with the client span, 1 with kadmit's span", "span target"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("text report lacks %q:\n%s", want, b.String())
		}
	}
	b.Reset()
	if err := r.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var j APIServerJSON
	if err := json.Unmarshal(b.Bytes(), &j); err != nil {
		t.Fatal(err)
	}
	if j.Spans == nil || len(j.Spans.Webhooks) != 1 || j.Spans.Webhooks[0].Call.P99 != 3 || j.Spans.Webhooks[0].Kadmit.Max != 1 || !j.Spans.Target.Met {
		t.Errorf("JSON spans %+v", j.Spans)
	}
	r.Spans.Webhooks = nil
	b.Reset()
	_ = r.WriteText(&b)
	if !strings.Contains(b.String(), "no webhook call span started during the run") {
		t.Errorf("no hint without spans:\n%s", b.String())
	}
}

func TestTraceReceiverOptions(t *testing.T) {
	for _, o := range []APIServerOptions{
		{TraceReceiver: "0.0.0.0:4317"},
		{TraceReceiver: "localhost:4317"},
		{TraceReceiver: "127.0.0.1"},
		{TraceReceiver: "127.0.0.1:0", MaxSpans: -1},
		{TraceReceiver: "127.0.0.1:0", MaxSpans: otlpreceiver.MaxMaxSpans + 1},
	} {
		if _, err := o.normalize(); !errors.Is(err, ErrOptions) {
			t.Errorf("normalize(%+v): %v, want ErrOptions", o, err)
		}
	}
	if _, err := (APIServerOptions{TraceReceiver: "[::1]:4317"}).normalize(); err != nil {
		t.Errorf("::1: %v", err)
	}
}

// waitForSpans ends once the expected calls are in and the receiver has
// been quiet for spanQuiet, or at once when done is closed; it never
// outlasts spanWaitMax.
func TestWaitForSpans(t *testing.T) {
	rcv, err := otlpreceiver.Start(otlpreceiver.Options{Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer rcv.Stop()
	if w := waitForSpans(rcv, 0, 1, 0, nil); w < spanQuiet || w > spanQuiet+time.Second {
		t.Errorf("with nothing expected: waited %s, want about %s", w, spanQuiet)
	}
	done := make(chan struct{})
	close(done)
	if w := waitForSpans(rcv, 0, 1, 10, done); w > 100*time.Millisecond {
		t.Errorf("interrupted: waited %s", w)
	}
}
