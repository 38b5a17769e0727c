package watchprobe

// The alert expressions of the chart's PrometheusRule (group kadmit-watch),
// evaluated by Prometheus's own PromQL engine over the scrapes of the
// watch's /metrics, stored as Prometheus stores them: one sample per series
// per scrape at the scrape's time, and a staleness marker when a series
// disappears from its target's scrape or its target disappears (so a deleted
// webhook's series, or a deleted watch pod's, end at once instead of
// lingering for the 5-minute lookback).
//
// The engine (github.com/prometheus/prometheus/promql) runs on a small
// in-memory storage.Queryable here rather than on promqltest/teststorage:
// those pull in Prometheus's TSDB and, through it, the cloud SDKs of its
// service discovery (about 400 more packages to compile cold), the engine
// alone about 50.

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/value"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/chunks"
	"github.com/prometheus/prometheus/util/annotations"
	"sigs.k8s.io/yaml"
)

// AlertGroup is the rule group of the watch's alerts in the chart's
// PrometheusRule (deploy/helm/kadmit/templates/_watchrules.tpl).
const AlertGroup = "kadmit-watch"

// Rule is one alerting rule: its name, PromQL expression and `for:`.
type Rule struct {
	Name, Expr string
	For        time.Duration
}

// ParseRules returns the alerting rules of group in one or more YAML
// documents, each a PrometheusRule (spec.groups) or a Prometheus rule file
// (groups).
func ParseRules(data []byte, group string) ([]Rule, error) {
	type grp struct {
		Name  string `json:"name"`
		Rules []struct {
			Alert string `json:"alert"`
			Expr  string `json:"expr"`
			For   string `json:"for"`
		} `json:"rules"`
	}
	var out []Rule
	for _, doc := range strings.Split("\n"+string(data), "\n---") {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		var f struct {
			Groups []grp `json:"groups"`
			Spec   struct {
				Groups []grp `json:"groups"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal([]byte(doc), &f); err != nil {
			return nil, fmt.Errorf("rules: %w", err)
		}
		for _, g := range append(f.Groups, f.Spec.Groups...) {
			if g.Name != group {
				continue
			}
			for _, r := range g.Rules {
				if r.Alert == "" {
					continue
				}
				rule := Rule{Name: r.Alert, Expr: strings.TrimSpace(r.Expr)}
				if r.For != "" {
					d, err := model.ParseDuration(r.For)
					if err != nil {
						return nil, fmt.Errorf("rules: alert %s: for %q: %w", r.Alert, r.For, err)
					}
					rule.For = time.Duration(d)
				}
				out = append(out, rule)
			}
		}
	}
	return out, nil
}

// AlertsFor returns the names of the rules whose expression selects
// kadmit_watch_findings with a check label matcher that check satisfies
// (check="KD301", check=~"KD40[1-5]|KD409"): the alerts a finding of that
// check can make true. Expressions that do not parse are skipped
// (NewEvaluator reports them).
func AlertsFor(rules []Rule, check string) []string {
	var out []string
	for _, r := range rules {
		expr, err := parser.NewParser(parser.Options{}).ParseExpr(r.Expr)
		if err != nil {
			continue
		}
		hit := false
		parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
			vs, ok := n.(*parser.VectorSelector)
			if !ok || vs.Name != "kadmit_watch_findings" {
				return nil
			}
			for _, m := range vs.LabelMatchers {
				if m.Name == "check" && m.Matches(check) {
					hit = true
				}
			}
			return nil
		})
		if hit {
			out = append(out, r.Name)
		}
	}
	return out
}

// Defaults of EvaluatorOptions.
const (
	// DefaultKeepSamples bounds the samples kept per series (about 10
	// minutes of scrapes at 4/s, the longest range the rules use); older
	// ones are dropped.
	DefaultKeepSamples = DefaultKeepScrapes
	// DefaultMaxSeries bounds the series stored; samples of further series
	// are dropped and counted (Evaluator.Dropped).
	DefaultMaxSeries = 100_000
)

// EvaluatorOptions configure NewEvaluator; zero values take the defaults.
type EvaluatorOptions struct {
	KeepSamples int
	MaxSeries   int
}

// Evaluator holds the scraped samples and evaluates expressions over them
// at a given time.
type Evaluator struct {
	Rules  []Rule
	o      EvaluatorOptions
	engine *promql.Engine

	mu      sync.Mutex
	series  map[string]*memSeries // by labels.Labels.String()
	lastAt  int64                 // ms of the last scrape added
	scraped map[string]map[string]bool
	dropped int
}

type memSeries struct {
	lset    labels.Labels
	samples []fsample
}

// NewEvaluator returns an evaluator of rules; it fails when an expression
// does not parse or evaluate.
func NewEvaluator(rules []Rule, o EvaluatorOptions) (*Evaluator, error) {
	if o.KeepSamples <= 0 {
		o.KeepSamples = DefaultKeepSamples
	}
	if o.MaxSeries <= 0 {
		o.MaxSeries = DefaultMaxSeries
	}
	a := &Evaluator{Rules: rules, o: o, series: map[string]*memSeries{}, scraped: map[string]map[string]bool{},
		engine: promql.NewEngine(promql.EngineOpts{MaxSamples: 5_000_000, Timeout: 10 * time.Second, LookbackDelta: 5 * time.Minute})}
	for _, r := range rules {
		if _, err := a.Eval(r.Expr, time.Now()); err != nil {
			return nil, fmt.Errorf("alert %s: %w", r.Name, err)
		}
	}
	return a, nil
}

// Add stores one scrape. A target that failed is skipped, its series kept
// as they were (Prometheus would mark them stale, which the rules' `absent`
// would then see as the watch being down; the suites check scrape errors
// themselves). A target no longer in the scrape (a watch pod gone) gets
// staleness markers on all its series, as do series a target stopped
// returning.
func (a *Evaluator) Add(sc *Scrape) {
	ts := sc.At.UnixMilli()
	a.mu.Lock()
	defer a.mu.Unlock()
	if ts <= a.lastAt {
		return
	}
	present := map[string]bool{}
	for _, tsc := range sc.Targets {
		present[tsc.Target.URL] = true
		if tsc.Err != nil {
			continue
		}
		now := map[string]bool{}
		for _, s := range tsc.Series {
			b := labels.NewBuilder(labels.EmptyLabels())
			b.Set(model.MetricNameLabel, s.Name)
			for k, v := range s.Labels {
				// honor_labels false (the ServiceMonitor default): an
				// exposed label that clashes with a target label is kept
				// as exported_<name>.
				if _, clash := tsc.Target.Labels[k]; clash {
					k = "exported_" + k
				}
				b.Set(k, v)
			}
			for k, v := range tsc.Target.Labels {
				b.Set(k, v)
			}
			lset := b.Labels()
			key := lset.String()
			ms := a.series[key]
			if ms == nil {
				if len(a.series) >= a.o.MaxSeries {
					a.dropped++
					continue
				}
				ms = &memSeries{lset: lset}
				a.series[key] = ms
			}
			ms.append(fsample{ts, s.Value}, a.o.KeepSamples)
			now[key] = true
		}
		a.markStale(a.scraped[tsc.Target.URL], now, ts)
		a.scraped[tsc.Target.URL] = now
	}
	for url, keys := range a.scraped {
		if !present[url] {
			a.markStale(keys, nil, ts)
			delete(a.scraped, url)
		}
	}
	a.lastAt = ts
}

// markStale writes a staleness marker at ts into every series of before
// not in now, as Prometheus's scrape loop does.
func (a *Evaluator) markStale(before, now map[string]bool, ts int64) {
	for key := range before {
		if !now[key] {
			if ms := a.series[key]; ms != nil {
				ms.append(fsample{ts, math.Float64frombits(value.StaleNaN)}, a.o.KeepSamples)
			}
		}
	}
}

func (m *memSeries) append(s fsample, keep int) {
	m.samples = append(m.samples, s)
	if n := len(m.samples) - keep; n > 0 {
		m.samples = slices.Delete(m.samples, 0, n)
	}
}

// Dropped is the number of samples dropped because MaxSeries was reached.
func (a *Evaluator) Dropped() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.dropped
}

// Eval evaluates expr as an instant query at `at` and returns the label
// sets of the resulting vector (a scalar result is an error: every rule is
// a vector expression).
func (a *Evaluator) Eval(expr string, at time.Time) ([]map[string]string, error) {
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

// Rule returns the rule named alert.
func (a *Evaluator) Rule(alert string) (Rule, bool) {
	i := slices.IndexFunc(a.Rules, func(r Rule) bool { return r.Name == alert })
	if i < 0 {
		return Rule{}, false
	}
	return a.Rules[i], true
}

// Firing reports whether the expression of the rule named alert is true at
// `at` for configuration cfg (for: ignored); it fails t when there is no
// such rule or the expression does not evaluate.
func (a *Evaluator) Firing(t testing.TB, alert string, at time.Time, cfg string) bool {
	t.Helper()
	r, ok := a.Rule(alert)
	if !ok {
		t.Fatalf("no alert %s in group %s", alert, AlertGroup)
	}
	res, err := a.Eval(r.Expr, at)
	if err != nil {
		t.Fatalf("alert %s: %v", alert, err)
	}
	return slices.ContainsFunc(res, func(l map[string]string) bool { return l["configuration"] == cfg })
}

// Stretch is one run of consecutive evaluation times at which a rule's
// expression was true for one label set.
type Stretch struct {
	Alert    string
	Labels   map[string]string
	From, To time.Time
}

// Fires reports whether the stretch lasted the rule's `for:` (Prometheus
// fires an alert once its expression has been true for that long).
func (s Stretch) Fires(r Rule) bool { return s.To.Sub(s.From) >= r.For }

// Stretches evaluates r at each of times (ascending) and returns the
// stretches in which it was true, per label set.
func (a *Evaluator) Stretches(r Rule, times []time.Time) ([]Stretch, error) {
	open := map[string]*Stretch{}
	var out []Stretch
	for _, at := range times {
		res, err := a.Eval(r.Expr, at)
		if err != nil {
			return nil, fmt.Errorf("alert %s: %w", r.Name, err)
		}
		seen := map[string]bool{}
		for _, l := range res {
			key := labels.FromMap(l).String()
			seen[key] = true
			if s := open[key]; s != nil {
				s.To = at
				continue
			}
			open[key] = &Stretch{Alert: r.Name, Labels: l, From: at, To: at}
		}
		for key, s := range open {
			if !seen[key] {
				out = append(out, *s)
				delete(open, key)
			}
		}
	}
	for _, s := range open {
		out = append(out, *s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].From.Before(out[j].From) })
	return out, nil
}

// Querier makes Evaluator a storage.Queryable over its samples in
// [mint, maxt].
func (a *Evaluator) Querier(mint, maxt int64) (storage.Querier, error) {
	return &memQuerier{a: a, mint: mint, maxt: maxt}, nil
}

type memQuerier struct {
	a          *Evaluator
	mint, maxt int64
}

// series copies the samples in range of the series matching ms, sorted by
// labels, so that the query runs unlocked while scrapes keep arriving.
// Only matching series are copied: a rule selects a few metrics of the
// many a scrape holds.
func (q *memQuerier) series(ms []*labels.Matcher) []*memSeries {
	q.a.mu.Lock()
	defer q.a.mu.Unlock()
	var out []*memSeries
	for _, s := range q.a.series {
		if !matchAll(s.lset, ms) {
			continue
		}
		lo := sort.Search(len(s.samples), func(i int) bool { return s.samples[i].t >= q.mint })
		hi := sort.Search(len(s.samples), func(i int) bool { return s.samples[i].t > q.maxt })
		if lo < hi {
			out = append(out, &memSeries{lset: s.lset, samples: slices.Clone(s.samples[lo:hi])})
		}
	}
	sort.Slice(out, func(i, j int) bool { return labels.Compare(out[i].lset, out[j].lset) < 0 })
	return out
}

func (q *memQuerier) Select(_ context.Context, _ bool, _ *storage.SelectHints, ms ...*labels.Matcher) storage.SeriesSet {
	var out []storage.Series
	for _, s := range q.series(ms) {
		samples := make([]chunks.Sample, len(s.samples))
		for i := range s.samples {
			samples[i] = s.samples[i]
		}
		out = append(out, storage.NewListSeries(s.lset, samples))
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

func (q *memQuerier) LabelValues(_ context.Context, name string, _ *storage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	seen := map[string]bool{}
	for _, s := range q.series(ms) {
		if v := s.lset.Get(name); v != "" {
			seen[v] = true
		}
	}
	return slices.Sorted(maps.Keys(seen)), nil, nil
}

func (q *memQuerier) LabelNames(_ context.Context, _ *storage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	seen := map[string]bool{}
	for _, s := range q.series(ms) {
		s.lset.Range(func(l labels.Label) { seen[l.Name] = true })
	}
	return slices.Sorted(maps.Keys(seen)), nil, nil
}

func (*memQuerier) Close() error { return nil }

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
