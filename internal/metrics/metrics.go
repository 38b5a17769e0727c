// Package metrics holds kadmit's Prometheus metrics and the decorators that
// feed them, so the admission path itself knows nothing of Prometheus.
package metrics

import (
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kadmit/kadmit/internal/admission"
)

// Metrics are kadmit's admission metrics, registered on one registry.
type Metrics struct {
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	inFlight *prometheus.GaugeVec
	panics   *prometheus.CounterVec
}

// New creates the metrics and registers them on reg:
//   - kadmit_admission_requests_total{webhook,operation,allowed,code}: answered
//     requests; code is the HTTP status, allowed is "true", "false" or "" (no
//     decision), operation is CREATE, UPDATE, DELETE, CONNECT, "" or "other".
//   - kadmit_admission_duration_seconds{webhook,operation}: time from request
//     read to answer written.
//   - kadmit_admission_in_flight_requests{webhook}: requests being served.
//   - kadmit_admission_panics_total{webhook,policy}: recovered policy panics.
//
// It returns an error when a metric is already registered on reg.
func New(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kadmit_admission_requests_total",
			Help: "AdmissionReview requests answered, by webhook path, operation, decision and HTTP status code.",
		}, []string{"webhook", "operation", "allowed", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kadmit_admission_duration_seconds",
			Help:    "Time to answer an AdmissionReview, in seconds.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"webhook", "operation"}),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kadmit_admission_in_flight_requests",
			Help: "AdmissionReview requests being served.",
		}, []string{"webhook"}),
		panics: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kadmit_admission_panics_total",
			Help: "Policy panics recovered and answered with HTTP 500.",
		}, []string{"webhook", "policy"}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.latency, m.inFlight, m.panics} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Operation maps a request's operation to the closed set of label values:
// CREATE, UPDATE, DELETE, CONNECT, "" (no decoded request) or "other".
// The operation comes from the client; a label taken from it verbatim would
// let each distinct string add series until /metrics is megabytes.
func Operation(op string) string {
	switch op {
	case "CREATE", "UPDATE", "DELETE", "CONNECT", "":
		return op
	default:
		return "other"
	}
}

// Code maps an HTTP status to its label value; kadmit writes only a handful
// of statuses, anything else (none today) is "other".
func Code(code int) string {
	switch code {
	case http.StatusOK, http.StatusBadRequest, http.StatusMethodNotAllowed, http.StatusRequestTimeout,
		http.StatusRequestEntityTooLarge, http.StatusUnsupportedMediaType,
		http.StatusInternalServerError, http.StatusServiceUnavailable:
		return strconv.Itoa(code)
	default:
		return "other"
	}
}

// Observe records one answered request. Every label value is from a closed
// set: the webhook is a served path (the caller routes only registered
// paths here), the operation and code go through Operation and Code, the
// policy of a panic is a registered policy name.
func (m *Metrics) Observe(d admission.Decision) {
	allowed := ""
	if d.HTTPCode == http.StatusOK {
		allowed = strconv.FormatBool(d.Allowed)
	}
	op := Operation(d.Operation)
	m.requests.WithLabelValues(d.Webhook, op, allowed, Code(d.HTTPCode)).Inc()
	m.latency.WithLabelValues(d.Webhook, op).Observe(d.Latency.Seconds())
	if d.Panic != nil {
		m.panics.WithLabelValues(d.Webhook, d.Panic.Policy).Inc()
	}
}

// InFlight wraps next so the in-flight gauge counts its requests.
func (m *Metrics) InFlight(webhook string, next http.Handler) http.Handler {
	g := m.inFlight.WithLabelValues(webhook)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.Inc()
		defer g.Dec()
		next.ServeHTTP(w, r)
	})
}
