package metrics

import "github.com/prometheus/client_golang/prometheus"

// LimitsSource reports the current use of the server's bounds.
type LimitsSource struct {
	InFlight, Abandoned, BodyBytes, Connections func() int64
	// MaxInFlight, MaxBodyBytes and MaxConnections are the configured bounds.
	MaxInFlight, MaxBodyBytes, MaxConnections int64
}

// Limits counts what the server's bounds refuse.
type Limits struct {
	refused *prometheus.CounterVec
}

// NewLimits registers on reg, with no labels but "limit" (a closed set):
//   - kadmit_server_in_flight_requests: admission requests in flight,
//     abandoned reviews that kept their slot included;
//     kadmit_server_in_flight_requests_limit.
//   - kadmit_server_abandoned_reviews: reviews answered 500 at their
//     deadline whose policy has not returned yet.
//   - kadmit_server_body_bytes: request-body buffer bytes reserved;
//     kadmit_server_body_bytes_limit.
//   - kadmit_server_open_connections: admission connections open;
//     kadmit_server_open_connections_limit.
//   - kadmit_server_refused_total{limit="connections"|"in-flight"|"body-bytes"|"metrics-connections"}:
//     connections closed at accept (or, on the metrics listener, evicted)
//     and requests answered 503 by a bound.
//
// It returns an error when a metric is already registered on reg.
func NewLimits(reg prometheus.Registerer, src LimitsSource) (*Limits, error) {
	l := &Limits{refused: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kadmit_server_refused_total",
		Help: "Connections closed at accept and requests answered 503 because a server bound was reached, by bound.",
	}, []string{"limit"})}
	if err := register(reg,
		l.refused,
		gauge("kadmit_server_in_flight_requests", "Admission requests in flight, abandoned reviews beyond --max-abandoned-reviews (which keep their slot) included.", src.InFlight),
		gauge("kadmit_server_in_flight_requests_limit", "Bound on kadmit_server_in_flight_requests (--max-in-flight).", constant(src.MaxInFlight)),
		gauge("kadmit_server_abandoned_reviews", "Reviews answered 500 at their deadline whose policy has not returned yet.", src.Abandoned),
		gauge("kadmit_server_body_bytes", "Request-body buffer bytes reserved by requests in flight.", src.BodyBytes),
		gauge("kadmit_server_body_bytes_limit", "Bound on kadmit_server_body_bytes (--max-body-bytes-in-flight).", constant(src.MaxBodyBytes)),
		gauge("kadmit_server_open_connections", "Admission listener connections open.", src.Connections),
		gauge("kadmit_server_open_connections_limit", "Bound on kadmit_server_open_connections (--max-connections).", constant(src.MaxConnections)),
	); err != nil {
		return nil, err
	}
	for _, lim := range []string{"connections", "in-flight", "body-bytes", "metrics-connections"} {
		l.refused.WithLabelValues(lim)
	}
	return l, nil
}

// Refused counts one refusal by bound: "connections", "in-flight",
// "body-bytes" or "metrics-connections"; any other value is counted as
// "other".
func (l *Limits) Refused(limit string) {
	switch limit {
	case "connections", "in-flight", "body-bytes", "metrics-connections":
	default:
		limit = "other"
	}
	l.refused.WithLabelValues(limit).Inc()
}

// gauge is a GaugeFunc reading f.
func gauge(name, help string, f func() int64) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 { return float64(f()) })
}

// constant is a source always reporting v (a bound's limit gauge).
func constant(v int64) func() int64 { return func() int64 { return v } }

// register registers cs on reg in order, stopping at the first error.
func register(reg prometheus.Registerer, cs ...prometheus.Collector) error {
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
