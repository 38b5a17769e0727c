package lifespan

import (
	"github.com/kadmit/kadmit/internal/policy"
)

// Definition is the Lifespan policy's entry in builtin.Registry: section
// policies.lifespan, enabled in the seed profile.
var Definition = &policy.Definition[Config]{
	PolicyName:       Name,
	SectionKey:       "lifespan",
	EnabledByDefault: true,
	Defaults:         DefaultConfig,
	Build:            policy.BuildWith(New),
}
