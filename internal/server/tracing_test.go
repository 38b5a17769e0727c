package server

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/otlpreceiver"
	"github.com/kadmit/kadmit/internal/tracing"
)

// With Options.Tracing the routes record one span per sampled review,
// exported over OTLP to a real receiver, while metrics and the log still
// see every decision; a request without a traceparent is served untraced.
func TestTracedRoutes(t *testing.T) {
	rcv, err := otlpreceiver.Start(otlpreceiver.Options{Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer rcv.Stop()
	tr, err := tracing.New(context.Background(), tracing.Options{Endpoint: rcv.Addr(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	ts := start(t, Options{
		Webhooks: []*admission.Webhook{webhook(t, "allow", "/validate-pod", allowAll)},
		Registry: reg, Tracing: tr,
	}, true)
	const parent = "b7ad6b7169203331"
	for _, tp := range []string{"00-0af7651916cd43dd8448eb211c80319c-" + parent + "-01", ""} {
		req, err := http.NewRequest(http.MethodPost, ts.base+"/validate-pod?timeout=10s", bytes.NewReader(reviewBody("uid-1", "p")))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		if tp != "" {
			req.Header.Set("traceparent", tp)
		}
		resp, err := ts.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("traceparent %q: HTTP %d", tp, resp.StatusCode)
		}
	}
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans := rcv.Spans()
	if len(spans) != 1 {
		t.Fatalf("%d spans exported, want 1 (the sampled review): %+v", len(spans), spans)
	}
	if s := spans[0]; s.Role != otlpreceiver.RoleKadmit || s.Webhook != "/validate-pod" || s.Operation != "CREATE" || trace.SpanID(s.ParentID).String() != parent {
		t.Errorf("span %+v", s)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var answered float64
	for _, mf := range mfs {
		if mf.GetName() == "kadmit_admission_requests_total" {
			for _, m := range mf.GetMetric() {
				answered += m.GetCounter().GetValue()
			}
		}
	}
	if answered != 2 {
		t.Errorf("kadmit_admission_requests_total %g, want 2: the traced review's decision must reach the metrics too", answered)
	}
}
