package metrics

import (
	"crypto/x509"

	"github.com/prometheus/client_golang/prometheus"
)

// Certificates are the TLS lifecycle metrics. A nil *Certificates records
// nothing, so callers need no checks.
type Certificates struct {
	expiry    *prometheus.GaugeVec
	rotations *prometheus.CounterVec
	reloads   prometheus.Counter
	errors    prometheus.Counter
}

// NewCertificates registers on reg:
//   - kadmit_certificate_expiry_timestamp_seconds{certificate="serving"|"ca"}:
//     NotAfter of the served certificate and of the signing CA, Unix seconds.
//   - kadmit_certificate_rotations_total{kind="serving"|"ca"}: certificates
//     this replica issued and wrote into the certificate Secret.
//   - kadmit_certificate_reloads_total: serving certificates swapped in.
//   - kadmit_certificate_reload_errors_total: unusable certificate sources seen.
func NewCertificates(reg prometheus.Registerer) (*Certificates, error) {
	c := &Certificates{
		expiry: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kadmit_certificate_expiry_timestamp_seconds",
			Help: "NotAfter of the served certificate and of the signing CA, as a Unix timestamp.",
		}, []string{"certificate"}),
		rotations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kadmit_certificate_rotations_total",
			Help: "Certificates this replica issued and wrote into the certificate Secret, by kind.",
		}, []string{"kind"}),
		reloads: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kadmit_certificate_reloads_total",
			Help: "Serving certificates swapped in without a restart.",
		}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kadmit_certificate_reload_errors_total",
			Help: "Unusable certificate sources seen (the current certificate is kept).",
		}),
	}
	for _, col := range []prometheus.Collector{c.expiry, c.rotations, c.reloads, c.errors} {
		if err := reg.Register(col); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// Loaded records a newly served certificate and its signing CA (ca may be nil).
func (c *Certificates) Loaded(serving, ca *x509.Certificate) {
	if c == nil {
		return
	}
	c.reloads.Inc()
	c.expiry.WithLabelValues("serving").Set(float64(serving.NotAfter.Unix()))
	if ca != nil {
		c.expiry.WithLabelValues("ca").Set(float64(ca.NotAfter.Unix()))
	}
}

// Rotated counts one certificate issued, kind "serving" or "ca".
func (c *Certificates) Rotated(kind string) {
	if c != nil {
		c.rotations.WithLabelValues(kind).Inc()
	}
}

// ReloadError counts one unusable certificate source.
func (c *Certificates) ReloadError() {
	if c != nil {
		c.errors.Inc()
	}
}
