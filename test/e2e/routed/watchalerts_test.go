package routed

// The alert expressions of the chart's PrometheusRule (group kadmit-watch),
// evaluated by Prometheus's own PromQL engine over the scrapes of the
// watch's /metrics, stored as Prometheus stores them: one sample per series
// per scrape at the scrape's time, and a staleness marker when a series
// disappears from a scrape (so a deleted webhook's series end at once
// instead of lingering for the 5-minute lookback).
//
// The engine (github.com/prometheus/prometheus/promql) runs on a small
// in-memory storage.Queryable here rather than on promqltest/teststorage:
// those pull in Prometheus's TSDB and, through it, the cloud SDKs of its
// service discovery (about 400 more packages to compile cold), the engine
// alone about 50.

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/value"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/chunks"
	"github.com/prometheus/prometheus/util/annotations"
	"sigs.k8s.io/yaml"
)

// alertRule is one alerting rule: its name and PromQL expression.
type alertRule struct {
	name, expr string
}

// rulesFile holds the chart's kadmit-watch alert group as `make manifests`
// renders it (release kadmit, namespace kadmit-system).
const rulesFile = "deploy/prometheus/kadmit-watch-rules.yaml"

// alertGroup is the rule group of the watch's alerts.
const alertGroup = "kadmit-watch"

// loadAlertRules reads the group kadmit-watch from rulesFile (a
// PrometheusRule, or a plain Prometheus rule file).
func loadAlertRules(t *testing.T, e *env) []alertRule {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(e.RepoRoot, rulesFile))
	if err != nil {
		t.Fatal(err)
	}
	rules, err := parseAlertRules(data)
	if err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	if len(rules) == 0 {
		t.Fatalf("%s has no alerting rule in group %s", rulesFile, alertGroup)
	}
	t.Logf("alert expressions from %s (group %s): %d rules", rulesFile, alertGroup, len(rules))
	return rules
}

// parseAlertRules returns the alerting rules of group alertGroup in one or
// more YAML documents, each a PrometheusRule (spec.groups) or a Prometheus
// rule file (groups).
func parseAlertRules(data []byte) ([]alertRule, error) {
	type group struct {
		Name  string `json:"name"`
		Rules []struct {
			Alert string `json:"alert"`
			Expr  string `json:"expr"`
		} `json:"rules"`
	}
	var out []alertRule
	for _, doc := range strings.Split("\n"+string(data), "\n---") {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		var f struct {
			Groups []group `json:"groups"`
			Spec   struct {
				Groups []group `json:"groups"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal([]byte(doc), &f); err != nil {
			return nil, err
		}
		for _, g := range append(f.Groups, f.Spec.Groups...) {
			if g.Name != alertGroup {
				continue
			}
			for _, r := range g.Rules {
				if r.Alert != "" {
					out = append(out, alertRule{r.Alert, strings.TrimSpace(r.Expr)})
				}
			}
		}
	}
	return out, nil
}

// alertEvaluator holds the scraped samples and evaluates expressions over
// them at a given time.
type alertEvaluator struct {
	rules  []alertRule
	engine *promql.Engine
	// target are the labels Prometheus attaches to every scraped series
	// (Prometheus Operator's ServiceMonitor: job, instance, namespace, pod,
	// service, container, endpoint); the rules join and select on namespace.
	target map[string]string

	mu      sync.Mutex
	series  map[string]*memSeries // by labels.Labels.String()
	lastAt  int64                 // ms of the last scrape added
	scraped map[string]bool       // series present in the last scrape
}

type memSeries struct {
	lset    labels.Labels
	samples []fsample
}

// maxSamplesPerSeries bounds the samples kept per series (about 10 minutes
// of scrapes, the longest range the rules use); older ones are dropped.
const maxSamplesPerSeries = maxScrapes

func newAlertEvaluator(t *testing.T, rules []alertRule, target map[string]string) *alertEvaluator {
	t.Helper()
	a := &alertEvaluator{rules: rules, target: target, series: map[string]*memSeries{}, scraped: map[string]bool{},
		engine: promql.NewEngine(promql.EngineOpts{MaxSamples: 5_000_000, Timeout: 10 * time.Second, LookbackDelta: 5 * time.Minute})}
	for _, r := range rules {
		if _, err := a.eval(r.expr, time.Now()); err != nil {
			t.Fatalf("alert %s: %v", r.name, err)
		}
	}
	return a
}

// add stores one scrape (failed scrapes are skipped: Prometheus would mark
// every series stale, which the rules' `absent` would then see as the watch
// being down; a scrape error here fails the test elsewhere).
func (a *alertEvaluator) add(sc *scrape) {
	if sc.err != nil {
		return
	}
	ts := sc.at.UnixMilli()
	a.mu.Lock()
	defer a.mu.Unlock()
	if ts <= a.lastAt {
		return
	}
	now := map[string]bool{}
	for _, s := range sc.series {
		b := labels.NewBuilder(labels.EmptyLabels())
		b.Set(labels.MetricName, s.name)
		for k, v := range s.labels {
			// honor_labels false (the ServiceMonitor default): an exposed
			// label that clashes with a target label is kept as exported_<name>.
			if _, clash := a.target[k]; clash {
				k = "exported_" + k
			}
			b.Set(k, v)
		}
		for k, v := range a.target {
			b.Set(k, v)
		}
		lset := b.Labels()
		key := lset.String()
		ms := a.series[key]
		if ms == nil {
			ms = &memSeries{lset: lset}
			a.series[key] = ms
		}
		ms.append(fsample{ts, s.value})
		now[key] = true
	}
	// Staleness markers, as Prometheus's scrape loop writes them for the
	// series a scrape no longer returns.
	for key := range a.scraped {
		if !now[key] {
			a.series[key].append(fsample{ts, math.Float64frombits(value.StaleNaN)})
		}
	}
	a.scraped, a.lastAt = now, ts
}

func (m *memSeries) append(s fsample) {
	m.samples = append(m.samples, s)
	if n := len(m.samples) - maxSamplesPerSeries; n > 0 {
		m.samples = slices.Delete(m.samples, 0, n)
	}
}

// eval evaluates expr as an instant query at `at` and returns the label
// sets of the resulting vector (a scalar result is an error: every rule is
// a vector expression).
func (a *alertEvaluator) eval(expr string, at time.Time) ([]map[string]string, error) {
	q, err := a.engine.NewInstantQuery(context.Background(), a, nil, expr, at)
	if err != nil {
		return nil, fmt.Errorf("parse %q: %w", expr, err)
	}
	defer q.Close()
	res := q.Exec(context.Background())
	if res.Err != nil {
		return nil, fmt.Errorf("evaluate %q: %w", expr, res.Err)
	}
	vec, err := res.Vector()
	if err != nil {
		return nil, fmt.Errorf("evaluate %q: %w", expr, err)
	}
	var out []map[string]string
	for _, s := range vec {
		out = append(out, s.Metric.Map())
	}
	return out, nil
}

// firing reports whether the rule named alert is true at `at` for
// configuration cfg; it fails t when there is no such rule.
func (a *alertEvaluator) firing(t *testing.T, alert string, at time.Time, cfg string) bool {
	t.Helper()
	i := slices.IndexFunc(a.rules, func(r alertRule) bool { return r.name == alert })
	if i < 0 {
		t.Fatalf("no alert %s in group %s", alert, alertGroup)
	}
	res, err := a.eval(a.rules[i].expr, at)
	if err != nil {
		t.Fatalf("alert %s: %v", alert, err)
	}
	return slices.ContainsFunc(res, func(l map[string]string) bool { return l["configuration"] == cfg })
}

// Querier makes alertEvaluator a storage.Queryable over its samples.
func (a *alertEvaluator) Querier(mint, maxt int64) (storage.Querier, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	// Copy the matching samples, so that the query runs unlocked while
	// scrapes keep arriving.
	var snap []*memSeries
	for _, ms := range a.series {
		var ss []fsample
		for _, s := range ms.samples {
			if s.t >= mint && s.t <= maxt {
				ss = append(ss, s)
			}
		}
		if len(ss) > 0 {
			snap = append(snap, &memSeries{lset: ms.lset, samples: ss})
		}
	}
	sort.Slice(snap, func(i, j int) bool { return labels.Compare(snap[i].lset, snap[j].lset) < 0 })
	return memQuerier(snap), nil
}

type memQuerier []*memSeries

func (q memQuerier) Select(_ context.Context, _ bool, _ *storage.SelectHints, ms ...*labels.Matcher) storage.SeriesSet {
	var out []storage.Series
	for _, s := range q {
		if matchAll(s.lset, ms) {
			samples := make([]chunks.Sample, len(s.samples))
			for i := range s.samples {
				samples[i] = s.samples[i]
			}
			out = append(out, storage.NewListSeries(s.lset, samples))
		}
	}
	return &sliceSeriesSet{series: out, i: -1}
}

func matchAll(l labels.Labels, ms []*labels.Matcher) bool {
	for _, m := range ms {
		if !m.Matches(l.Get(m.Name)) {
			return false
		}
	}
	return true
}

func (q memQuerier) LabelValues(_ context.Context, name string, _ *storage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	seen := map[string]bool{}
	for _, s := range q {
		if v := s.lset.Get(name); v != "" && matchAll(s.lset, ms) {
			seen[v] = true
		}
	}
	out := make([]string, 0, len(seen))
	for v := range seen {
		out = append(out, v)
	}
	sort.Strings(out)
	return out, nil, nil
}

func (q memQuerier) LabelNames(_ context.Context, _ *storage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	seen := map[string]bool{}
	for _, s := range q {
		if matchAll(s.lset, ms) {
			s.lset.Range(func(l labels.Label) { seen[l.Name] = true })
		}
	}
	out := make([]string, 0, len(seen))
	for v := range seen {
		out = append(out, v)
	}
	sort.Strings(out)
	return out, nil, nil
}

func (memQuerier) Close() error { return nil }

type sliceSeriesSet struct {
	series []storage.Series
	i      int
}

func (s *sliceSeriesSet) Next() bool                        { s.i++; return s.i < len(s.series) }
func (s *sliceSeriesSet) At() storage.Series                { return s.series[s.i] }
func (s *sliceSeriesSet) Err() error                        { return nil }
func (s *sliceSeriesSet) Warnings() annotations.Annotations { return nil }

// fsample is a float sample (chunks.Sample).
type fsample struct {
	t int64
	f float64
}

func (s fsample) T() int64                      { return s.t }
func (s fsample) ST() int64                     { return 0 }
func (s fsample) F() float64                    { return s.f }
func (s fsample) H() *histogram.Histogram       { return nil }
func (s fsample) FH() *histogram.FloatHistogram { return nil }
func (s fsample) Type() chunkenc.ValueType      { return chunkenc.ValFloat }
func (s fsample) Copy() chunks.Sample           { return s }
