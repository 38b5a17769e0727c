// Package watchprobe observes `kadmit watch` from the outside, the way an
// operator's monitoring does, for the end-to-end suites that inject faults
// and count false alarms (test/e2e/routed's TestWatch on the routed
// simulation, test/deploy/diagcluster on the real cluster):
//
//   - Scraper: GET /metrics of every target (one watch process, or every
//     watch pod as Prometheus's endpoint discovery finds them) at a fixed
//     interval, keeping a bounded history of scrapes;
//   - Evaluator: the alert expressions of the chart's PrometheusRule (group
//     kadmit-watch), evaluated by Prometheus's own PromQL engine over those
//     scrapes stored as Prometheus stores them;
//   - EventRecorder: every core/v1 Event, with the time the test saw it;
//   - Measure and Table: one failure class injected into a healthy webhook,
//     the time to the finding's metric, its Warning Event and its alert
//     expression, and the table of those times.
package watchprobe

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Defaults of ScraperOptions.
const (
	// DefaultScrapeInterval paces the scraper: the resolution of every
	// measured detection time.
	DefaultScrapeInterval = 250 * time.Millisecond
	// DefaultKeepScrapes bounds the scrapes kept (about 10 minutes at 4/s);
	// older ones are dropped.
	DefaultKeepScrapes = 2400
	// DefaultMaxBody bounds one /metrics answer read, bytes.
	DefaultMaxBody = 16 << 20
	// DefaultScrapeTimeout bounds one GET.
	DefaultScrapeTimeout = 2 * time.Second
	// DefaultScrapeFor bounds how long a scraper runs (its count of
	// scrapes: DefaultScrapeFor / Interval), whatever its test does.
	DefaultScrapeFor = time.Hour
	// MaxTargets bounds the targets one scrape reads; more are an error of
	// that scrape (a discovery gone wrong, not a watch).
	MaxTargets = 16
)

// Series is one sample of a scrape: metric name, labels, value.
type Series struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// Has reports whether every label in want has that value.
func (s Series) Has(want map[string]string) bool {
	for k, v := range want {
		if s.Labels[k] != v {
			return false
		}
	}
	return true
}

func (s Series) String() string {
	keys := slices.Sorted(maps.Keys(s.Labels))
	var b strings.Builder
	b.WriteString(s.Name + "{")
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%s=%q", k, s.Labels[k])
	}
	fmt.Fprintf(&b, "} %g", s.Value)
	return b.String()
}

// Target is one /metrics endpoint and the labels Prometheus attaches to
// every series scraped from it (a ServiceMonitor's job, instance,
// namespace, pod, service, container, endpoint).
type Target struct {
	URL    string
	Labels map[string]string
}

// TargetScrape is one target's answer in a scrape.
type TargetScrape struct {
	Target Target
	Err    error
	Series []Series
}

// Scrape is one round over the targets: when it ended and each target's
// samples (histograms and summaries expanded into their _bucket/_sum/_count
// series, as Prometheus stores them).
type Scrape struct {
	At time.Time
	// Err joins the discovery error and every target's error; nil when
	// every target answered.
	Err     error
	Targets []TargetScrape
}

// Find returns the samples of metric name carrying the labels in want,
// from every target that answered.
func (s *Scrape) Find(name string, want map[string]string) []Series {
	var out []Series
	for _, ts := range s.Targets {
		if ts.Err != nil {
			continue
		}
		for _, x := range ts.Series {
			if x.Name == name && x.Has(want) {
				out = append(out, x)
			}
		}
	}
	return out
}

// Value returns the value of the one sample of name with labels want;
// false when there is none or more than one.
func (s *Scrape) Value(name string, want map[string]string) (float64, bool) {
	xs := s.Find(name, want)
	if len(xs) != 1 {
		return 0, false
	}
	return xs[0].Value, true
}

func (s *Scrape) String() string {
	if s.Err != nil {
		return s.At.Format("15:04:05.000") + " " + s.Err.Error()
	}
	n := 0
	for _, ts := range s.Targets {
		n += len(ts.Series)
	}
	return fmt.Sprintf("%s: %d targets, %d samples", s.At.Format("15:04:05.000"), len(s.Targets), n)
}

// Findings returns the scrape's kadmit_watch_findings samples above zero
// for configuration cfg ("" for every configuration) with a severity in
// sevs (none given: any severity).
func Findings(sc *Scrape, cfg string, sevs ...string) []Series {
	var out []Series
	for _, x := range sc.Find("kadmit_watch_findings", nil) {
		if x.Value > 0 && (cfg == "" || x.Labels["configuration"] == cfg) && (len(sevs) == 0 || slices.Contains(sevs, x.Labels["severity"])) {
			out = append(out, x)
		}
	}
	return out
}

// ScraperOptions configure StartScraper; zero values take the defaults
// above.
type ScraperOptions struct {
	Interval time.Duration
	Keep     int
	MaxBody  int64
	Timeout  time.Duration
	// For bounds the scraper's life: it stops after For / Interval
	// scrapes.
	For time.Duration
}

// Scraper GETs /metrics of every target each interval and keeps the last
// Keep scrapes.
type Scraper struct {
	targets func(context.Context) ([]Target, error)
	o       ScraperOptions
	hc      *http.Client

	mu      sync.Mutex
	scrapes []*Scrape
	dropped int
	// onScrape are called, in the scraper's goroutine, with each scrape.
	onScrape []func(*Scrape)
}

// StaticTargets is a target list that never changes.
func StaticTargets(ts ...Target) func(context.Context) ([]Target, error) {
	return func(context.Context) ([]Target, error) { return ts, nil }
}

// StartScraper scrapes the targets targets returns (asked anew before each
// scrape, at most MaxTargets) every o.Interval until t ends or o.For has
// passed.
func StartScraper(t testing.TB, targets func(context.Context) ([]Target, error), o ScraperOptions) *Scraper {
	if o.Interval <= 0 {
		o.Interval = DefaultScrapeInterval
	}
	if o.Keep <= 0 {
		o.Keep = DefaultKeepScrapes
	}
	if o.MaxBody <= 0 {
		o.MaxBody = DefaultMaxBody
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultScrapeTimeout
	}
	if o.For <= 0 {
		o.For = DefaultScrapeFor
	}
	s := &Scraper{targets: targets, o: o, hc: &http.Client{Timeout: o.Timeout}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(o.Interval)
		defer tick.Stop()
		for range max(1, int(o.For/o.Interval)) {
			s.add(s.scrape(ctx))
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return s
}

// scrape asks for the targets and GETs each, one after the other (there
// are few, and their order is the targets' order).
func (s *Scraper) scrape(ctx context.Context) *Scrape {
	sc := &Scrape{}
	dctx, cancel := context.WithTimeout(ctx, s.o.Timeout)
	ts, err := s.targets(dctx)
	cancel()
	var errs []error
	if err != nil {
		errs = append(errs, fmt.Errorf("targets: %w", err))
	}
	if len(ts) > MaxTargets {
		errs = append(errs, fmt.Errorf("%d targets, more than %d: scraping the first %d", len(ts), MaxTargets, MaxTargets))
		ts = ts[:MaxTargets]
	}
	for _, tg := range ts {
		series, err := s.get(ctx, tg.URL)
		if err != nil {
			err = fmt.Errorf("%s: %w", tg.URL, err)
			errs = append(errs, err)
		}
		sc.Targets = append(sc.Targets, TargetScrape{Target: tg, Err: err, Series: series})
	}
	sc.At = time.Now()
	sc.Err = errors.Join(errs...)
	return sc
}

func (s *Scraper) get(ctx context.Context, url string) ([]Series, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := s.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, s.o.MaxBody+1))
	switch {
	case err != nil:
		return nil, err
	case int64(len(body)) > s.o.MaxBody:
		return nil, fmt.Errorf("/metrics answer over %d bytes", s.o.MaxBody)
	case resp.StatusCode != http.StatusOK:
		return nil, fmt.Errorf("/metrics: HTTP %d", resp.StatusCode)
	}
	return ParseMetrics(body)
}

func (s *Scraper) add(sc *Scrape) {
	s.mu.Lock()
	s.scrapes = append(s.scrapes, sc)
	if n := len(s.scrapes) - s.o.Keep; n > 0 {
		s.scrapes = slices.Delete(s.scrapes, 0, n)
		s.dropped += n
	}
	hooks := slices.Clone(s.onScrape)
	s.mu.Unlock()
	for _, h := range hooks {
		h(sc)
	}
}

// Latest returns the last scrape, or nil.
func (s *Scraper) Latest() *Scrape {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.scrapes) == 0 {
		return nil
	}
	return s.scrapes[len(s.scrapes)-1]
}

// Between returns the successful scrapes (every target answered) taken in
// [from, to].
func (s *Scraper) Between(from, to time.Time) []*Scrape {
	return s.filter(from, to, func(sc *Scrape) bool { return sc.Err == nil })
}

// AllBetween returns every scrape taken in [from, to], failed ones
// included (a scrape of several targets may have answers from some).
func (s *Scraper) AllBetween(from, to time.Time) []*Scrape {
	return s.filter(from, to, func(*Scrape) bool { return true })
}

// FailedBetween returns the scrapes taken in [from, to] with an error.
func (s *Scraper) FailedBetween(from, to time.Time) []*Scrape {
	return s.filter(from, to, func(sc *Scrape) bool { return sc.Err != nil })
}

func (s *Scraper) filter(from, to time.Time, keep func(*Scrape) bool) []*Scrape {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*Scrape
	for _, sc := range s.scrapes {
		if keep(sc) && !sc.At.Before(from) && !sc.At.After(to) {
			out = append(out, sc)
		}
	}
	return out
}

// Dropped is the number of scrapes dropped past Keep.
func (s *Scraper) Dropped() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dropped
}

// Observe calls f with every scrape from now on, in the scraper's
// goroutine.
func (s *Scraper) Observe(f func(*Scrape)) {
	s.mu.Lock()
	s.onScrape = append(s.onScrape, f)
	s.mu.Unlock()
}

// ParseMetrics parses the Prometheus text exposition format; a NaN sample
// is an error (the watch never exports one).
func ParseMetrics(body []byte) ([]Series, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("parse /metrics: %w", err)
	}
	var out []Series
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			base := map[string]string{}
			for _, lp := range m.GetLabel() {
				base[lp.GetName()] = lp.GetValue()
			}
			with := func(k, v string) map[string]string {
				l := make(map[string]string, len(base)+1)
				for a, b := range base {
					l[a] = b
				}
				l[k] = v
				return l
			}
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				out = append(out, Series{name, base, m.GetCounter().GetValue()})
			case dto.MetricType_GAUGE:
				out = append(out, Series{name, base, m.GetGauge().GetValue()})
			case dto.MetricType_UNTYPED:
				out = append(out, Series{name, base, m.GetUntyped().GetValue()})
			case dto.MetricType_HISTOGRAM:
				h := m.GetHistogram()
				inf := false
				for _, b := range h.GetBucket() {
					inf = inf || math.IsInf(b.GetUpperBound(), 1)
					out = append(out, Series{name + "_bucket", with("le", fmt.Sprint(b.GetUpperBound())), float64(b.GetCumulativeCount())})
				}
				// The text format lists the +Inf bucket; a histogram
				// built otherwise may leave it implicit.
				if !inf {
					out = append(out, Series{name + "_bucket", with("le", "+Inf"), float64(h.GetSampleCount())})
				}
				out = append(out, Series{name + "_sum", base, h.GetSampleSum()}, Series{name + "_count", base, float64(h.GetSampleCount())})
			case dto.MetricType_SUMMARY:
				sm := m.GetSummary()
				for _, q := range sm.GetQuantile() {
					out = append(out, Series{name, with("quantile", fmt.Sprint(q.GetQuantile())), q.GetValue()})
				}
				out = append(out, Series{name + "_sum", base, sm.GetSampleSum()}, Series{name + "_count", base, float64(sm.GetSampleCount())})
			}
		}
	}
	for i := range out {
		if math.IsNaN(out[i].Value) {
			return nil, fmt.Errorf("parse /metrics: NaN sample %s", out[i])
		}
	}
	return out, nil
}
