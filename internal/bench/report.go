package bench

import (
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"time"
)

// Report is the outcome of Run. Latency figures cover only the requests
// answered correctly (Requests minus ErrorCount()): a refused connection
// is fast and would flatter them.
type Report struct {
	URL        string
	HTTP2      bool   // HTTP/2 was asked for
	Protocol   string // as answered, e.g. "HTTP/1.1"; empty when no request got HTTP 200
	APIVersion string // AdmissionReview apiVersion sent
	Operation  string
	Kind       string // kind of the object under review
	BodyBytes  int    // size of each request body

	Concurrency int
	Requests    int64            // completed requests, errors included
	Errors      map[string]int64 // by kind (the Kind* constants); only kinds that occurred
	Allowed     int64            // correct answers that allowed
	Denied      int64            // correct answers that denied
	Patched     int64            // correct answers that carried a patch
	// Connections counts the TCP connections opened. At most Concurrency
	// are open at once, but more may be opened in all: the server may close
	// kept-alive connections, and net/http retires one whose request write
	// it has not seen finish within 50ms of the answer (a starved CPU).
	Connections int64
	Duration    time.Duration // from the first request sent to the last answer
	StoppedBy   string        // "requests", "duration" or "interrupted"

	hist *histogram
}

// ErrorCount returns the number of failed requests.
func (r *Report) ErrorCount() int64 {
	var n int64
	for _, c := range r.Errors {
		n += c
	}
	return n
}

// Throughput returns completed requests (errors included) per second.
func (r *Report) Throughput() float64 {
	if r.Duration <= 0 {
		return 0
	}
	return float64(r.Requests) / r.Duration.Seconds()
}

// Latency returns the latency at quantile q (0..1) of correct answers, within
// 0.4% of the exact value; 0 when there were none.
func (r *Report) Latency(q float64) time.Duration { return r.hist.quantile(q) }

// quantiles printed in every report.
var quantiles = []struct {
	name string
	q    float64
}{{"p50", 0.50}, {"p90", 0.90}, {"p99", 0.99}, {"p99.9", 0.999}}

// WriteText writes a human-readable report: a summary, then the latency
// histogram as text bars (log-spaced latency bins, bar length linear in count).
func (r *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	proto := r.Protocol
	if proto == "" {
		proto = map[bool]string{false: "HTTP/1.1", true: "HTTP/2"}[r.HTTP2] + " (no answer)"
	}
	ok := r.Requests - r.ErrorCount()
	fmt.Fprintf(&b, "kadmit bench %s\n", r.URL)
	fmt.Fprintf(&b, "  target      %s, %s %s %s, %d-byte requests\n", proto, r.APIVersion, r.Operation, r.Kind, r.BodyBytes)
	ended := map[string]string{"requests": "ended by -n", "duration": "ended by -d", "interrupted": "interrupted"}[r.StoppedBy]
	fmt.Fprintf(&b, "  load        %d concurrent, %d connections, ran %s, %s\n", r.Concurrency, r.Connections, r.Duration.Round(time.Millisecond), ended)
	fmt.Fprintf(&b, "  requests    %d (%d ok: %d allowed, %d denied, %d patched)\n", r.Requests, ok, r.Allowed, r.Denied, r.Patched)
	fmt.Fprintf(&b, "  errors      %d%s\n", r.ErrorCount(), r.errorList())
	fmt.Fprintf(&b, "  throughput  %.1f req/s\n", r.Throughput())
	if ok > 0 {
		fmt.Fprintf(&b, "  latency    ")
		for _, q := range quantiles {
			fmt.Fprintf(&b, " %s %s ", q.name, fmtDur(r.Latency(q.q)))
		}
		fmt.Fprintf(&b, " max %s  mean %s\n", fmtDur(time.Duration(r.hist.max)), fmtDur(r.hist.mean()))
		fmt.Fprintf(&b, "\nlatency histogram (%d correct answers)\n", ok)
		bins := r.hist.bins(20)
		var peak uint64
		for _, bn := range bins {
			peak = max(peak, bn.Count)
		}
		var cum uint64
		for _, bn := range bins {
			cum += bn.Count
			bar := int(math.Round(40 * float64(bn.Count) / float64(peak)))
			if bn.Count > 0 {
				bar = max(bar, 1)
			}
			fmt.Fprintf(&b, "  %9s - %-9s %-40s %9d  %6.2f%%\n", fmtDur(bn.Lo), fmtDur(bn.Hi), strings.Repeat("#", bar), bn.Count, 100*float64(cum)/float64(r.hist.n))
		}
	}
	_, err := io.WriteString(w, b.String())
	if err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	return nil
}

// errorList renders the non-zero error kinds, largest first, e.g.
// ": http_5xx 40, timeout 2".
func (r *Report) errorList() string {
	if len(r.Errors) == 0 {
		return ""
	}
	kinds := make([]string, 0, len(r.Errors))
	for k := range r.Errors {
		kinds = append(kinds, k)
	}
	sort.Slice(kinds, func(i, j int) bool {
		if r.Errors[kinds[i]] != r.Errors[kinds[j]] {
			return r.Errors[kinds[i]] > r.Errors[kinds[j]]
		}
		return kinds[i] < kinds[j]
	})
	parts := make([]string, len(kinds))
	for i, k := range kinds {
		parts[i] = fmt.Sprintf("%s %d", k, r.Errors[k])
	}
	return ": " + strings.Join(parts, ", ")
}

// fmtDur renders d with 3 significant digits in µs, ms or s.
func fmtDur(d time.Duration) string {
	switch {
	case d < time.Millisecond:
		return trimNum(float64(d)/1e3) + "µs"
	case d < time.Second:
		return trimNum(float64(d)/1e6) + "ms"
	default:
		return trimNum(d.Seconds()) + "s"
	}
}

func trimNum(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

// jsonReport is the -o json shape. Durations are float seconds or
// milliseconds, as the field names say.
type jsonReport struct {
	URL             string           `json:"url"`
	HTTP2           bool             `json:"http2"`
	Protocol        string           `json:"protocol"`
	APIVersion      string           `json:"api_version"`
	Operation       string           `json:"operation"`
	Kind            string           `json:"kind"`
	BodyBytes       int              `json:"body_bytes"`
	Concurrency     int              `json:"concurrency"`
	Connections     int64            `json:"connections"`
	Requests        int64            `json:"requests"`
	Errors          map[string]int64 `json:"errors"`
	Allowed         int64            `json:"allowed"`
	Denied          int64            `json:"denied"`
	Patched         int64            `json:"patched"`
	DurationSeconds float64          `json:"duration_seconds"`
	ThroughputRPS   float64          `json:"throughput_rps"`
	StoppedBy       string           `json:"stopped_by"`
	LatencyMS       struct {
		P50  float64 `json:"p50"`
		P90  float64 `json:"p90"`
		P99  float64 `json:"p99"`
		P999 float64 `json:"p999"`
		Max  float64 `json:"max"`
		Mean float64 `json:"mean"`
	} `json:"latency_ms"`
}

// WriteJSON writes the report as one JSON object and a newline: url, http2,
// protocol, api_version, operation, kind, body_bytes, concurrency,
// connections, requests, errors (kind → count, only kinds that occurred),
// allowed, denied, patched, duration_seconds, throughput_rps, stopped_by and
// latency_ms {p50, p90, p99, p999, max, mean} in milliseconds (all 0 when no
// answer was correct).
func (r *Report) WriteJSON(w io.Writer) error {
	errs := r.Errors
	if errs == nil {
		errs = map[string]int64{}
	}
	j := jsonReport{
		URL: r.URL, HTTP2: r.HTTP2, Protocol: r.Protocol, APIVersion: r.APIVersion,
		Operation: r.Operation, Kind: r.Kind, BodyBytes: r.BodyBytes,
		Concurrency: r.Concurrency, Connections: r.Connections, Requests: r.Requests,
		Errors: errs, Allowed: r.Allowed, Denied: r.Denied, Patched: r.Patched,
		DurationSeconds: r.Duration.Seconds(), ThroughputRPS: r.Throughput(), StoppedBy: r.StoppedBy,
	}
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	j.LatencyMS.P50, j.LatencyMS.P90 = ms(r.Latency(0.5)), ms(r.Latency(0.9))
	j.LatencyMS.P99, j.LatencyMS.P999 = ms(r.Latency(0.99)), ms(r.Latency(0.999))
	j.LatencyMS.Max, j.LatencyMS.Mean = ms(time.Duration(r.hist.max)), ms(r.hist.mean())
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(j); err != nil {
		return fmt.Errorf("write JSON report: %w", err)
	}
	return nil
}

// SVG geometry, in px.
const (
	svgW, svgH             = 900, 420
	plotX0, plotY0         = 80, 50   // top-left corner of the plot area
	plotX1, plotY1         = 870, 360 // bottom-right corner
	svgBins                = 40
	svgFont                = `font-family="sans-serif" font-size="12"`
	svgMarkerColor, svgBar = "#c0392b", "#2e86c1"
)

// WriteSVG writes the latency histogram of correct answers as a standalone
// SVG image: log-spaced latency bins on the x axis, bar heights on a log
// count axis (so a tail of a few requests stays visible), with p50, p99 and
// p99.9 marked. With no correct answers it draws the axes and says so.
func (r *Report) WriteSVG(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, `<?xml version="1.0" encoding="UTF-8"?>`+"\n")
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d">`+"\n", svgW, svgH, svgW, svgH)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", svgW, svgH)
	title := fmt.Sprintf("kadmit bench %s: %d requests, %d errors, %.0f req/s, c=%d", r.URL, r.Requests, r.ErrorCount(), r.Throughput(), r.Concurrency)
	fmt.Fprintf(&b, `<text x="%d" y="24" font-family="sans-serif" font-size="14">%s</text>`+"\n", plotX0, xmlText(title))
	// Axes.
	fmt.Fprintf(&b, `<path d="M%d %d V%d H%d" stroke="black" fill="none"/>`+"\n", plotX0, plotY0, plotY1, plotX1)
	fmt.Fprintf(&b, `<text x="%d" y="%d" %s text-anchor="middle">latency (log scale)</text>`+"\n", (plotX0+plotX1)/2, svgH-12, svgFont)
	fmt.Fprintf(&b, `<text transform="translate(20 %d) rotate(-90)" %s text-anchor="middle">requests (log scale)</text>`+"\n", (plotY0+plotY1)/2, svgFont)

	bins := r.hist.bins(svgBins)
	if len(bins) == 0 {
		fmt.Fprintf(&b, `<text x="%d" y="%d" %s text-anchor="middle">no correct answers</text>`+"\n", (plotX0+plotX1)/2, (plotY0+plotY1)/2, svgFont)
		b.WriteString("</svg>\n")
		return writeAll(w, b.String())
	}
	var peak uint64
	for _, bn := range bins {
		peak = max(peak, bn.Count)
	}
	// y: log10(count+1), so 0 sits on the axis and a single request shows;
	// the top is the first power of ten at or above the peak.
	decades := math.Ceil(math.Log10(float64(peak) + 1))
	top := math.Log10(math.Pow(10, decades) + 1)
	yOf := func(c float64) float64 {
		return plotY1 - (plotY1-plotY0)*math.Log10(c+1)/top
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" %s text-anchor="end">0</text>`+"\n", plotX0-6, plotY1+4, svgFont)
	for d := 0.0; d <= decades; d++ {
		c := math.Pow(10, d)
		y := yOf(c)
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", plotX0, plotX1, y, y)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" %s text-anchor="end">%.0f</text>`+"\n", plotX0-6, y+4, svgFont, c)
	}
	barW := float64(plotX1-plotX0) / float64(len(bins))
	for i, bn := range bins {
		x := plotX0 + barW*float64(i)
		if bn.Count > 0 {
			y := yOf(float64(bn.Count))
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s - %s: %d</title></rect>`+"\n",
				x+1, y, barW-2, plotY1-y, svgBar, xmlText(fmtDur(bn.Lo)), xmlText(fmtDur(bn.Hi)), bn.Count)
		}
		if i%5 == 0 || i == len(bins)-1 {
			edge, ex := bn.Lo, x
			if i == len(bins)-1 {
				edge, ex = bn.Hi, x+barW
			}
			fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="black"/>`+"\n", ex, ex, plotY1, plotY1+5)
			fmt.Fprintf(&b, `<text x="%.1f" y="%d" %s text-anchor="middle">%s</text>`+"\n", ex, plotY1+20, svgFont, xmlText(fmtDur(edge)))
		}
	}
	// Percentile markers, placed on the same log axis as the bins.
	lo, hi := float64(max(bins[0].Lo, 1)), float64(max(bins[len(bins)-1].Hi, 1))
	for i, q := range []struct {
		name string
		q    float64
	}{{"p50", 0.5}, {"p99", 0.99}, {"p99.9", 0.999}} {
		v := float64(max(r.Latency(q.q), 1))
		x := float64(plotX0)
		if hi > lo {
			x += float64(plotX1-plotX0) * math.Log(v/lo) / math.Log(hi/lo)
		}
		x = math.Min(math.Max(x, plotX0), plotX1)
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="%s" stroke-dasharray="4 3"/>`+"\n", x, x, plotY0, plotY1, svgMarkerColor)
		// Labels are staggered: p99 and p99.9 are often a few px apart.
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" %s fill="%s">%s %s</text>`+"\n", x+3, plotY0+14+16*i, svgFont, svgMarkerColor, q.name, xmlText(fmtDur(time.Duration(v))))
	}
	b.WriteString("</svg>\n")
	return writeAll(w, b.String())
}

func writeAll(w io.Writer, s string) error {
	if _, err := io.WriteString(w, s); err != nil {
		return fmt.Errorf("write SVG: %w", err)
	}
	return nil
}

func xmlText(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}
