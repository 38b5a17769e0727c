// Package builtin turns a configuration into the hooks of the enabled
// built-in policies, in the order the server and review run them.
package builtin

import (
	"fmt"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/config"
	"github.com/kadmit/kadmit/internal/policy/lifespan"
	"github.com/kadmit/kadmit/internal/policy/nodeovercommit"
	"github.com/kadmit/kadmit/internal/policy/podname"
)

// Hooks builds every enabled policy from cfg and returns their hooks, with a
// configured failurePolicy replacing the policy's default. It returns an error
// naming the policy when one cannot be built.
func Hooks(cfg *config.Configuration) ([]admission.Hook, error) {
	var hooks []admission.Hook
	add := func(name string, enabled bool, fp *admissionregistrationv1.FailurePolicyType, build func() ([]admission.Hook, error)) error {
		if !enabled {
			return nil
		}
		hs, err := build()
		if err != nil {
			return fmt.Errorf("policy %s: %w", name, err)
		}
		for _, h := range hs {
			if fp != nil {
				h.FailurePolicy = *fp
			}
			hooks = append(hooks, h)
		}
		return nil
	}
	p := cfg.Policies
	if err := add(podname.Name, p.PodName.Enabled, p.PodName.FailurePolicy, func() ([]admission.Hook, error) {
		pol, err := podname.New(p.PodName)
		if err != nil {
			return nil, err
		}
		return pol.Hooks(), nil
	}); err != nil {
		return nil, err
	}
	if err := add(lifespan.Name, p.Lifespan.Enabled, p.Lifespan.FailurePolicy, func() ([]admission.Hook, error) {
		pol, err := lifespan.New(p.Lifespan)
		if err != nil {
			return nil, err
		}
		return pol.Hooks(), nil
	}); err != nil {
		return nil, err
	}
	if err := add(nodeovercommit.Name, p.NodeOvercommit.Enabled, p.NodeOvercommit.FailurePolicy, func() ([]admission.Hook, error) {
		pol, err := nodeovercommit.New(p.NodeOvercommit)
		if err != nil {
			return nil, err
		}
		return pol.Hooks(), nil
	}); err != nil {
		return nil, err
	}
	return hooks, nil
}

// Webhooks is Hooks grouped by path with admission.NewWebhooks.
func Webhooks(cfg *config.Configuration) ([]*admission.Webhook, error) {
	hooks, err := Hooks(cfg)
	if err != nil {
		return nil, err
	}
	return admission.NewWebhooks(hooks)
}
