package watch

import (
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kadmit/kadmit/internal/doctor"
)

// webhookState is what one evaluation found for one tracked webhook, or
// (policy true) for one in-cluster admission policy or binding: then key
// holds its kind and name (Webhook empty) and only findings are set.
type webhookState struct {
	key           wkey
	policy        bool
	uid           types.UID
	failurePolicy string // "Fail" or "Ignore"
	service       string // "ns/name", or the URL
	// findings are the active findings: confirmed warnings and errors,
	// and every info finding.
	findings   []doctor.Finding
	ready      int
	readyKnown bool
	// caExpiry is the earliest NotAfter in caBundle; zero when none parses.
	caExpiry time.Time
	// certExpiry maps each handshaken endpoint ("ip:port") to the NotAfter
	// of the leaf it served; at most MaxEndpoints entries.
	certExpiry map[string]time.Time
}

// series labels (configuration, webhook): the pair every per-webhook
// series carries. A mutating and a validating configuration of the same
// name with a webhook of the same name share it: their findings add up,
// ready endpoints and expiries take the lower value.
type series struct{ configuration, webhook string }

// exported remembers which label sets of one pair are set, so that those
// an evaluation no longer yields are deleted rather than left stale.
type exported struct {
	info      map[[3]string]bool // kind, failure_policy, service
	findings  map[[2]string]bool // check, severity
	ready     bool
	ca        bool
	endpoints map[string]bool
}

// Metrics are the watch's Prometheus series (all names kadmit_watch_*),
// on a registry of their own with the Go and process collectors. Label
// values are bounded: configuration and webhook are Kubernetes names (at
// most 253 bytes) of at most MaxWebhooks tracked webhooks, endpoint at most
// MaxEndpoints per webhook, check and severity from doctor's fixed lists,
// reason from the fixed lists below. Per-webhook series exist only on the
// leader, and are deleted with their webhook.
type Metrics struct {
	reg *prometheus.Registry

	info, findings, ready, certExpiry, caExpiry *prometheus.GaugeVec
	policyFindings                              *prometheus.GaugeVec
	hsDuration, probeDuration                   *prometheus.HistogramVec
	hsFailures, probeFailures                   *prometheus.CounterVec
	evaluations                                 prometheus.Counter
	lastEvaluation, leader, untracked           prometheus.Gauge

	mu  sync.Mutex // guards out: evaluations and handshake workers both use it
	out map[series]*exported
	// outPolicies are the policy finding label sets set now.
	outPolicies map[[4]string]bool
}

// HandshakeReasons and ProbeReasons are every value the reason label of
// kadmit_watch_handshake_failures_total and
// kadmit_watch_probe_failures_total takes (failureReason,
// handshakeReason, probeReasons). A denied or inconclusive probe is no
// failure: the webhook, or another, answered.
var (
	HandshakeReasons = []string{"refused", "timeout", "unknown_authority", "san_mismatch", "expired", "tls", "unreachable", "other"}
	ProbeReasons     = []string{"refused", "unknown_authority", "san_mismatch", "timeout", "bad_response", "cert_expired", "no_endpoints"}
)

// NewMetrics registers the watch's collectors on a new registry.
//
// Errors: registration failed (a duplicate name), wrapped.
func NewMetrics() (*Metrics, error) {
	pw := []string{"configuration", "webhook"}
	m := &Metrics{reg: prometheus.NewRegistry(), out: map[series]*exported{}, outPolicies: map[[4]string]bool{},
		policyFindings: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kadmit_watch_policy_findings",
			Help: "Active findings (KD9xx) of an in-cluster admission policy or binding by check ID and severity."},
			[]string{"kind", "policy", "check", "severity"}),
		info: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kadmit_watch_webhook_info",
			Help: "1 for each tracked webhook: its configuration kind, failurePolicy and target (ns/name of the Service, or the URL)."},
			[]string{"kind", "configuration", "webhook", "failure_policy", "service"}),
		findings: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kadmit_watch_findings",
			Help: "Active findings of a webhook by check ID and severity (warnings and errors once confirmed)."},
			[]string{"configuration", "webhook", "check", "severity"}),
		ready: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kadmit_watch_ready_endpoints",
			Help: "Ready EndpointSlice endpoints of the webhook's Service port (absent for URL webhooks)."}, pw),
		certExpiry: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kadmit_watch_serving_cert_expiry_timestamp_seconds",
			Help: "NotAfter of the leaf certificate the endpoint served in its last handshake, Unix seconds."},
			[]string{"configuration", "webhook", "endpoint"}),
		caExpiry: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kadmit_watch_ca_bundle_expiry_timestamp_seconds",
			Help: "Earliest NotAfter among the caBundle's certificates, Unix seconds."}, pw),
		hsDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kadmit_watch_handshake_duration_seconds",
			Help:    "TCP connect plus TLS handshake to the webhook's endpoints, seconds.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}}, pw),
		hsFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kadmit_watch_handshake_failures_total",
			Help: "Handshakes whose failure was confirmed by a second handshake, by reason."}, []string{"configuration", "webhook", "reason"}),
		probeDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kadmit_watch_probe_duration_seconds",
			Help:    "Round trip of server-side dry-run probes through the API server, seconds.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}}, pw),
		probeFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kadmit_watch_probe_failures_total",
			Help: "Probes whose failure was confirmed by a retry, by reason."}, []string{"configuration", "webhook", "reason"}),
		evaluations: prometheus.NewCounter(prometheus.CounterOpts{Name: "kadmit_watch_evaluations_total",
			Help: "Evaluations of every webhook's checks."}),
		lastEvaluation: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kadmit_watch_last_evaluation_timestamp_seconds",
			Help: "When the last evaluation finished, Unix seconds."}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kadmit_watch_leader",
			Help: "1 while this replica holds the Lease and reports per-webhook series and Events."}),
		untracked: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kadmit_watch_untracked_webhooks",
			Help: "Webhooks beyond --max-webhooks: no series, Events or handshakes for them."}),
	}
	for _, c := range []prometheus.Collector{m.info, m.findings, m.policyFindings, m.ready, m.certExpiry, m.caExpiry, m.hsDuration, m.hsFailures,
		m.probeDuration, m.probeFailures, m.evaluations, m.lastEvaluation, m.leader, m.untracked,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})} {
		if err := m.reg.Register(c); err != nil {
			return nil, fmt.Errorf("register watch metrics: %w", err)
		}
	}
	return m, nil
}

// Registry is what /metrics serves.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// evaluated records one finished evaluation.
func (m *Metrics) evaluated(at time.Time, untracked int) {
	m.evaluations.Inc()
	m.lastEvaluation.Set(float64(at.UnixNano()) / 1e9)
	m.untracked.Set(float64(untracked))
}

// setLeader sets kadmit_watch_leader; losing the lead drops every
// per-webhook series, which only the leader reports.
func (m *Metrics) setLeader(leading bool) {
	if leading {
		m.leader.Set(1)
		return
	}
	m.leader.Set(0)
	m.mu.Lock()
	defer m.mu.Unlock()
	clear(m.outPolicies)
	for _, v := range []interface{ Reset() }{m.policyFindings, m.info, m.findings, m.ready, m.certExpiry, m.caExpiry, m.hsDuration, m.hsFailures, m.probeDuration, m.probeFailures} {
		v.Reset()
	}
	clear(m.out)
}

// publish makes the per-webhook gauges equal to states: sets what they
// hold, deletes label sets they no longer yield, and every series
// (counters and histograms too) of a pair no state names any more.
func (m *Metrics) publish(states []*webhookState) {
	m.mu.Lock()
	defer m.mu.Unlock()
	type agg struct {
		info       map[[3]string]bool
		findings   map[[2]string]int
		ready      int
		readyKnown bool
		ca         time.Time
		endpoints  map[string]time.Time
	}
	want := map[series]*agg{}
	wantPolicies := map[[4]string]int{}
	for _, s := range states {
		if s.policy {
			for _, f := range s.findings {
				wantPolicies[[4]string{s.key.Kind, s.key.Configuration, f.ID, string(f.Severity)}]++
			}
			continue
		}
		p := series{s.key.Configuration, s.key.Webhook}
		a := want[p]
		if a == nil {
			a = &agg{info: map[[3]string]bool{}, findings: map[[2]string]int{}, endpoints: map[string]time.Time{}, ready: -1}
			want[p] = a
		}
		a.info[[3]string{s.key.Kind, s.failurePolicy, s.service}] = true
		for _, f := range s.findings {
			a.findings[[2]string{f.ID, string(f.Severity)}]++
		}
		if s.readyKnown {
			a.readyKnown = true
			if a.ready < 0 || s.ready < a.ready {
				a.ready = s.ready
			}
		}
		if !s.caExpiry.IsZero() && (a.ca.IsZero() || s.caExpiry.Before(a.ca)) {
			a.ca = s.caExpiry
		}
		for ep, t := range s.certExpiry {
			if old, ok := a.endpoints[ep]; !ok || t.Before(old) {
				a.endpoints[ep] = t
			}
		}
	}
	for p, a := range want {
		e := m.out[p]
		if e == nil {
			e = &exported{info: map[[3]string]bool{}, findings: map[[2]string]bool{}, endpoints: map[string]bool{}}
			m.out[p] = e
		}
		for l := range e.info {
			if !a.info[l] {
				m.info.DeleteLabelValues(l[0], p.configuration, p.webhook, l[1], l[2])
				delete(e.info, l)
			}
		}
		for l := range a.info {
			m.info.WithLabelValues(l[0], p.configuration, p.webhook, l[1], l[2]).Set(1)
			e.info[l] = true
		}
		for l := range e.findings {
			if a.findings[l] == 0 {
				m.findings.DeleteLabelValues(p.configuration, p.webhook, l[0], l[1])
				delete(e.findings, l)
			}
		}
		for l, n := range a.findings {
			m.findings.WithLabelValues(p.configuration, p.webhook, l[0], l[1]).Set(float64(n))
			e.findings[l] = true
		}
		if a.readyKnown {
			m.ready.WithLabelValues(p.configuration, p.webhook).Set(float64(a.ready))
		} else if e.ready {
			m.ready.DeleteLabelValues(p.configuration, p.webhook)
		}
		e.ready = a.readyKnown
		if !a.ca.IsZero() {
			m.caExpiry.WithLabelValues(p.configuration, p.webhook).Set(float64(a.ca.Unix()))
		} else if e.ca {
			m.caExpiry.DeleteLabelValues(p.configuration, p.webhook)
		}
		e.ca = !a.ca.IsZero()
		for ep := range e.endpoints {
			if _, ok := a.endpoints[ep]; !ok {
				m.certExpiry.DeleteLabelValues(p.configuration, p.webhook, ep)
				delete(e.endpoints, ep)
			}
		}
		for ep, t := range a.endpoints {
			m.certExpiry.WithLabelValues(p.configuration, p.webhook, ep).Set(float64(t.Unix()))
			e.endpoints[ep] = true
		}
	}
	for p := range m.out {
		if want[p] == nil {
			m.deleteSeries(p)
		}
	}
	for l := range m.outPolicies {
		if wantPolicies[l] == 0 {
			m.policyFindings.DeleteLabelValues(l[:]...)
			delete(m.outPolicies, l)
		}
	}
	for l, n := range wantPolicies {
		m.policyFindings.WithLabelValues(l[:]...).Set(float64(n))
		m.outPolicies[l] = true
	}
}

// deleteSeries removes every series of a webhook that is gone; m.mu held.
func (m *Metrics) deleteSeries(p series) {
	l := prometheus.Labels{"configuration": p.configuration, "webhook": p.webhook}
	for _, v := range []interface {
		DeletePartialMatch(prometheus.Labels) int
	}{m.info, m.findings, m.ready, m.certExpiry, m.caExpiry, m.hsDuration, m.hsFailures, m.probeDuration, m.probeFailures} {
		v.DeletePartialMatch(l)
	}
	delete(m.out, p)
}

// exporting reports whether the pair has series (it is tracked and this
// replica leads).
func (m *Metrics) exporting(p series) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.out[p] != nil
}

func (m *Metrics) handshake(p series, took time.Duration) {
	if m.exporting(p) {
		m.hsDuration.WithLabelValues(p.configuration, p.webhook).Observe(took.Seconds())
	}
}

func (m *Metrics) handshakeFailed(p series, reason string) {
	if m.exporting(p) {
		m.hsFailures.WithLabelValues(p.configuration, p.webhook, reason).Inc()
	}
}

func (m *Metrics) probe(p series, took time.Duration) {
	if m.exporting(p) {
		m.probeDuration.WithLabelValues(p.configuration, p.webhook).Observe(took.Seconds())
	}
}

func (m *Metrics) probeFailed(p series, reason string) {
	if m.exporting(p) {
		m.probeFailures.WithLabelValues(p.configuration, p.webhook, reason).Inc()
	}
}
