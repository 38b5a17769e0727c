package metrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Registration are the registrar's metrics: its writes of the webhook
// configurations and its fights over their caBundle
// (registration.ContestObserver). Every series is labelled kind
// (MutatingWebhookConfiguration or ValidatingWebhookConfiguration) and
// configuration (the install's one name, --webhook-config-name), so there
// are at most two of each per process; kadmit_registration_ca_bundle_contested
// adds the other field manager, already bounded by the registrar
// (registration.MaxManagerBytes), and keeps one series per configuration:
// a new manager replaces the previous one's series. A nil *Registration
// records nothing.
type Registration struct {
	writes    *prometheus.CounterVec
	reverts   *prometheus.CounterVec
	contested *prometheus.GaugeVec
	backoff   *prometheus.GaugeVec

	mu sync.Mutex
	// manager is the manager label of each configuration's contested
	// series, keyed kind+"/"+configuration; bounded like the series.
	manager map[string]string
}

// NewRegistration registers on reg:
//   - kadmit_registration_writes_total{kind,configuration}: server-side
//     applies of the configuration by this replica (first registration,
//     changes, repairs).
//   - kadmit_registration_ca_bundle_reverts_total{kind,configuration}: this
//     replica's writes whose caBundle another field manager rewrote or
//     removed afterwards (each undone write counted once).
//   - kadmit_registration_ca_bundle_contested{kind,configuration,manager}:
//     1 while another field manager keeps rewriting the caBundle and the
//     registrar backs off; no series otherwise.
//   - kadmit_registration_repair_backoff_seconds{kind,configuration}: the
//     wait before repairing the latest revert, seconds (0: repaired at
//     once; no series before a fight).
//
// It returns an error when a metric is already registered on reg.
func NewRegistration(reg prometheus.Registerer) (*Registration, error) {
	lk := []string{"kind", "configuration"}
	m := &Registration{
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kadmit_registration_writes_total",
			Help: "Server-side applies of kadmit's webhook configurations by this replica.",
		}, lk),
		reverts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kadmit_registration_ca_bundle_reverts_total",
			Help: "Writes of this replica whose caBundle another field manager rewrote or removed afterwards.",
		}, lk),
		contested: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kadmit_registration_ca_bundle_contested",
			Help: "1 while another field manager (label manager) keeps rewriting the configuration's caBundle and kadmit backs off instead of fighting.",
		}, []string{"kind", "configuration", "manager"}),
		backoff: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kadmit_registration_repair_backoff_seconds",
			Help: "Wait before kadmit repairs the latest revert of a contested caBundle, in seconds (0: at once).",
		}, lk),
		manager: map[string]string{},
	}
	if err := register(reg, m.writes, m.reverts, m.contested, m.backoff); err != nil {
		return nil, err
	}
	return m, nil
}

// Wrote counts one apply of the configuration.
func (m *Registration) Wrote(kind, name string) {
	if m != nil {
		m.writes.WithLabelValues(kind, name).Inc()
	}
}

// Reverted counts one write undone by another field manager.
func (m *Registration) Reverted(kind, name string) {
	if m != nil {
		m.reverts.WithLabelValues(kind, name).Inc()
	}
}

// Contested sets the configuration's fight: manager "" ends it (the
// contested series is deleted, the backoff set to 0).
func (m *Registration) Contested(kind, name, manager string, backoff time.Duration) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	key := kind + "/" + name
	if prev, ok := m.manager[key]; ok && prev != manager {
		m.contested.DeleteLabelValues(kind, name, prev)
		delete(m.manager, key)
	}
	m.backoff.WithLabelValues(kind, name).Set(backoff.Seconds())
	if manager == "" {
		return
	}
	m.manager[key] = manager
	m.contested.WithLabelValues(kind, name, manager).Set(1)
}
