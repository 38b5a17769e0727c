package podname

import (
	"github.com/kadmit/kadmit/internal/policy"
)

// Definition is the pod-name policy's entry in builtin.Registry: section
// policies.podName, enabled in the seed profile.
var Definition = &policy.Definition[Config]{
	PolicyName:       Name,
	SectionKey:       "podName",
	EnabledByDefault: true,
	Defaults:         DefaultConfig,
	Build:            policy.BuildWith(New),
}
