// Package builtin is kadmit's policy registry: the list of built-in
// policies, one line each, and the two things done with it: parsing a
// configuration (Config) and building the enabled policies' hooks (Hooks).
// What kadmit serves, these and the declared policies together, is
// assembled above it, by package served.
package builtin

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/clustercache"
	"github.com/kadmit/kadmit/internal/config"
	"github.com/kadmit/kadmit/internal/policy"
	"github.com/kadmit/kadmit/internal/policy/kadmit/kadmitconfig"
	"github.com/kadmit/kadmit/internal/policy/kadmit/kadmitpolicies"
	"github.com/kadmit/kadmit/internal/policy/koordinator/colocation"
	"github.com/kadmit/kadmit/internal/policy/koordinator/elasticquota"
	"github.com/kadmit/kadmit/internal/policy/koordinator/nodeamplification"
	"github.com/kadmit/kadmit/internal/policy/koordinator/reservation"
	"github.com/kadmit/kadmit/internal/policy/koordinator/sloconfig"
	"github.com/kadmit/kadmit/internal/policy/kueue/jobqueue"
	"github.com/kadmit/kadmit/internal/policy/kueue/resourceflavor"
	"github.com/kadmit/kadmit/internal/policy/seed/lifespan"
	"github.com/kadmit/kadmit/internal/policy/seed/nodeovercommit"
	"github.com/kadmit/kadmit/internal/policy/seed/podname"
)

// Registry lists the built-in policies. The order is the order of hooks on a
// shared path: /validate-pod runs pod-name before the quota check, and
// /mutate-pod runs lifespan before the colocation profiles.
var Registry = policy.Registry{
	podname.Definition,
	lifespan.Definition,
	nodeovercommit.Definition,
	jobqueue.Definition,
	resourceflavor.Definition,
	reservation.Definition,
	elasticquota.Definition,
	colocation.Definition,
	kadmitconfig.Definition,
	kadmitpolicies.Definition,
	sloconfig.Definition,
	nodeamplification.Definition,
}

// Config parses configurations with the built-in policies' sections.
var Config = config.Loader{Registry: Registry}

// Caches lists the cluster caches cfg's enabled policies read; empty when
// none reads cluster state (the seed profile).
func Caches(cfg *config.Configuration) []clustercache.Read {
	var out []clustercache.Read
	for _, s := range cfg.Policies {
		out = append(out, s.Caches()...)
	}
	return out
}

// Hooks builds every enabled policy of cfg and returns their hooks in
// registry order, each with a configured failurePolicy in place of its
// default. It returns an error naming the policy when one cannot be built.
//
// env.Cluster carries the caches Caches(cfg) lists, started by the caller
// (the server); nil means offline (`kadmit review`). env.LoadConfig defaults
// to Config.FromConfigMap.
func Hooks(cfg *config.Configuration, env policy.Env) ([]admission.Hook, error) {
	if env.LoadConfig == nil {
		env.LoadConfig = func(cm *corev1.ConfigMap, key string) error {
			_, err := Config.FromConfigMap(cm, key)
			return err
		}
	}
	var hooks []admission.Hook
	for _, s := range cfg.Policies {
		hs, err := s.Hooks(env)
		if err != nil {
			return nil, fmt.Errorf("policy %s: %w", s.Entry().Name(), err)
		}
		hooks = append(hooks, hs...)
	}
	return hooks, nil
}

// Webhooks is Hooks grouped by path with admission.NewWebhooks.
func Webhooks(cfg *config.Configuration, env policy.Env) ([]*admission.Webhook, error) {
	hooks, err := Hooks(cfg, env)
	if err != nil {
		return nil, err
	}
	return admission.NewWebhooks(hooks)
}
