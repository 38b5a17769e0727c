package watchprobe

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kadmit/kadmit/test/poll"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const exposition = `# TYPE kadmit_watch_findings gauge
kadmit_watch_findings{check="KD301",configuration="c1",severity="error",webhook="w1"} 1
kadmit_watch_findings{check="KD605",configuration="c1",severity="warning",webhook="w1"} 0
# TYPE kadmit_watch_leader gauge
kadmit_watch_leader 1
# TYPE kadmit_watch_handshake_duration_seconds histogram
kadmit_watch_handshake_duration_seconds_bucket{le="0.1"} 2
kadmit_watch_handshake_duration_seconds_bucket{le="+Inf"} 3
kadmit_watch_handshake_duration_seconds_sum 0.5
kadmit_watch_handshake_duration_seconds_count 3
`

func TestParseMetricsExpandsHistograms(t *testing.T) {
	got, err := ParseMetrics([]byte(exposition))
	if err != nil {
		t.Fatal(err)
	}
	sc := &Scrape{Targets: []TargetScrape{{Series: got}}}
	if v, ok := sc.Value("kadmit_watch_handshake_duration_seconds_count", nil); !ok || v != 3 {
		t.Errorf("_count = %v (%v), want 3", v, ok)
	}
	if n := len(sc.Find("kadmit_watch_handshake_duration_seconds_bucket", nil)); n != 2 {
		t.Errorf("%d buckets, want 2", n)
	}
	fs := Findings(sc, "c1", "error", "warning")
	if len(fs) != 1 || fs[0].Labels["check"] != "KD301" {
		t.Errorf("findings above zero: %v, want the KD301 one", fs)
	}
	if _, err := ParseMetrics([]byte("# TYPE x gauge\nx NaN\n")); err == nil {
		t.Error("a NaN sample parsed without error")
	}
}

// TestScraperKeepsItsBound: the history never holds more than Keep
// scrapes; a failing target is an error of the scrape and its samples are
// not found, the other target's are.
func TestScraperKeepsItsBound(t *testing.T) {
	good := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, exposition) }))
	defer good.Close()
	bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "no", http.StatusInternalServerError) }))
	defer bad.Close()
	huge := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, strings.Repeat("#", 2048)) }))
	defer huge.Close()
	s := StartScraper(t, StaticTargets(Target{URL: good.URL}, Target{URL: bad.URL}, Target{URL: huge.URL}),
		ScraperOptions{Interval: 5 * time.Millisecond, Keep: 3, MaxBody: 1024})
	if err := poll.Until(t.Context(), 10*time.Second, func(context.Context) error {
		if n := s.Dropped(); n < 5 {
			return fmt.Errorf("only %d scrapes dropped", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	all := s.AllBetween(time.Time{}, time.Now().Add(time.Hour))
	if len(all) > 3 {
		t.Errorf("%d scrapes kept, bound 3", len(all))
	}
	sc := s.Latest()
	if sc.Err == nil || !strings.Contains(sc.Err.Error(), "HTTP 500") || !strings.Contains(sc.Err.Error(), "over 1024 bytes") {
		t.Errorf("scrape error %v; want the 500 and the oversized answer", sc.Err)
	}
	if v, ok := sc.Value("kadmit_watch_leader", nil); !ok || v != 1 {
		t.Errorf("leader from the good target: %v %v", v, ok)
	}
	if n := len(s.Between(time.Time{}, time.Now().Add(time.Hour))); n != 0 {
		t.Errorf("%d scrapes without error; every one had a failing target", n)
	}
}

// TestScraperStopsAfterFor: a scraper's count of scrapes is bounded by
// For / Interval whatever its test does.
func TestScraperStopsAfterFor(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, exposition) }))
	defer srv.Close()
	s := StartScraper(t, StaticTargets(Target{URL: srv.URL}), ScraperOptions{Interval: 5 * time.Millisecond, For: 50 * time.Millisecond})
	time.Sleep(500 * time.Millisecond)
	n := len(s.AllBetween(time.Time{}, time.Now().Add(time.Hour))) + s.Dropped()
	if n > 10 {
		t.Errorf("%d scrapes; For/Interval is 10", n)
	}
	time.Sleep(100 * time.Millisecond)
	if m := len(s.AllBetween(time.Time{}, time.Now().Add(time.Hour))) + s.Dropped(); m != n {
		t.Errorf("still scraping after For: %d, then %d", n, m)
	}
}

func TestScraperBoundsTargets(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { hits.Add(1); fmt.Fprint(w, exposition) }))
	defer srv.Close()
	var ts []Target
	for range MaxTargets + 5 {
		ts = append(ts, Target{URL: srv.URL})
	}
	s := &Scraper{targets: StaticTargets(ts...), o: ScraperOptions{Timeout: time.Second, MaxBody: DefaultMaxBody}, hc: srv.Client()}
	sc := s.scrape(context.Background())
	if len(sc.Targets) != MaxTargets || int(hits.Load()) != MaxTargets || sc.Err == nil {
		t.Errorf("%d targets scraped (%d GETs), error %v; want %d and an error", len(sc.Targets), hits.Load(), sc.Err, MaxTargets)
	}
}

func rulesOfRepo(t *testing.T) []Rule {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "deploy", "prometheus", "kadmit-watch-rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	rules, err := ParseRules(data, AlertGroup)
	if err != nil {
		t.Fatal(err)
	}
	if len(rules) == 0 {
		t.Fatal("no rules")
	}
	return rules
}

func TestAlertsFor(t *testing.T) {
	rules := rulesOfRepo(t)
	for check, want := range map[string]string{"KD301": "KadmitWebhookSelectorCollision", "KD404": "KadmitWebhookTLSBroken", "KD501": "KadmitWebhookSelfInterception"} {
		if got := AlertsFor(rules, check); !slices.Contains(got, want) {
			t.Errorf("AlertsFor(%s) = %v, want %s among them", check, got, want)
		}
	}
	if got := AlertsFor(rules, "KD999"); len(got) != 0 {
		t.Errorf("AlertsFor(KD999) = %v", got)
	}
	r := rules[slices.IndexFunc(rules, func(r Rule) bool { return r.Name == "KadmitWebhookSelectorCollision" })]
	if r.For != 5*time.Minute {
		t.Errorf("for of %s = %s, want 5m", r.Name, r.For)
	}
}

func scrapeAt(at time.Time, targets ...TargetScrape) *Scrape {
	return &Scrape{At: at, Targets: targets}
}

func series(name string, v float64, kv ...string) Series {
	l := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		l[kv[i]] = kv[i+1]
	}
	return Series{Name: name, Labels: l, Value: v}
}

// TestEvaluatorStalenessAndStretches: a watch pod's target that disappears
// ends its series at once (absent() sees no leader); the leader moving to
// another target fills the gap; Stretches reports the gap and whether it
// lasted the rule's for.
func TestEvaluatorStalenessAndStretches(t *testing.T) {
	rule := Rule{Name: "Down", Expr: `absent(kadmit_watch_leader{namespace="ns"} == 1)`, For: 2 * time.Second}
	a, err := NewEvaluator([]Rule{rule}, EvaluatorOptions{KeepSamples: 4})
	if err != nil {
		t.Fatal(err)
	}
	p0 := Target{URL: "http://a", Labels: map[string]string{"namespace": "ns", "pod": "w-0"}}
	p1 := Target{URL: "http://b", Labels: map[string]string{"namespace": "ns", "pod": "w-1"}}
	t0 := time.Now().Add(-time.Minute).Truncate(time.Second)
	var times []time.Time
	add := func(sec int, ts ...TargetScrape) {
		at := t0.Add(time.Duration(sec) * time.Second)
		a.Add(scrapeAt(at, ts...))
		times = append(times, at)
	}
	add(0, TargetScrape{Target: p0, Series: []Series{series("kadmit_watch_leader", 1)}}, TargetScrape{Target: p1, Series: []Series{series("kadmit_watch_leader", 0)}})
	add(1, TargetScrape{Target: p1, Series: []Series{series("kadmit_watch_leader", 0)}}) // w-0 gone
	add(2, TargetScrape{Target: p1, Series: []Series{series("kadmit_watch_leader", 0)}})
	add(3, TargetScrape{Target: p1, Series: []Series{series("kadmit_watch_leader", 1)}})
	// A failed target scrape keeps its series as they were.
	add(4, TargetScrape{Target: p1, Err: fmt.Errorf("refused")})
	st, err := a.Stretches(rule, times)
	if err != nil {
		t.Fatal(err)
	}
	if len(st) != 1 || !st[0].From.Equal(t0.Add(time.Second)) || !st[0].To.Equal(t0.Add(2*time.Second)) {
		t.Fatalf("stretches %+v; want one from +1s to +2s", st)
	}
	if st[0].Fires(rule) {
		t.Errorf("a 1s stretch fires a rule with for: 2s")
	}
	// The per-series sample bound.
	a.mu.Lock()
	for k, ms := range a.series {
		if len(ms.samples) > 4 {
			t.Errorf("series %s holds %d samples, bound 4", k, len(ms.samples))
		}
	}
	a.mu.Unlock()
}

func TestEvaluatorMaxSeries(t *testing.T) {
	a, err := NewEvaluator(nil, EvaluatorOptions{MaxSeries: 2})
	if err != nil {
		t.Fatal(err)
	}
	tg := Target{URL: "http://a"}
	var ss []Series
	for i := range 5 {
		ss = append(ss, series("x", 1, "i", fmt.Sprint(i)))
	}
	a.Add(scrapeAt(time.Now(), TargetScrape{Target: tg, Series: ss}))
	if a.Dropped() != 3 || len(a.series) != 2 {
		t.Errorf("%d series stored, %d samples dropped; want 2 and 3", len(a.series), a.Dropped())
	}
}

func TestEventRecorderBound(t *testing.T) {
	r := &EventRecorder{keep: 2, counts: map[string]int32{}}
	ev := func(name string, count int32) *corev1.Event {
		return &corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}, Type: "Warning", Reason: "KD301", Count: count,
			InvolvedObject: corev1.ObjectReference{Kind: "ValidatingWebhookConfiguration", Name: "c1"}}
	}
	r.record(ev("a", 1))
	r.record(ev("a", 1)) // same count: not new
	r.record(ev("a", 2)) // count rose: seen again
	r.record(ev("b", 1)) // past the bound
	if got := r.Matching(time.Time{}, OnConfig("c1", "Warning", "KD301")); len(got) != 2 || r.Dropped() != 1 || len(r.counts) > 2 {
		t.Errorf("kept %d, dropped %d, counts %d; want 2, 1, at most 2", len(got), r.Dropped(), len(r.counts))
	}
}

func TestPollForIsBounded(t *testing.T) {
	start := time.Now()
	if err := pollFor(context.Background(), 300*time.Millisecond, func() bool { return false }); err == nil {
		t.Error("pollFor of a condition never true returned nil")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("pollFor(300ms) took %s", d)
	}
}

func TestTable(t *testing.T) {
	at := time.Now()
	rows := []Detection{{Class: Class{Name: "selector collision", Check: "KD301", Informer: true}, InjectAt: at, LiveAt: at,
		MetricAt: at.Add(time.Second), EventAt: at.Add(2 * time.Second), AlertAt: at.Add(time.Second), AlertName: "KadmitWebhookSelectorCollision", Severity: "error"}}
	got := Table(rows)
	for _, want := range []string{"selector collision", "KD301", "5s", "1s", "2s", "(KadmitWebhookSelectorCollision)", "error"} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
}
