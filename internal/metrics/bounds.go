package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// BoundsSource reports the use of the metrics listener's connection bound
// and of abandoned reviews, so an operator sees a bound before it bites.
type BoundsSource struct {
	// MetricsConnections is the number of open metrics/health connections;
	// MaxMetricsConnections its bound (--metrics-max-connections).
	MetricsConnections    func() int64
	MaxMetricsConnections int64
	// AbandonedTotal counts reviews ever abandoned at their deadline;
	// AbandonedBytes is the body bytes the running ones released from the
	// budget but still reference; MaxAbandoned bounds how many may
	// (--max-abandoned-reviews).
	AbandonedTotal, AbandonedBytes func() int64
	MaxAbandoned                   int64
}

// Bounds holds the metrics fed by events rather than read from a source.
type Bounds struct {
	abandonedRan      *prometheus.HistogramVec
	clientCertRefused *prometheus.CounterVec
	metricsAuthLimit  *prometheus.CounterVec
}

// Closed label sets.
var (
	clientCertReasons = []string{"no-certificate", "untrusted", "name-not-allowed"}
	authLimitScopes   = []string{"source", "global"}
)

// NewBounds registers on reg:
//   - kadmit_server_metrics_open_connections and
//     kadmit_server_metrics_open_connections_limit: the metrics and health
//     listener's connections and bound.
//   - kadmit_server_abandoned_reviews_total: reviews answered 500 at their
//     deadline while their policy kept running.
//   - kadmit_server_abandoned_body_bytes and
//     kadmit_server_abandoned_reviews_released_limit: body bytes released
//     from the budget at the answer but still referenced by running
//     abandoned reviews, and how many reviews may release theirs.
//   - kadmit_server_abandoned_review_seconds{webhook}: how long an
//     abandoned review ran after its answer was sent, wall time. Go cannot
//     measure CPU per goroutine; a policy that spins runs on one core, so
//     this wall time bounds the CPU it used after the answer.
//   - kadmit_server_client_certificates_refused_total{reason}: admission
//     handshakes refused by mutual TLS; reason is no-certificate, untrusted
//     (not signed by the client CA, expired, or not for client auth) or
//     name-not-allowed.
//   - kadmit_server_metrics_auth_limited_total{scope}: metrics requests
//     answered 429 because token reviews of unknown tokens were over the
//     per-source or the global rate.
//
// It returns an error when a metric is already registered on reg.
func NewBounds(reg prometheus.Registerer, src BoundsSource) (*Bounds, error) {
	b := &Bounds{
		abandonedRan: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kadmit_server_abandoned_review_seconds",
			Help:    "Wall time an abandoned review ran after its HTTP 500 was sent, in seconds (Go has no per-goroutine CPU time; this bounds it).",
			Buckets: []float64{.01, .05, .1, .5, 1, 2.5, 5, 10, 30, 60, 300},
		}, []string{"webhook"}),
		clientCertRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kadmit_server_client_certificates_refused_total",
			Help: "Admission TLS handshakes refused by mutual TLS, by reason.",
		}, []string{"reason"}),
		metricsAuthLimit: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kadmit_server_metrics_auth_limited_total",
			Help: "Metrics requests answered 429 because token reviews of unknown tokens were over the per-source or global rate.",
		}, []string{"scope"}),
	}
	if err := register(reg,
		b.abandonedRan, b.clientCertRefused, b.metricsAuthLimit,
		gauge("kadmit_server_metrics_open_connections", "Metrics and health listener connections open.", src.MetricsConnections),
		gauge("kadmit_server_metrics_open_connections_limit", "Bound on kadmit_server_metrics_open_connections (--metrics-max-connections).", constant(src.MaxMetricsConnections)),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kadmit_server_abandoned_reviews_total", Help: "Reviews answered 500 at their deadline while their policy kept running."},
			func() float64 { return float64(src.AbandonedTotal()) }),
		gauge("kadmit_server_abandoned_body_bytes", "Body bytes of running abandoned reviews, released from the body budget at their answer.", src.AbandonedBytes),
		gauge("kadmit_server_abandoned_reviews_released_limit", "How many running abandoned reviews may have released their in-flight slot and body bytes (--max-abandoned-reviews).", constant(src.MaxAbandoned)),
	); err != nil {
		return nil, err
	}
	for _, r := range clientCertReasons {
		b.clientCertRefused.WithLabelValues(r)
	}
	for _, s := range authLimitScopes {
		b.metricsAuthLimit.WithLabelValues(s)
	}
	return b, nil
}

// AbandonedRan records that an abandoned review of webhook (a served path)
// returned d after its answer was sent.
func (b *Bounds) AbandonedRan(webhook string, d time.Duration) {
	b.abandonedRan.WithLabelValues(webhook).Observe(d.Seconds())
}

// ClientCertRefused counts one refused handshake: reason is
// "no-certificate", "untrusted" or "name-not-allowed" (anything else counts
// as "untrusted").
func (b *Bounds) ClientCertRefused(reason string) {
	switch reason {
	case "no-certificate", "name-not-allowed":
	default:
		reason = "untrusted"
	}
	b.clientCertRefused.WithLabelValues(reason).Inc()
}

// MetricsAuthLimited counts one 429: scope is "source" or "global"
// (anything else counts as "global").
func (b *Bounds) MetricsAuthLimited(scope string) {
	if scope != "source" {
		scope = "global"
	}
	b.metricsAuthLimit.WithLabelValues(scope).Inc()
}
