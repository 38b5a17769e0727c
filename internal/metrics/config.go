package metrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// ConfigReloads counts live configuration reloads. A nil *ConfigReloads
// records nothing.
type ConfigReloads struct {
	total *prometheus.CounterVec
}

// NewConfigReloads registers kadmit_config_reloads_total{success="true"|"false"}
// on reg: configurations applied, and edits refused because they did not
// validate (the running configuration is kept).
func NewConfigReloads(reg prometheus.Registerer) (*ConfigReloads, error) {
	c := &ConfigReloads{total: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kadmit_config_reloads_total",
		Help: "Live configuration reloads, by whether the new configuration was applied.",
	}, []string{"success"})}
	if err := reg.Register(c.total); err != nil {
		return nil, err
	}
	return c, nil
}

// Reloaded counts one reload attempt.
func (c *ConfigReloads) Reloaded(ok bool) {
	if c != nil {
		c.total.WithLabelValues(strconv.FormatBool(ok)).Inc()
	}
}

// DeclaredPolicies reports whether serve's declared policies are served. A
// nil *DeclaredPolicies records nothing.
type DeclaredPolicies struct {
	unserved prometheus.Gauge
}

// NewDeclaredPolicies registers kadmit_declared_policies_unserved on reg: 1
// while serve has declared policy sources (--policies,
// --policies-configmap) and serves none of them because the set it
// started with did not load (it serves the built-in policies meanwhile),
// else 0. A refused live edit leaves it 0: the running set stays served
// (kadmit_config_reloads_total{success="false"} counts those).
func NewDeclaredPolicies(reg prometheus.Registerer) (*DeclaredPolicies, error) {
	d := &DeclaredPolicies{unserved: prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kadmit_declared_policies_unserved",
		Help: "1 while the declared policies did not load at start and only the built-in policies are served, else 0.",
	})}
	if err := reg.Register(d.unserved); err != nil {
		return nil, err
	}
	return d, nil
}

// Served records whether the declared policies are served.
func (d *DeclaredPolicies) Served(ok bool) {
	if d == nil {
		return
	}
	if ok {
		d.unserved.Set(0)
	} else {
		d.unserved.Set(1)
	}
}
