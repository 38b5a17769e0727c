package bench

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The API server's admission webhook metrics that --through-apiserver reads,
// as k8s.io/apiserver v0.37.1 pkg/admission/metrics/metrics.go defines them
// (lines 179-203): a histogram with labels name, type, operation, rejected and
// buckets 5ms, 25ms, 100ms, 500ms, 1s, 2.5s, 10s, 25s, and a counter of
// rejections with labels name, type, operation, error_type, rejection_code.
const (
	WebhookDurationMetric  = "apiserver_admission_webhook_admission_duration_seconds"
	WebhookRejectionMetric = "apiserver_admission_webhook_rejection_count"
)

// Bounds on what one /metrics scrape may hold, so a huge or hostile answer
// costs bounded memory: the bytes read, the length of one line, and the series
// kept per family (a series per webhook × type × operation × rejected, or ×
// error_type × rejection_code for the counter).
const (
	MaxMetricsBytes   = 64 << 20
	maxMetricsLine    = 1 << 20
	maxWebhookSeries  = 4096
	maxHistogramBound = 64
)

// ErrCounterReset is wrapped when a counter or histogram went down between the
// two scrapes: the API server restarted (or another replica answered), so the
// delta means nothing.
var ErrCounterReset = errors.New("API server metrics went backwards between scrapes (API server restarted, or another replica answered)")

// seriesKey identifies one series of the webhook duration histogram.
type seriesKey struct{ name, typ, operation, rejected string }

// rejectionKey identifies one series of the rejection counter, summed over
// rejection_code.
type rejectionKey struct{ name, typ, operation, errorType string }

// promHistogram is one classic Prometheus histogram: cumulative counts per
// upper bound, ascending, the last bound +Inf.
type promHistogram struct {
	bounds []float64
	counts []float64
	sum    float64
}

// count is the number of observations (the +Inf bucket).
func (h *promHistogram) count() float64 {
	if len(h.counts) == 0 {
		return 0
	}
	return h.counts[len(h.counts)-1]
}

// webhookMetrics is what one scrape says about admission webhooks.
type webhookMetrics struct {
	durations  map[seriesKey]*promHistogram
	rejections map[rejectionKey]float64
}

// wantedFamily reports whether a line of the text exposition format belongs to
// one of the two families read; everything else is skipped before parsing.
func wantedFamily(line []byte) bool {
	if bytes.HasPrefix(line, []byte("# HELP ")) || bytes.HasPrefix(line, []byte("# TYPE ")) {
		line = line[len("# HELP "):]
	}
	for _, fam := range [...]string{WebhookDurationMetric, WebhookRejectionMetric} {
		if rest, ok := bytes.CutPrefix(line, []byte(fam)); ok {
			if len(rest) == 0 || rest[0] == ' ' || rest[0] == '{' || rest[0] == '_' {
				return true
			}
		}
	}
	return false
}

// parseWebhookMetrics reads a Prometheus text exposition (at most
// MaxMetricsBytes, lines up to 1 MiB) and returns the webhook duration
// histograms and rejection counters in it, parsed with
// github.com/prometheus/common/expfmt after the lines of every other family
// are dropped. Families absent from the input give empty maps: the API server
// creates a series on its first observation.
func parseWebhookMetrics(r io.Reader) (*webhookMetrics, error) {
	lr := &io.LimitedReader{R: r, N: MaxMetricsBytes + 1}
	sc := bufio.NewScanner(lr)
	sc.Buffer(make([]byte, 0, 64<<10), maxMetricsLine)
	var kept bytes.Buffer
	for sc.Scan() {
		if line := sc.Bytes(); wantedFamily(line) {
			kept.Write(line)
			kept.WriteByte('\n')
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read metrics: %w", err)
	}
	if lr.N <= 0 {
		return nil, fmt.Errorf("read metrics: more than %d bytes", MaxMetricsBytes)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(&kept)
	if err != nil {
		return nil, fmt.Errorf("parse metrics: %w", err)
	}
	out := &webhookMetrics{durations: map[seriesKey]*promHistogram{}, rejections: map[rejectionKey]float64{}}
	if mf := fams[WebhookDurationMetric]; mf != nil {
		if mf.GetType() != dto.MetricType_HISTOGRAM {
			return nil, fmt.Errorf("parse metrics: %s is a %s, want a histogram", WebhookDurationMetric, mf.GetType())
		}
		if len(mf.GetMetric()) > maxWebhookSeries {
			return nil, fmt.Errorf("parse metrics: %s has %d series, more than %d", WebhookDurationMetric, len(mf.GetMetric()), maxWebhookSeries)
		}
		for _, m := range mf.GetMetric() {
			l := labelMap(m)
			k := seriesKey{l["name"], l["type"], l["operation"], l["rejected"]}
			h, err := histogramOf(m.GetHistogram())
			if err != nil {
				return nil, fmt.Errorf("parse metrics: %s{name=%q}: %w", WebhookDurationMetric, k.name, err)
			}
			if _, dup := out.durations[k]; dup {
				return nil, fmt.Errorf("parse metrics: %s: duplicate series %+v", WebhookDurationMetric, k)
			}
			out.durations[k] = h
		}
	}
	if mf := fams[WebhookRejectionMetric]; mf != nil {
		if len(mf.GetMetric()) > maxWebhookSeries {
			return nil, fmt.Errorf("parse metrics: %s has %d series, more than %d", WebhookRejectionMetric, len(mf.GetMetric()), maxWebhookSeries)
		}
		for _, m := range mf.GetMetric() {
			l := labelMap(m)
			v := m.GetCounter().GetValue()
			if m.GetCounter() == nil {
				v = m.GetUntyped().GetValue()
			}
			out.rejections[rejectionKey{l["name"], l["type"], l["operation"], l["error_type"]}] += v
		}
	}
	return out, nil
}

func labelMap(m *dto.Metric) map[string]string {
	l := make(map[string]string, len(m.GetLabel()))
	for _, p := range m.GetLabel() {
		l[p.GetName()] = p.GetValue()
	}
	return l
}

// histogramOf converts a parsed classic histogram, adding the +Inf bucket
// (the sample count) when the parser kept it apart.
func histogramOf(d *dto.Histogram) (*promHistogram, error) {
	if d == nil {
		return nil, errors.New("not a histogram sample")
	}
	bs := d.GetBucket()
	if len(bs) > maxHistogramBound {
		return nil, fmt.Errorf("%d buckets, more than %d", len(bs), maxHistogramBound)
	}
	h := &promHistogram{sum: d.GetSampleSum()}
	for _, b := range bs {
		c := float64(b.GetCumulativeCount())
		if b.CumulativeCountFloat != nil {
			c = b.GetCumulativeCountFloat()
		}
		h.bounds = append(h.bounds, b.GetUpperBound())
		h.counts = append(h.counts, c)
	}
	total := float64(d.GetSampleCount())
	if d.SampleCountFloat != nil {
		total = d.GetSampleCountFloat()
	}
	if n := len(h.bounds); n == 0 || !math.IsInf(h.bounds[n-1], +1) {
		h.bounds = append(h.bounds, math.Inf(+1))
		h.counts = append(h.counts, total)
	}
	if !sort.Float64sAreSorted(h.bounds) {
		return nil, errors.New("bucket bounds not ascending")
	}
	return h, nil
}

// sub returns h minus before, bucket by bucket; before nil means zero. It
// fails when the bounds differ or any count went down (wrapping
// ErrCounterReset).
func (h *promHistogram) sub(before *promHistogram) (*promHistogram, error) {
	d := &promHistogram{bounds: slices.Clone(h.bounds), counts: slices.Clone(h.counts), sum: h.sum}
	if before == nil {
		return d, nil
	}
	if !slices.Equal(h.bounds, before.bounds) {
		return nil, fmt.Errorf("bucket bounds changed between scrapes: %v, then %v", before.bounds, h.bounds)
	}
	for i := range d.counts {
		d.counts[i] -= before.counts[i]
		if d.counts[i] < 0 {
			return nil, ErrCounterReset
		}
	}
	d.sum -= before.sum
	return d, nil
}

// add adds o's counts to h; the bounds must be equal.
func (h *promHistogram) add(o *promHistogram) error {
	if len(h.bounds) == 0 {
		h.bounds, h.counts = slices.Clone(o.bounds), make([]float64, len(o.counts))
	}
	if !slices.Equal(h.bounds, o.bounds) {
		return fmt.Errorf("series with different bucket bounds: %v and %v", h.bounds, o.bounds)
	}
	for i := range h.counts {
		h.counts[i] += o.counts[i]
	}
	h.sum += o.sum
	return nil
}

// bucketQuantile returns the q-quantile (0..1) of a classic histogram the way
// PromQL's histogram_quantile does (prometheus/prometheus v3.14.0
// promql/quantile.go:105-170, BucketQuantile): find the bucket in which the
// rank q·count falls and interpolate linearly inside it, assuming the
// observations are spread evenly between its lower bound (0 for the first
// bucket) and its upper bound. When the rank falls in the +Inf bucket the
// answer is the highest finite upper bound and inInf is true. NaN when the
// histogram is empty or has no finite bucket; -Inf/+Inf for q < 0 / q > 1, as
// PromQL. h's counts are assumed monotonic (a delta of two scrapes of one
// counter is; sub checks it), so PromQL's monotonicity repair is not needed.
//
// The result is an estimate at the bucket's grain, not a measured value: with
// the API server's 5 ms first bucket, any p99 in (0, 5ms] only says "at most
// 5 ms".
func bucketQuantile(q float64, h *promHistogram) (v float64, inInf bool) {
	switch {
	case math.IsNaN(q):
		return math.NaN(), false
	case q < 0:
		return math.Inf(-1), false
	case q > 1:
		return math.Inf(+1), false
	}
	n := len(h.bounds)
	if n < 2 || !math.IsInf(h.bounds[n-1], +1) {
		return math.NaN(), false
	}
	observations := h.counts[n-1]
	if observations == 0 {
		return math.NaN(), false
	}
	rank := q * observations
	b := sort.Search(n-1, func(i int) bool { return h.counts[i] >= rank })
	switch {
	case b == n-1:
		return h.bounds[n-2], true
	case b == 0 && h.bounds[0] <= 0:
		return h.bounds[0], false
	}
	start, end, count := 0.0, h.bounds[b], h.counts[b]
	if b > 0 {
		start = h.bounds[b-1]
		count -= h.counts[b-1]
		rank -= h.counts[b-1]
	}
	return start + (end-start)*(rank/count), false
}

// fractionAtOrBelow returns the share (0..1) of observations in buckets with
// an upper bound at or below le; NaN when empty.
func fractionAtOrBelow(h *promHistogram, le float64) float64 {
	total := h.count()
	if total == 0 {
		return math.NaN()
	}
	var c float64
	for i, b := range h.bounds {
		if b <= le {
			c = h.counts[i]
		}
	}
	return c / total
}

// webhookDelta is the activity of one webhook (name, type, operation) between
// two scrapes: its duration histogram summed over the rejected label, the
// calls that were rejected, and rejections by error_type.
type webhookDelta struct {
	name, typ, operation string
	hist                 *promHistogram
	rejected             float64
	rejections           map[string]float64
}

// deltaWebhooks subtracts before from after and groups by (name, type,
// operation), dropping webhooks with no calls in between. Sorted by type
// (admit before validating, the order the API server calls them), then name.
func deltaWebhooks(before, after *webhookMetrics) ([]webhookDelta, error) {
	type gk struct{ name, typ, op string }
	groups := map[gk]*webhookDelta{}
	for k, h := range after.durations {
		d, err := h.sub(before.durations[k])
		if err != nil {
			return nil, fmt.Errorf("%s{name=%q}: %w", WebhookDurationMetric, k.name, err)
		}
		if d.count() == 0 {
			continue
		}
		g := gk{k.name, k.typ, k.operation}
		w := groups[g]
		if w == nil {
			w = &webhookDelta{name: k.name, typ: k.typ, operation: k.operation, hist: &promHistogram{}, rejections: map[string]float64{}}
			groups[g] = w
		}
		if err := w.hist.add(d); err != nil {
			return nil, fmt.Errorf("%s{name=%q}: %w", WebhookDurationMetric, k.name, err)
		}
		if k.rejected == "true" {
			w.rejected += d.count()
		}
	}
	for k, v := range after.rejections {
		d := v - before.rejections[k]
		if d < 0 {
			return nil, fmt.Errorf("%s{name=%q}: %w", WebhookRejectionMetric, k.name, ErrCounterReset)
		}
		if w := groups[gk{k.name, k.typ, k.operation}]; w != nil && d > 0 {
			w.rejections[k.errorType] += d
		}
	}
	out := make([]webhookDelta, 0, len(groups))
	for _, w := range groups {
		out = append(out, *w)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.typ != b.typ {
			return a.typ < b.typ // "admit" < "validate"
		}
		if a.name != b.name {
			return a.name < b.name
		}
		return strings.Compare(a.operation, b.operation) < 0
	})
	return out, nil
}
