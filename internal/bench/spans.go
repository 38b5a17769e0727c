package bench

import (
	"cmp"
	"slices"
	"time"

	"github.com/kadmit/kadmit/internal/otlpreceiver"
)

// Span-based latency: the API server's traces of its webhook calls, from
// the trace receiver of APIServerOptions.TraceReceiver. Per call the API
// server opens "Call mutating webhook" / "Call validating webhook"
// (k8s.io/apiserver v0.37.1 pkg/admission/plugin/webhook/mutating/
// dispatcher.go:266, validating/dispatcher.go:267) around building the
// request, the HTTP call, decoding and verifying the answer and, for a
// mutating webhook, applying its patch; inside it the webhook REST client's
// transport (otelhttp.NewTransport, k8s.io/component-base v0.37.1
// tracing/utils.go:119) opens the CLIENT span "HTTP POST" from sending the
// request to the end of the answer's body, and sends its id as the
// traceparent that kadmit's "kadmit.review" span (internal/tracing) takes as
// its parent. So, per call:
//
//	call        = the call span (what the API server waits for this webhook)
//	HTTP        = the client span (the round trip: kadmit + network+TLS)
//	kadmit      = kadmit's span (answer read and decoded to answer written)
//	network+TLS = client span - kadmit span (connection, TLS, transfer)
//	API server  = call span - client span (encode, decode, verify, patch)
//
// All four are exact per call (nanosecond timestamps on one host's clock);
// their quantiles are computed separately, so quantiles do not add up, the
// means do.

// Settling: spans reach the receiver after their batch's timeout (the API
// server's SDK default is 5 s, kadmit's internal/tracing.BatchTimeout 1 s).
const (
	// spanQuiet ends the wait once every expected call span is in and
	// nothing new arrived for this long (kadmit's batch timeout and slack).
	spanQuiet = 1500 * time.Millisecond
	// spanSilence ends the wait when nothing arrived for this long (above
	// the API server's 5 s batch timeout) though spans are missing.
	spanSilence = 7 * time.Second
	// spanWaitMax bounds the whole wait.
	spanWaitMax = 20 * time.Second
	spanPoll    = 250 * time.Millisecond
)

// SpanDist is the exact distribution of one set of durations: order
// statistics by nearest rank (the smallest value with at least q of the
// values at or below it). Zero when Count is 0.
type SpanDist struct {
	Count                    int
	P50, P90, P99, Max, Mean time.Duration
	Sum                      time.Duration
}

// distOf sorts ds in place and returns their distribution.
func distOf(ds []time.Duration) SpanDist {
	d := SpanDist{Count: len(ds)}
	if len(ds) == 0 {
		return d
	}
	slices.Sort(ds)
	for _, v := range ds {
		d.Sum += v
	}
	d.P50, d.P90, d.P99 = nearestRank(ds, 0.5), nearestRank(ds, 0.9), nearestRank(ds, 0.99)
	d.Max, d.Mean = ds[len(ds)-1], d.Sum/time.Duration(len(ds))
	return d
}

// nearestRank returns the value of rank ceil(q × n) (1-based) of sorted.
func nearestRank(sorted []time.Duration, q float64) time.Duration {
	n := len(sorted)
	r := int(float64(n)*q + 0.999999999)
	return sorted[min(max(r, 1), n)-1]
}

// WebhookSpans is one webhook's calls as the API server traced them during
// a run. Call, Kadmit, Network and APIServer are the four parts above;
// Kadmit and Network count only calls whose kadmit span arrived (a webhook
// served by another server has none), APIServer only calls whose client
// span arrived.
type WebhookSpans struct {
	Name      string // the call span's "webhook" attribute
	Type      string // "admit" (mutating) or "validating", as the metric's label
	Operation string
	Calls     int // call spans that started during the run
	// WithClient and WithKadmit count the calls whose client span, and
	// kadmit span under it, were received.
	WithClient, WithKadmit int
	// Retried counts calls with more than one client span (the REST
	// client retried); the last one is used.
	Retried int
	// Client is the API server's HTTP client span alone: the round trip as
	// the API server's transport saw it (kadmit + network+TLS), also for a
	// webhook server that sends no spans.
	Call, Client, Kadmit, Network, APIServer SpanDist
}

// KadmitShare is kadmit's share of the mean call time, over the calls
// whose kadmit span arrived (0 when none did).
func (w *WebhookSpans) KadmitShare() float64 {
	if w.Kadmit.Count == 0 || w.Call.Mean == 0 {
		return 0
	}
	return float64(w.Kadmit.Mean) / float64(w.Call.Mean)
}

// MeetsSpanTarget reports whether the p99 of the call spans is at most
// TargetBucket (5 ms as the API server measures it: docs/performance.md).
func (w *WebhookSpans) MeetsSpanTarget() bool {
	return w.Call.Count > 0 && w.Call.P99.Seconds() <= TargetBucket
}

// SpanReport is the span-based part of an APIServerReport.
type SpanReport struct {
	Receiver string // the receiver's address
	Stats    otlpreceiver.Stats
	Primed   time.Duration // how long the run waited for the API server's first span before its load
	Waited   time.Duration // how long the run waited for spans after its last answer
	Webhooks []WebhookSpans
}

type spanKey struct {
	trace [16]byte
	span  [8]byte
}

// splitSpans matches the call spans that started in [from, to] (Unix ns)
// with their client and kadmit spans and returns one row per webhook,
// admit before validating, then by name and operation.
func splitSpans(spans []otlpreceiver.Span, from, to int64) []WebhookSpans {
	clients := map[spanKey]*otlpreceiver.Span{} // by (trace, parent): the call's
	retried := map[spanKey]bool{}
	kadmits := map[spanKey]*otlpreceiver.Span{} // by (trace, parent): the client's
	for i := range spans {
		s := &spans[i]
		k := spanKey{s.TraceID, s.ParentID}
		switch s.Role {
		case otlpreceiver.RoleClient:
			if prev, ok := clients[k]; ok {
				retried[k] = true
				if prev.Start > s.Start {
					continue
				}
			}
			clients[k] = s
		case otlpreceiver.RoleKadmit:
			kadmits[k] = s
		}
	}
	type rowKey struct{ name, typ, op string }
	type parts struct {
		row                                      WebhookSpans
		call, client, kadmit, network, apiserver []time.Duration
	}
	rows := map[rowKey]*parts{}
	for i := range spans {
		c := &spans[i]
		if c.Role != otlpreceiver.RoleCall || c.Start < from || c.Start > to {
			continue
		}
		typ := "validating"
		if c.Mutating {
			typ = "admit"
		}
		rk := rowKey{c.Webhook, typ, c.Operation}
		p := rows[rk]
		if p == nil {
			p = &parts{row: WebhookSpans{Name: c.Webhook, Type: typ, Operation: c.Operation}}
			rows[rk] = p
		}
		p.row.Calls++
		callD := time.Duration(c.Duration())
		p.call = append(p.call, callD)
		ck := spanKey{c.TraceID, c.SpanID}
		cl, ok := clients[ck]
		if !ok {
			continue
		}
		p.row.WithClient++
		if retried[ck] {
			p.row.Retried++
		}
		clD := time.Duration(cl.Duration())
		p.client = append(p.client, clD)
		p.apiserver = append(p.apiserver, max(callD-clD, 0))
		k, ok := kadmits[spanKey{cl.TraceID, cl.SpanID}]
		if !ok {
			continue
		}
		p.row.WithKadmit++
		kD := time.Duration(k.Duration())
		p.kadmit = append(p.kadmit, kD)
		p.network = append(p.network, max(clD-kD, 0))
	}
	out := make([]WebhookSpans, 0, len(rows))
	for _, p := range rows {
		p.row.Call, p.row.Client, p.row.Kadmit = distOf(p.call), distOf(p.client), distOf(p.kadmit)
		p.row.Network, p.row.APIServer = distOf(p.network), distOf(p.apiserver)
		out = append(out, p.row)
	}
	slices.SortFunc(out, func(a, b WebhookSpans) int {
		return cmp.Or(cmp.Compare(a.Type, b.Type), cmp.Compare(a.Name, b.Name), cmp.Compare(a.Operation, b.Operation))
	})
	return out
}

// waitForSpans waits until the receiver holds expected call spans that
// started in [from, to] (Unix ns) and has then been quiet for spanQuiet
// (kadmit's last batch), or has been silent for spanSilence, or
// spanWaitMax passed, or done is closed. Spans of other windows (a
// warm-up's last batch) do not count: the API server exports only every
// 5 s at low rates, so counting them could end the wait a batch early. It
// returns how long it waited.
func waitForSpans(rcv *otlpreceiver.Receiver, from, to, expected int64, done <-chan struct{}) time.Duration {
	start := time.Now()
	last, lastChange := rcv.Stats(), start
	var calls int64
	var offset int
	t := time.NewTicker(spanPoll)
	defer t.Stop()
	for {
		select {
		case <-done:
			return time.Since(start)
		case now := <-t.C:
			st := rcv.Stats()
			if st.Received != last.Received {
				last, lastChange = st, now
			}
			var n int64
			n, offset = rcv.CountCalls(offset, from, to)
			calls += n
			quiet := now.Sub(lastChange)
			switch {
			case calls >= expected && quiet >= spanQuiet,
				quiet >= spanSilence,
				now.Sub(start) >= spanWaitMax:
				return now.Sub(start)
			}
		}
	}
}
