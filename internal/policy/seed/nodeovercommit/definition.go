package nodeovercommit

import (
	"github.com/kadmit/kadmit/internal/policy"
)

// Definition is the node-overcommit policy's entry in builtin.Registry: section
// policies.nodeOvercommit, enabled in the seed profile.
var Definition = &policy.Definition[Config]{
	PolicyName:       Name,
	SectionKey:       "nodeOvercommit",
	EnabledByDefault: true,
	Defaults:         DefaultConfig,
	Build:            policy.BuildWith(New),
}
