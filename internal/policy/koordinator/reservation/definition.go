package reservation

import (
	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/clustercache"
	"github.com/kadmit/kadmit/internal/policy"
	"github.com/kadmit/kadmit/internal/policy/koordinator/colocation"
)

// Definition is the reservation policy's entry in builtin.Registry: section
// policies.reservation, off in the seed profile (upstream's
// ReservationMutatingWebhook feature gate is off by default,
// pkg/features/features.go:115). Profiles with a priorityClassName read
// PriorityClasses, and checkAllocations Reservations, from the cluster
// caches; offline see colocation.Profiles.Apply and checkAllocations.
var Definition = &policy.Definition[Config]{
	PolicyName: Name,
	SectionKey: "reservation",
	Defaults:   DefaultConfig,
	// Of a Reservation checkAllocations reads status.phase, allocatable
	// and allocated (reservationStore).
	Caches: func(cfg Config) []clustercache.Read {
		out := colocation.Caches(cfg.Profiles, false)
		if cfg.CheckAllocations {
			out = append(out, Reservations.Keep(clustercache.P("status", "phase"), clustercache.P("status", "allocatable"), clustercache.P("status", "allocated")))
		}
		return out
	},
	Build: func(cfg Config, env policy.Env) ([]admission.Hook, error) {
		var rs ReservationLookup
		if cfg.CheckAllocations {
			if inf, ok := env.Cluster.Informer(Reservations); ok {
				rs = reservationStore{inf.GetStore()}
			}
		}
		p, err := New(cfg, colocation.PriorityClassesFrom(env, cfg.Profiles), rs)
		if err != nil {
			return nil, err
		}
		return p.Hooks(), nil
	},
}
