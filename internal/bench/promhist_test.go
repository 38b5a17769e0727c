package bench

import (
	"errors"
	"io"
	"math"
	"strings"
	"testing"
)

var inf = math.Inf(+1)

func hist(bounds []float64, counts []float64, sum float64) *promHistogram {
	return &promHistogram{bounds: bounds, counts: counts, sum: sum}
}

// TestBucketQuantileHandComputed checks the interpolation against values
// worked out by hand with histogram_quantile's rule: rank = q·count, find the
// first bucket whose cumulative count reaches the rank, interpolate linearly
// from the previous bound (0 for the first bucket) to its own.
func TestBucketQuantileHandComputed(t *testing.T) {
	apiBounds := []float64{0.005, 0.025, 0.1, 0.5, 1, 2.5, 10, 25, inf}
	cases := []struct {
		name   string
		h      *promHistogram
		q      float64
		want   float64
		wantIn bool
	}{
		// 90 of 100 calls <= 5ms, 9 in (5ms, 25ms], 1 in (25ms, 100ms].
		// p50: rank 50 in the first bucket: 0 + 0.005·50/90.
		{"p50 first bucket", hist(apiBounds, []float64{90, 99, 100, 100, 100, 100, 100, 100, 100}, 0), 0.5, 0.005 * 50 / 90, false},
		// p90: rank 90 is exactly the first bucket's count: its upper bound.
		{"p90 at bound", hist(apiBounds, []float64{90, 99, 100, 100, 100, 100, 100, 100, 100}, 0), 0.9, 0.005, false},
		// p99: rank 99 falls in (5ms, 25ms], 9 of 9 there: 0.005 + 0.020·9/9.
		{"p99 second bucket", hist(apiBounds, []float64{90, 99, 100, 100, 100, 100, 100, 100, 100}, 0), 0.99, 0.025, false},
		// p95: rank 95, 5 of the 9 in the second bucket: 0.005 + 0.020·5/9.
		{"p95 second bucket", hist(apiBounds, []float64{90, 99, 100, 100, 100, 100, 100, 100, 100}, 0), 0.95, 0.005 + 0.020*5/9, false},
		// 6000 calls all <= 5ms: p99 = 0.005·5940/6000 = 4.95ms.
		{"all in lowest bucket", hist(apiBounds, []float64{6000, 6000, 6000, 6000, 6000, 6000, 6000, 6000, 6000}, 0), 0.99, 0.00495, false},
		// 4 calls, 2 above 25s: rank 2 reaches bucket 25s (count 2), rank 3 is in +Inf.
		{"p50 below +Inf", hist(apiBounds, []float64{0, 0, 0, 0, 0, 0, 0, 2, 4}, 0), 0.5, 10 + 15*2.0/2, false},
		{"p99 in +Inf", hist(apiBounds, []float64{0, 0, 0, 0, 0, 0, 0, 2, 4}, 0), 0.99, 25, true},
		// Only the +Inf bucket: PromQL answers the highest finite bound.
		{"only +Inf", hist([]float64{0.005, inf}, []float64{0, 7}, 0), 0.5, 0.005, true},
		// A first bound at or below zero is returned as is.
		{"non-positive first bound", hist([]float64{-1, 1, inf}, []float64{5, 10, 10}, 0), 0.2, -1, false},
		// q = 0: rank 0 is reached by the first bucket: its lower end, 0.
		{"q=0", hist(apiBounds, []float64{3, 3, 3, 3, 3, 3, 3, 3, 3}, 0), 0, 0, false},
		// q = 1: rank 3 reached first by bucket 5ms.
		{"q=1", hist(apiBounds, []float64{3, 3, 3, 3, 3, 3, 3, 3, 3}, 0), 1, 0.005, false},
	}
	for _, c := range cases {
		got, in := bucketQuantile(c.q, c.h)
		if math.Abs(got-c.want) > 1e-12 || in != c.wantIn {
			t.Errorf("%s: bucketQuantile(%v) = %v (inInf %v), want %v (inInf %v)", c.name, c.q, got, in, c.want, c.wantIn)
		}
	}
}

func TestBucketQuantileEdges(t *testing.T) {
	empty := hist([]float64{0.005, inf}, []float64{0, 0}, 0)
	if v, _ := bucketQuantile(0.5, empty); !math.IsNaN(v) {
		t.Errorf("empty histogram: %v, want NaN", v)
	}
	noInf := hist([]float64{0.005, 0.025}, []float64{1, 2}, 0)
	if v, _ := bucketQuantile(0.5, noInf); !math.IsNaN(v) {
		t.Errorf("no +Inf bucket: %v, want NaN", v)
	}
	one := hist([]float64{inf}, []float64{3}, 0)
	if v, _ := bucketQuantile(0.5, one); !math.IsNaN(v) {
		t.Errorf("only +Inf: %v, want NaN (fewer than two buckets)", v)
	}
	h := hist([]float64{0.005, inf}, []float64{1, 1}, 0)
	if v, _ := bucketQuantile(-0.1, h); !math.IsInf(v, -1) {
		t.Errorf("q<0: %v, want -Inf", v)
	}
	if v, _ := bucketQuantile(1.1, h); !math.IsInf(v, +1) {
		t.Errorf("q>1: %v, want +Inf", v)
	}
	if v, _ := bucketQuantile(math.NaN(), h); !math.IsNaN(v) {
		t.Errorf("q NaN: %v, want NaN", v)
	}
}

// TestDeltaQuantile: the quantile of the difference of two scrapes, worked
// by hand. Before: 10 calls <= 5ms, 2 in (5, 25]. After: 60 and 52 more.
// Delta: 50 <= 5ms, 50 in (5, 25]. p50 = rank 50 = end of the first bucket
// = 5ms; p99 = rank 99, 49 of the 50 in (5, 25]: 5 + 20·49/50 = 24.6ms.
func TestDeltaQuantile(t *testing.T) {
	b := []float64{0.005, 0.025, inf}
	before := hist(b, []float64{10, 12, 12}, 0.08)
	after := hist(b, []float64{60, 112, 112}, 1.58)
	d, err := after.sub(before)
	if err != nil {
		t.Fatal(err)
	}
	if d.count() != 100 || math.Abs(d.sum-1.5) > 1e-12 {
		t.Fatalf("delta count %v sum %v, want 100 and 1.5", d.count(), d.sum)
	}
	if v, _ := bucketQuantile(0.5, d); math.Abs(v-0.005) > 1e-12 {
		t.Errorf("p50 = %v, want 0.005", v)
	}
	if v, _ := bucketQuantile(0.99, d); math.Abs(v-0.0246) > 1e-12 {
		t.Errorf("p99 = %v, want 0.0246", v)
	}
	if f := fractionAtOrBelow(d, 0.005); f != 0.5 {
		t.Errorf("fraction <= 5ms = %v, want 0.5", f)
	}
	// The scrapes are untouched.
	if before.counts[0] != 10 || after.counts[0] != 60 {
		t.Errorf("sub modified its operands: %v %v", before.counts, after.counts)
	}
}

func TestDeltaCounterReset(t *testing.T) {
	b := []float64{0.005, inf}
	_, err := hist(b, []float64{1, 2}, 0).sub(hist(b, []float64{5, 5}, 0))
	if !errors.Is(err, ErrCounterReset) {
		t.Errorf("after < before: %v, want ErrCounterReset", err)
	}
	_, err = hist(b, []float64{5, 5}, 0).sub(hist([]float64{0.01, inf}, []float64{1, 1}, 0))
	if err == nil || !strings.Contains(err.Error(), "bounds changed") {
		t.Errorf("different bounds: %v", err)
	}
}

// exposition is what kube-apiserver's /metrics holds for two webhooks (one
// series rejected), plus neighbours the parser must skip, including a family
// whose name starts with the wanted one.
const exposition = `# HELP apiserver_admission_step_admission_duration_seconds [STABLE] Admission sub-step latency
# TYPE apiserver_admission_step_admission_duration_seconds histogram
apiserver_admission_step_admission_duration_seconds_bucket{operation="CREATE",rejected="false",type="admit",le="0.005"} 3
apiserver_admission_step_admission_duration_seconds_bucket{operation="CREATE",rejected="false",type="admit",le="+Inf"} 3
apiserver_admission_step_admission_duration_seconds_sum{operation="CREATE",rejected="false",type="admit"} 0.001
apiserver_admission_step_admission_duration_seconds_count{operation="CREATE",rejected="false",type="admit"} 3
# HELP apiserver_admission_webhook_admission_duration_seconds [STABLE] Admission webhook latency
# TYPE apiserver_admission_webhook_admission_duration_seconds histogram
apiserver_admission_webhook_admission_duration_seconds_bucket{name="lifespan.kadmit.io",operation="CREATE",rejected="false",type="admit",le="0.005"} 95
apiserver_admission_webhook_admission_duration_seconds_bucket{name="lifespan.kadmit.io",operation="CREATE",rejected="false",type="admit",le="0.025"} 100
apiserver_admission_webhook_admission_duration_seconds_bucket{name="lifespan.kadmit.io",operation="CREATE",rejected="false",type="admit",le="0.1"} 100
apiserver_admission_webhook_admission_duration_seconds_bucket{name="lifespan.kadmit.io",operation="CREATE",rejected="false",type="admit",le="+Inf"} 100
apiserver_admission_webhook_admission_duration_seconds_sum{name="lifespan.kadmit.io",operation="CREATE",rejected="false",type="admit"} 0.25
apiserver_admission_webhook_admission_duration_seconds_count{name="lifespan.kadmit.io",operation="CREATE",rejected="false",type="admit"} 100
apiserver_admission_webhook_admission_duration_seconds_bucket{name="pod-name.kadmit.io",operation="CREATE",rejected="false",type="validating",le="0.005"} 98
apiserver_admission_webhook_admission_duration_seconds_bucket{name="pod-name.kadmit.io",operation="CREATE",rejected="false",type="validating",le="0.025"} 98
apiserver_admission_webhook_admission_duration_seconds_bucket{name="pod-name.kadmit.io",operation="CREATE",rejected="false",type="validating",le="0.1"} 98
apiserver_admission_webhook_admission_duration_seconds_bucket{name="pod-name.kadmit.io",operation="CREATE",rejected="false",type="validating",le="+Inf"} 98
apiserver_admission_webhook_admission_duration_seconds_sum{name="pod-name.kadmit.io",operation="CREATE",rejected="false",type="validating"} 0.1
apiserver_admission_webhook_admission_duration_seconds_count{name="pod-name.kadmit.io",operation="CREATE",rejected="false",type="validating"} 98
apiserver_admission_webhook_admission_duration_seconds_bucket{name="pod-name.kadmit.io",operation="CREATE",rejected="true",type="validating",le="0.005"} 1
apiserver_admission_webhook_admission_duration_seconds_bucket{name="pod-name.kadmit.io",operation="CREATE",rejected="true",type="validating",le="0.025"} 2
apiserver_admission_webhook_admission_duration_seconds_bucket{name="pod-name.kadmit.io",operation="CREATE",rejected="true",type="validating",le="0.1"} 2
apiserver_admission_webhook_admission_duration_seconds_bucket{name="pod-name.kadmit.io",operation="CREATE",rejected="true",type="validating",le="+Inf"} 2
apiserver_admission_webhook_admission_duration_seconds_sum{name="pod-name.kadmit.io",operation="CREATE",rejected="true",type="validating"} 0.02
apiserver_admission_webhook_admission_duration_seconds_count{name="pod-name.kadmit.io",operation="CREATE",rejected="true",type="validating"} 2
# HELP apiserver_admission_webhook_admission_duration_seconds_extra not ours
# TYPE apiserver_admission_webhook_admission_duration_seconds_extra gauge
apiserver_admission_webhook_admission_duration_seconds_extra 7
# HELP apiserver_admission_webhook_rejection_count [ALPHA] Admission webhook rejection count
# TYPE apiserver_admission_webhook_rejection_count counter
apiserver_admission_webhook_rejection_count{error_type="no_error",name="pod-name.kadmit.io",operation="CREATE",rejection_code="403",type="validating"} 1
apiserver_admission_webhook_rejection_count{error_type="calling_webhook_error",name="pod-name.kadmit.io",operation="CREATE",rejection_code="0",type="validating"} 1
# HELP apiserver_request_total [STABLE] Counter of apiserver requests
# TYPE apiserver_request_total counter
apiserver_request_total{code="201",verb="POST"} 12
`

func TestParseWebhookMetrics(t *testing.T) {
	m, err := parseWebhookMetrics(strings.NewReader(exposition))
	if err != nil {
		t.Fatal(err)
	}
	if len(m.durations) != 3 {
		t.Fatalf("%d series, want 3: %+v", len(m.durations), m.durations)
	}
	h := m.durations[seriesKey{"lifespan.kadmit.io", "admit", "CREATE", "false"}]
	if h == nil {
		t.Fatal("lifespan series missing")
	}
	wantB := []float64{0.005, 0.025, 0.1, inf}
	wantC := []float64{95, 100, 100, 100}
	for i := range wantB {
		if h.bounds[i] != wantB[i] || h.counts[i] != wantC[i] {
			t.Fatalf("lifespan buckets %v %v, want %v %v", h.bounds, h.counts, wantB, wantC)
		}
	}
	if h.sum != 0.25 {
		t.Errorf("sum %v", h.sum)
	}
	if got := m.rejections[rejectionKey{"pod-name.kadmit.io", "validating", "CREATE", "no_error"}]; got != 1 {
		t.Errorf("rejections no_error = %v, want 1", got)
	}

	// Delta against an empty first scrape, grouped over rejected.
	ws, err := deltaWebhooks(&webhookMetrics{}, m)
	if err != nil {
		t.Fatal(err)
	}
	if len(ws) != 2 || ws[0].name != "lifespan.kadmit.io" || ws[1].name != "pod-name.kadmit.io" {
		t.Fatalf("webhooks %+v", ws)
	}
	pn := ws[1]
	if pn.hist.count() != 100 || pn.rejected != 2 || pn.hist.counts[0] != 99 {
		t.Errorf("pod-name: count %v rejected %v first bucket %v, want 100, 2, 99", pn.hist.count(), pn.rejected, pn.hist.counts[0])
	}
	if pn.rejections["no_error"] != 1 || pn.rejections["calling_webhook_error"] != 1 {
		t.Errorf("pod-name rejections %v", pn.rejections)
	}
	// Same scrape twice: nothing happened in between, nothing reported.
	ws, err = deltaWebhooks(m, m)
	if err != nil || len(ws) != 0 {
		t.Errorf("no change: %v %+v", err, ws)
	}
}

func TestParseWebhookMetricsBounds(t *testing.T) {
	// A line longer than the bound is an error, not an unbounded buffer.
	long := "# HELP x " + strings.Repeat("a", maxMetricsLine+10) + "\n"
	if _, err := parseWebhookMetrics(strings.NewReader(long)); err == nil {
		t.Error("over-long line accepted")
	}
	// More than MaxMetricsBytes is refused.
	r := &repeatReader{line: []byte("other_metric 1\n"), left: MaxMetricsBytes + 100}
	if _, err := parseWebhookMetrics(r); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Errorf("over-long exposition: %v", err)
	}
	// Not a histogram.
	bad := "# TYPE " + WebhookDurationMetric + " gauge\n" + WebhookDurationMetric + " 3\n"
	if _, err := parseWebhookMetrics(strings.NewReader(bad)); err == nil {
		t.Error("gauge accepted as the webhook histogram")
	}
}

// repeatReader yields line over and over, left bytes in all.
type repeatReader struct {
	line []byte
	left int
	off  int
}

func (r *repeatReader) Read(p []byte) (int, error) {
	if r.left <= 0 {
		return 0, io.EOF
	}
	n := 0
	for n < len(p) && r.left > 0 {
		c := copy(p[n:], r.line[r.off:])
		c = min(c, r.left)
		n += c
		r.left -= c
		r.off = (r.off + c) % len(r.line)
	}
	return n, nil
}
