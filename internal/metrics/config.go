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
