package kadmitconfig

import (
	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/policy"
)

// Definition is the kadmit-config policy's entry in builtin.Registry:
// section policies.kadmitConfig, off in the seed profile. It validates
// kadmit's own configuration ConfigMap with the loader serve uses
// (policy.Env.LoadConfig).
var Definition = &policy.Definition[Config]{
	PolicyName: Name,
	SectionKey: "kadmitConfig",
	Defaults:   DefaultConfig,
	Build: func(cfg Config, env policy.Env) ([]admission.Hook, error) {
		p, err := New(cfg, LoadFunc(env.LoadConfig))
		if err != nil {
			return nil, err
		}
		return p.Hooks(), nil
	},
}
