package kadmitpolicies

import (
	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/policy"
)

// Definition is the kadmit-policies policy's entry in builtin.Registry:
// section policies.kadmitPolicies, on in the seed profile. It has hooks only
// when serve follows a policies ConfigMap (policy.Env.PoliciesConfigMap,
// set from --policies-configmap); offline and without the flag it has none.
var Definition = &policy.Definition[Config]{
	PolicyName:       Name,
	SectionKey:       "kadmitPolicies",
	EnabledByDefault: true,
	Defaults:         DefaultConfig,
	Build: func(_ Config, env policy.Env) ([]admission.Hook, error) {
		if env.PoliciesConfigMap == nil {
			return nil, nil
		}
		if env.PoliciesConfigMap.Namespace == "kube-system" {
			// kadmit never intercepts kube-system (a Fail webhook on its
			// ConfigMaps could stall the control plane's own writes):
			// there the ConfigMap is guarded by RBAC alone.
			if env.Log != nil {
				env.Log.Warn("policies ConfigMap in kube-system: not guarded by the kadmit-policies webhook, which never intercepts kube-system", "namespace", env.PoliciesConfigMap.Namespace, "name", env.PoliciesConfigMap.Name)
			}
			return nil, nil
		}
		p, err := New(*env.PoliciesConfigMap)
		if err != nil {
			return nil, err
		}
		return p.Hooks(), nil
	},
}
