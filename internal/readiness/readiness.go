// Package readiness composes kadmit's one readiness answer, /readyz: ready
// means "the API server can call me now", and every condition that decides
// it is listed in one place (internal/serve) as a Gate.
package readiness

import "fmt"

// Condition is one named readiness condition; Check returns nil when it
// holds, else why not.
type Condition struct {
	Name  string
	Check func() error
	// Degraded marks a condition that /readyz reports but that does not
	// make the replica unready: the API server can still call it for
	// everything else it serves, and taking it out of the Service's
	// endpoints would fail every webhook, not only the part the condition
	// is about (kadmit's declaredPolicies: a set that did not load at
	// start). Check skips it; Degraded reports it.
	Degraded bool
}

// Gate is an ordered list of conditions, all of which must hold.
type Gate []Condition

// Check returns nil when every condition holds, else the first failing one
// as "<name>: <reason>" (wrapping the reason). A nil Check is skipped.
func (g Gate) Check() error { return g.first(false) }

// Degraded returns nil when every Degraded condition holds, else the first
// failing one as "<name>: <reason>" (wrapping the reason). /readyz still
// answers 200 and says so in its body.
func (g Gate) Degraded() error { return g.first(true) }

// first returns the first failing condition whose Degraded is degraded,
// as "<name>: <reason>"; a nil Check is skipped.
func (g Gate) first(degraded bool) error {
	for _, c := range g {
		if c.Check == nil || c.Degraded != degraded {
			continue
		}
		if err := c.Check(); err != nil {
			return fmt.Errorf("%s: %w", c.Name, err)
		}
	}
	return nil
}
