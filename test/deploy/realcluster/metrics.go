package realcluster

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kadmit/kadmit/test/cluster"
)

// The API server's webhook metrics WebhookMetrics reads.
var webhookMetricNames = []string{
	"apiserver_admission_webhook_rejection_count",
	"apiserver_admission_webhook_request_total",
	"apiserver_admission_webhook_fail_open_count",
}

// WebhookMetrics are the API server's own webhook counters, one value per
// series, keyed `metric{label="value",...}` with labels sorted.
type WebhookMetrics map[string]float64

// ReadWebhookMetrics reads the API server's /metrics and keeps the series
// of webhookMetricNames whose name label ends in nameSuffix (e.g.
// ".kadmit.io"; empty keeps every webhook).
func ReadWebhookMetrics(ctx context.Context, c *cluster.Cluster, nameSuffix string) (WebhookMetrics, error) {
	body, err := c.Client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("realcluster: API server /metrics: %w", err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		return nil, fmt.Errorf("realcluster: parse API server /metrics: %w", err)
	}
	out := WebhookMetrics{}
	for _, name := range webhookMetricNames {
		f, ok := fams[name]
		if !ok {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			if !strings.HasSuffix(labels["name"], nameSuffix) {
				continue
			}
			out[seriesKey(name, labels)] = value(m)
		}
	}
	return out, nil
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Untyped != nil:
		return m.Untyped.GetValue()
	}
	return 0
}

func seriesKey(name string, labels map[string]string) string {
	keys := slices.Sorted(maps.Keys(labels))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%q", k, labels[k])
	}
	return name + "{" + strings.Join(parts, ",") + "}"
}

// Delta returns after minus m for every series that changed (series new in
// after count from 0).
func (m WebhookMetrics) Delta(after WebhookMetrics) WebhookMetrics {
	out := WebhookMetrics{}
	for k, v := range after {
		if d := v - m[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// Sum adds the series of metric whose labels include every pair in match
// (e.g. {"code": "200"}).
func (m WebhookMetrics) Sum(metric string, match map[string]string) float64 {
	var s float64
	for k, v := range m {
		if !strings.HasPrefix(k, metric+"{") {
			continue
		}
		ok := true
		for lk, lv := range match {
			if !strings.Contains(k, fmt.Sprintf("%s=%q", lk, lv)) {
				ok = false
				break
			}
		}
		if ok {
			s += v
		}
	}
	return s
}

// Requests, Rejections and FailOpen sum the three counters over every
// series (use on a Delta); NonOK sums requests answered with a code other
// than 200.
func (m WebhookMetrics) Requests() float64 {
	return m.Sum("apiserver_admission_webhook_request_total", nil)
}
func (m WebhookMetrics) Rejections() float64 {
	return m.Sum("apiserver_admission_webhook_rejection_count", nil)
}
func (m WebhookMetrics) FailOpen() float64 {
	return m.Sum("apiserver_admission_webhook_fail_open_count", nil)
}
func (m WebhookMetrics) NonOK() float64 {
	return m.Requests() - m.Sum("apiserver_admission_webhook_request_total", map[string]string{"code": "200"})
}

// String lists the series sorted, one per line.
func (m WebhookMetrics) String() string {
	keys := slices.Sorted(maps.Keys(m))
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s %g\n", k, m[k])
	}
	return b.String()
}
