package nodeamplification

import "github.com/kadmit/kadmit/internal/policy"

// Definition is the node-amplification policy's entry in builtin.Registry:
// section policies.nodeAmplification, off in the seed profile. It must be
// listed after node-overcommit, whose amplification it defers to.
var Definition = &policy.Definition[Config]{
	PolicyName: Name,
	SectionKey: "nodeAmplification",
	Defaults:   DefaultConfig,
	Build:      policy.BuildWith(New),
}
