package resourceflavor

import (
	"github.com/kadmit/kadmit/internal/policy"
)

// Definition is the resource-flavor policy's entry in builtin.Registry: section
// policies.resourceFlavor, off in the seed profile.
var Definition = &policy.Definition[Config]{
	PolicyName:       Name,
	SectionKey:       "resourceFlavor",
	EnabledByDefault: false,
	Defaults:         DefaultConfig,
	Build:            policy.BuildWith(New),
}
