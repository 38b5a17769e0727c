package reservation

import (
	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/clustercache"
	"github.com/kadmit/kadmit/internal/policy"
	"github.com/kadmit/kadmit/internal/policy/colocation"
)

// Definition is the reservation policy's entry in builtin.Registry: section
// policies.reservation, off in the seed profile (upstream's
// ReservationMutatingWebhook feature gate is off by default,
// pkg/features/features.go:115). Profiles with a priorityClassName read
// PriorityClasses from the cluster caches; offline see colocation.Profiles.Apply.
var Definition = &policy.Definition[Config]{
	PolicyName: Name,
	SectionKey: "reservation",
	Defaults:   DefaultConfig,
	Caches: func(cfg Config) []clustercache.Resource {
		return colocation.Caches(cfg.Profiles, false)
	},
	Build: func(cfg Config, env policy.Env) ([]admission.Hook, error) {
		p, err := New(cfg, colocation.PriorityClassesFrom(env, cfg.Profiles))
		if err != nil {
			return nil, err
		}
		return p.Hooks(), nil
	},
}
