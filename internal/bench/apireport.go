package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// TargetText states the histogram target as the report prints it.
var TargetText = fmt.Sprintf("every webhook's p99 in the API server's lowest bucket (<= %s) at %d creates/s, with all seed webhooks registered",
	fmtSeconds(TargetBucket), TargetRate)

// Complete reports whether exactly the planned creates were sent and all of
// them succeeded.
func (r *APIServerReport) Complete() bool {
	return r.Sent == r.Planned && r.Created == r.Planned && r.ErrorCount() == 0
}

// WriteText writes the report for people: the load and its outcome, the
// client's latency, then one row per webhook from the API server's
// histogram, and the target.
func (r *APIServerReport) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "kadmit bench --through-apiserver %s\n", r.Server)
	where := "cluster-scoped"
	if r.Namespace != "" {
		where = "namespace " + r.Namespace
	}
	fmt.Fprintf(&b, "  object      %s (%s), %s, %d-byte JSON, server-side dry-run CREATE (dryRun=All: nothing is stored)\n", r.Kind, r.Resource, where, r.BodyBytes)
	ended := map[string]string{
		"count":         "every planned create sent",
		"send deadline": "STOPPED at the send deadline (-d + --timeout) before every planned create was sent",
		"interrupted":   "INTERRUPTED",
	}[r.StoppedBy]
	fmt.Fprintf(&b, "  load        %d creates/s open loop for %s, at most %d in flight (peak %d), ran %s, %s\n",
		r.Rate, r.Asked, r.MaxInFlight, r.PeakInFlight, r.Elapsed.Round(time.Millisecond), ended)
	exact := "exactly as planned"
	if r.Sent != r.Planned {
		exact = fmt.Sprintf("SHORT by %d", r.Planned-r.Sent)
	}
	fmt.Fprintf(&b, "  creates     %d of %d planned sent (%s), %d answered: %d created, %d failed\n",
		r.Sent, r.Planned, exact, r.Answered, r.Created, r.ErrorCount())
	if r.Late > 0 {
		fmt.Fprintf(&b, "  late        %d creates sent more than one period (%s) after their slot, up to %s late; %d waited for an in-flight slot: the rate was not held\n",
			r.Late, fmtDur(time.Second/time.Duration(r.Rate)), fmtDur(r.MaxLag), r.Held)
	} else {
		fmt.Fprintf(&b, "  late        0 (every create sent on schedule)\n")
	}
	fmt.Fprintf(&b, "  errors      %d%s\n", r.ErrorCount(), errorList(r.Errors))
	for _, k := range slices.Sorted(maps.Keys(r.ErrorSamples)) {
		fmt.Fprintf(&b, "    %-20s e.g. %s\n", k, r.ErrorSamples[k])
	}
	if r.Created > 0 {
		fmt.Fprintf(&b, "  client      p50 %s  p90 %s  p99 %s  max %s  mean %s  (successful creates, request sent to last byte of the answer)\n",
			fmtDur(r.ClientLatency(0.5)), fmtDur(r.ClientLatency(0.9)), fmtDur(r.ClientLatency(0.99)),
			fmtDur(time.Duration(r.client.max)), fmtDur(r.ClientMean()))
	}
	b.WriteString("\n")
	if len(r.Webhooks) == 0 {
		fmt.Fprintf(&b, "no admission webhook was called during the run (%s shows no new observation): none intercepts CREATE of %s here\n", WebhookDurationMetric, r.Resource)
	} else {
		fmt.Fprintf(&b, "the API server's %s, delta over the run\n", WebhookDurationMetric)
		fmt.Fprintf(&b, "(p50/p99 bucket-interpolated as PromQL's histogram_quantile; bucket bounds %s; mean = _sum/_count; share = webhook / client)\n", boundsList(r.Webhooks[0].Buckets))
		tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  webhook\ttype\top\tcalls\trejected\tmean\tp50\tp99\tcalls <= lowest bucket\tshare mean / p50 / p99\ttarget")
		for i := range r.Webhooks {
			wl := &r.Webhooks[i]
			target := "missed"
			if wl.MeetsTarget() {
				target = "met"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%.2f%% <= %s\t%s / %s / %s\t%s\n",
				wl.Name, wl.Type, wl.Operation, wl.Calls, wl.Rejected, fmtSeconds(wl.Mean),
				quantileText(wl.P50, wl.P50InInf), quantileText(wl.P99, wl.P99InInf),
				100*wl.LowestShare, fmtSeconds(wl.LowestBucket),
				pct(wl.ShareMean), pct(wl.ShareP50), pct(wl.ShareP99), target)
		}
		_ = tw.Flush()
		for i := range r.Webhooks {
			if wl := &r.Webhooks[i]; len(wl.Rejection) > 0 {
				fmt.Fprintf(&b, "  %s rejections by error_type: %s\n", wl.Name, strings.TrimPrefix(errorList(wl.Rejection), ": "))
			}
		}
	}
	fmt.Fprintf(&b, "target      %s: %s\n", TargetText, r.targetVerdict())
	if r.Spans != nil {
		b.WriteString("\n")
		r.Spans.writeText(&b, r.Rate)
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	return nil
}

// targetVerdict says whether this run meets the target, and why not.
func (r *APIServerReport) targetVerdict() string {
	if len(r.Webhooks) == 0 {
		return "not measured (no webhook called)"
	}
	met := 0
	for i := range r.Webhooks {
		if r.Webhooks[i].MeetsTarget() {
			met++
		}
	}
	v := fmt.Sprintf("met by %d of %d webhooks", met, len(r.Webhooks))
	if met < len(r.Webhooks) {
		v = fmt.Sprintf("MISSED: met by %d of %d webhooks", met, len(r.Webhooks))
	}
	if r.Rate != TargetRate {
		v += fmt.Sprintf(" (this run: %d creates/s, not %d)", r.Rate, TargetRate)
	}
	if !r.Complete() {
		v += " (the run was not complete: see creates and errors)"
	}
	return v
}

func quantileText(v float64, inInf bool) string {
	if inInf {
		return "> " + fmtSeconds(v)
	}
	return fmtSeconds(v)
}

func fmtSeconds(s float64) string {
	if math.IsNaN(s) || math.IsInf(s, 0) {
		return strconv.FormatFloat(s, 'g', -1, 64)
	}
	return fmtDur(time.Duration(s * float64(time.Second)))
}

func pct(f float64) string {
	if f == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f%%", 100*f)
}

func boundsList(bs []Bucket) string {
	parts := make([]string, 0, len(bs))
	for _, b := range bs {
		if math.IsInf(b.LE, +1) {
			parts = append(parts, "+Inf")
			continue
		}
		parts = append(parts, fmtSeconds(b.LE))
	}
	return strings.Join(parts, ", ")
}

// errorList renders counts largest first, e.g. ": forbidden 40, timeout 2".
func errorList(m map[string]int64) string {
	if len(m) == 0 {
		return ""
	}
	keys := slices.Sorted(maps.Keys(m))
	sort.SliceStable(keys, func(i, j int) bool { return m[keys[i]] > m[keys[j]] })
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return ": " + strings.Join(parts, ", ")
}

// APIServerJSON is the -o json shape of an APIServerReport. Durations are in
// milliseconds, as the field names say; bucket bounds are strings
// ("0.005", "+Inf") because JSON has no infinity.
type APIServerJSON struct {
	Server          string            `json:"server"`
	Kind            string            `json:"kind"`
	Resource        string            `json:"resource"`
	Namespace       string            `json:"namespace"`
	BodyBytes       int               `json:"body_bytes"`
	Rate            int               `json:"rate"`
	DurationSeconds float64           `json:"duration_seconds"`
	MaxInFlight     int               `json:"max_in_flight"`
	PeakInFlight    int64             `json:"peak_in_flight"`
	Planned         int64             `json:"planned"`
	Sent            int64             `json:"sent"`
	Answered        int64             `json:"answered"`
	Created         int64             `json:"created"`
	Errors          map[string]int64  `json:"errors"`
	ErrorSamples    map[string]string `json:"error_samples"`
	Late            int64             `json:"late"`
	Held            int64             `json:"held_by_in_flight_bound"`
	MaxLagMS        float64           `json:"max_lag_ms"`
	ElapsedSeconds  float64           `json:"elapsed_seconds"`
	StoppedBy       string            `json:"stopped_by"`
	Complete        bool              `json:"complete"`
	ClientMS        struct {
		P50  float64 `json:"p50"`
		P90  float64 `json:"p90"`
		P99  float64 `json:"p99"`
		Max  float64 `json:"max"`
		Mean float64 `json:"mean"`
	} `json:"client_latency_ms"`
	Webhooks []WebhookJSON `json:"webhooks"`
	Target   struct {
		Text string `json:"text"`
		Met  bool   `json:"met"`
	} `json:"target"`
	// Spans is present with --trace-receiver.
	Spans *SpansJSON `json:"spans,omitempty"`
}

// WebhookJSON is one WebhookLatency in -o json; see WebhookLatency for the
// meaning of each field. P50MS and P99MS are bucket-interpolated.
type WebhookJSON struct {
	Name        string           `json:"name"`
	Type        string           `json:"type"`
	Operation   string           `json:"operation"`
	Calls       int64            `json:"calls"`
	Rejected    int64            `json:"rejected"`
	Rejections  map[string]int64 `json:"rejections"`
	MeanMS      float64          `json:"mean_ms"`
	P50MS       float64          `json:"p50_ms"`
	P99MS       float64          `json:"p99_ms"`
	P50InInf    bool             `json:"p50_in_inf_bucket"`
	P99InInf    bool             `json:"p99_in_inf_bucket"`
	LowestMS    float64          `json:"lowest_bucket_ms"`
	LowestShare float64          `json:"lowest_bucket_share"`
	ShareMean   float64          `json:"share_of_client_mean"`
	ShareP50    float64          `json:"share_of_client_p50"`
	ShareP99    float64          `json:"share_of_client_p99"`
	MeetsTarget bool             `json:"meets_target"`
	Buckets     []struct {
		LE    string `json:"le"`
		Count int64  `json:"count"`
	} `json:"buckets"`
}

// JSON returns the report in its -o json shape.
func (r *APIServerReport) JSON() APIServerJSON {
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	j := APIServerJSON{
		Server: r.Server, Kind: r.Kind, Resource: r.Resource, Namespace: r.Namespace, BodyBytes: r.BodyBytes,
		Rate: r.Rate, DurationSeconds: r.Asked.Seconds(), MaxInFlight: r.MaxInFlight, PeakInFlight: r.PeakInFlight,
		Planned: r.Planned, Sent: r.Sent, Answered: r.Answered, Created: r.Created,
		Errors: r.Errors, ErrorSamples: r.ErrorSamples, Late: r.Late, Held: r.Held, MaxLagMS: ms(r.MaxLag),
		ElapsedSeconds: r.Elapsed.Seconds(), StoppedBy: r.StoppedBy, Complete: r.Complete(),
		Webhooks: []WebhookJSON{},
	}
	if j.Errors == nil {
		j.Errors = map[string]int64{}
	}
	if j.ErrorSamples == nil {
		j.ErrorSamples = map[string]string{}
	}
	j.ClientMS.P50, j.ClientMS.P90, j.ClientMS.P99 = ms(r.ClientLatency(0.5)), ms(r.ClientLatency(0.9)), ms(r.ClientLatency(0.99))
	j.ClientMS.Max, j.ClientMS.Mean = ms(time.Duration(r.client.max)), ms(r.ClientMean())
	met := len(r.Webhooks) > 0
	for i := range r.Webhooks {
		w := &r.Webhooks[i]
		wj := WebhookJSON{
			Name: w.Name, Type: w.Type, Operation: w.Operation, Calls: w.Calls, Rejected: w.Rejected, Rejections: w.Rejection,
			MeanMS: w.Mean * 1e3, P50MS: w.P50 * 1e3, P99MS: w.P99 * 1e3, P50InInf: w.P50InInf, P99InInf: w.P99InInf,
			LowestMS: w.LowestBucket * 1e3, LowestShare: w.LowestShare,
			ShareMean: w.ShareMean, ShareP50: w.ShareP50, ShareP99: w.ShareP99, MeetsTarget: w.MeetsTarget(),
		}
		for _, bk := range w.Buckets {
			le := strconv.FormatFloat(bk.LE, 'g', -1, 64)
			if math.IsInf(bk.LE, +1) {
				le = "+Inf"
			}
			wj.Buckets = append(wj.Buckets, struct {
				LE    string `json:"le"`
				Count int64  `json:"count"`
			}{le, bk.Count})
		}
		met = met && w.MeetsTarget()
		j.Webhooks = append(j.Webhooks, wj)
	}
	j.Target.Text, j.Target.Met = TargetText, met && r.Rate == TargetRate && r.Complete()
	if r.Spans != nil {
		j.Spans = r.Spans.json()
		j.Spans.Target.Met = j.Spans.Target.Met && r.Rate == SpanTargetRate && r.Complete()
	}
	return j
}

// WriteJSON writes JSON() as one object and a newline.
func (r *APIServerReport) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(r.JSON()); err != nil {
		return fmt.Errorf("write JSON report: %w", err)
	}
	return nil
}

// SpanTargetText states the span target as the report prints it.
var SpanTargetText = fmt.Sprintf("every webhook call's p99 <= %s as the API server's spans measure it, at %d creates/s", fmtSeconds(TargetBucket), SpanTargetRate)

// SpanTargetRate is the rate the span target is stated at, in creates/s.
const SpanTargetRate = 1000

// writeText writes the span table: per webhook, the four parts' exact
// distributions.
func (s *SpanReport) writeText(b *strings.Builder, rate int) {
	st := s.Stats
	fmt.Fprintf(b, "the API server's webhook call spans, exact (trace receiver %s: %d spans received, %d kept, %d dropped at its bound; first API server span after %s, waited %s for the last batches)\n",
		s.Receiver, st.Received, st.Kept, st.Dropped, s.Primed.Round(10*time.Millisecond), s.Waited.Round(10*time.Millisecond))
	if len(s.Webhooks) == 0 {
		b.WriteString("  no webhook call span started during the run: is the API server started with --tracing-config-file whose endpoint is this receiver (samplingRatePerMillion 1000000)?\n")
		return
	}
	b.WriteString("(call = the API server's \"Call mutating/validating webhook\" span; HTTP = its HTTP client span under it; kadmit = kadmit's span under that;\n network+TLS = HTTP - kadmit; API server = call - HTTP: encoding, decoding, patch; quantiles by nearest rank, each part's own: the means add up)\n")
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "  webhook\ttype\top\tpart\tcount\tp50\tp90\tp99\tmax\tmean\t")
	for i := range s.Webhooks {
		w := &s.Webhooks[i]
		for _, part := range []struct {
			name string
			d    SpanDist
		}{{"call", w.Call}, {"HTTP", w.Client}, {"kadmit", w.Kadmit}, {"network+TLS", w.Network}, {"API server", w.APIServer}} {
			name, typ, op := "", "", ""
			if part.name == "call" {
				name, typ, op = w.Name, w.Type, w.Operation
			}
			if part.d.Count == 0 {
				fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t0\t-\t-\t-\t-\t-\t\n", name, typ, op, part.name)
				continue
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t\n", name, typ, op, part.name, part.d.Count,
				fmtDur(part.d.P50), fmtDur(part.d.P90), fmtDur(part.d.P99), fmtDur(part.d.Max), fmtDur(part.d.Mean))
		}
	}
	_ = tw.Flush()
	met := 0
	for i := range s.Webhooks {
		w := &s.Webhooks[i]
		fmt.Fprintf(b, "  %s: %d calls traced, %d with the client span, %d with kadmit's span", w.Name, w.Calls, w.WithClient, w.WithKadmit)
		if w.Retried > 0 {
			fmt.Fprintf(b, ", %d retried", w.Retried)
		}
		if sh := w.KadmitShare(); sh > 0 {
			fmt.Fprintf(b, "; kadmit's share of the mean call %.0f%%", 100*sh)
		}
		b.WriteString("\n")
		if w.MeetsSpanTarget() {
			met++
		}
	}
	v := fmt.Sprintf("met by %d of %d webhooks", met, len(s.Webhooks))
	if met < len(s.Webhooks) {
		v = "MISSED: " + v
	}
	if rate != SpanTargetRate {
		v += fmt.Sprintf(" (this run: %d creates/s, not %d)", rate, SpanTargetRate)
	}
	fmt.Fprintf(b, "span target %s: %s\n", SpanTargetText, v)
}

// SpansJSON is the -o json shape of a SpanReport; durations in
// milliseconds.
type SpansJSON struct {
	Receiver      string             `json:"receiver"`
	Received      int64              `json:"spans_received"`
	Kept          int64              `json:"spans_kept"`
	Dropped       int64              `json:"spans_dropped"`
	PrimedSeconds float64            `json:"primed_seconds"`
	WaitedSeconds float64            `json:"waited_seconds"`
	Webhooks      []WebhookSpansJSON `json:"webhooks"`
	Target        struct {
		Text string `json:"text"`
		Met  bool   `json:"met"`
	} `json:"target"`
}

// WebhookSpansJSON is one WebhookSpans in -o json.
type WebhookSpansJSON struct {
	Name        string       `json:"name"`
	Type        string       `json:"type"`
	Operation   string       `json:"operation"`
	Calls       int          `json:"calls"`
	WithClient  int          `json:"with_client_span"`
	WithKadmit  int          `json:"with_kadmit_span"`
	Retried     int          `json:"retried"`
	Call        SpanDistJSON `json:"call_ms"`
	Client      SpanDistJSON `json:"http_ms"`
	Kadmit      SpanDistJSON `json:"kadmit_ms"`
	Network     SpanDistJSON `json:"network_tls_ms"`
	APIServer   SpanDistJSON `json:"apiserver_ms"`
	KadmitShare float64      `json:"kadmit_share_of_mean"`
	MeetsTarget bool         `json:"meets_target"`
}

// SpanDistJSON is a SpanDist in milliseconds.
type SpanDistJSON struct {
	Count int     `json:"count"`
	P50   float64 `json:"p50"`
	P90   float64 `json:"p90"`
	P99   float64 `json:"p99"`
	Max   float64 `json:"max"`
	Mean  float64 `json:"mean"`
}

func (s *SpanReport) json() *SpansJSON {
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	dist := func(d SpanDist) SpanDistJSON {
		return SpanDistJSON{Count: d.Count, P50: ms(d.P50), P90: ms(d.P90), P99: ms(d.P99), Max: ms(d.Max), Mean: ms(d.Mean)}
	}
	j := &SpansJSON{Receiver: s.Receiver, Received: s.Stats.Received, Kept: s.Stats.Kept, Dropped: s.Stats.Dropped,
		PrimedSeconds: s.Primed.Seconds(), WaitedSeconds: s.Waited.Seconds(), Webhooks: []WebhookSpansJSON{}}
	met := len(s.Webhooks) > 0
	for i := range s.Webhooks {
		w := &s.Webhooks[i]
		j.Webhooks = append(j.Webhooks, WebhookSpansJSON{
			Name: w.Name, Type: w.Type, Operation: w.Operation, Calls: w.Calls, WithClient: w.WithClient,
			WithKadmit: w.WithKadmit, Retried: w.Retried, Call: dist(w.Call), Client: dist(w.Client), Kadmit: dist(w.Kadmit),
			Network: dist(w.Network), APIServer: dist(w.APIServer), KadmitShare: w.KadmitShare(), MeetsTarget: w.MeetsSpanTarget(),
		})
		met = met && w.MeetsSpanTarget()
	}
	j.Target.Text, j.Target.Met = SpanTargetText, met
	return j
}
