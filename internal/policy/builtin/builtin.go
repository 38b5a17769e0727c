// Package builtin turns a configuration into the hooks of the enabled
// built-in policies, in the order the server and review run them.
package builtin

import (
	"fmt"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/config"
	"github.com/kadmit/kadmit/internal/policy/colocation"
	"github.com/kadmit/kadmit/internal/policy/elasticquota"
	"github.com/kadmit/kadmit/internal/policy/jobqueue"
	"github.com/kadmit/kadmit/internal/policy/kadmitconfig"
	"github.com/kadmit/kadmit/internal/policy/lifespan"
	"github.com/kadmit/kadmit/internal/policy/nodeovercommit"
	"github.com/kadmit/kadmit/internal/policy/podname"
	"github.com/kadmit/kadmit/internal/policy/resourceflavor"
)

// Hooks builds every enabled policy from cfg and returns their hooks, with a
// configured failurePolicy replacing the policy's default. It returns an error
// naming the policy when one cannot be built.
//
// cluster carries the informer caches of a running server (StartCluster); nil
// means offline (`kadmit review`): job-queue then knows only configured
// queues and admits others with a warning, colocation matches namespaces by
// name only, and elastic-quota skips the checks against other quotas and pods
// with a warning.
//
// The order, which is the order on shared paths, is pod-name, lifespan,
// node-overcommit, job-queue, resource-flavor, elastic-quota, colocation,
// kadmit-config: so /validate-pod runs pod-name before the quota check and
// /mutate-pod runs lifespan before the colocation profiles.
func Hooks(cfg *config.Configuration, cluster *Cluster) ([]admission.Hook, error) {
	if cluster == nil {
		cluster = &Cluster{}
	}
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
	if err := add(jobqueue.Name, p.JobQueue.Enabled, p.JobQueue.FailurePolicy, func() ([]admission.Hook, error) {
		opts := jobqueue.Options{Offline: !cluster.Online}
		// A typed nil in the interface would look like a lister.
		if cluster.LocalQueues != nil {
			opts.LocalQueues = cluster.LocalQueues
		}
		pol, err := jobqueue.New(p.JobQueue, opts)
		if err != nil {
			return nil, err
		}
		return pol.Hooks(), nil
	}); err != nil {
		return nil, err
	}
	if err := add(resourceflavor.Name, p.ResourceFlavor.Enabled, p.ResourceFlavor.FailurePolicy, func() ([]admission.Hook, error) {
		pol, err := resourceflavor.New(p.ResourceFlavor)
		if err != nil {
			return nil, err
		}
		return pol.Hooks(), nil
	}); err != nil {
		return nil, err
	}
	if err := add(elasticquota.Name, p.ElasticQuota.Enabled, p.ElasticQuota.FailurePolicy, func() ([]admission.Hook, error) {
		var c elasticquota.Cache
		if cluster.Quotas != nil {
			c = cluster.Quotas
		}
		pol, err := elasticquota.New(p.ElasticQuota, c)
		if err != nil {
			return nil, err
		}
		return pol.Hooks(), nil
	}); err != nil {
		return nil, err
	}
	if err := add(colocation.Name, p.Colocation.Enabled, p.Colocation.FailurePolicy, func() ([]admission.Hook, error) {
		var ns colocation.Namespaces
		if cluster.Namespaces != nil {
			ns = cluster.Namespaces
		}
		pol, err := colocation.New(p.Colocation, ns)
		if err != nil {
			return nil, err
		}
		return pol.Hooks(), nil
	}); err != nil {
		return nil, err
	}
	if err := add(kadmitconfig.Name, p.KadmitConfig.Enabled, p.KadmitConfig.FailurePolicy, func() ([]admission.Hook, error) {
		load := func(cm *corev1.ConfigMap, key string) error {
			_, err := config.FromConfigMap(cm, key)
			return err
		}
		pol, err := kadmitconfig.New(p.KadmitConfig, load)
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
func Webhooks(cfg *config.Configuration, cluster *Cluster) ([]*admission.Webhook, error) {
	hooks, err := Hooks(cfg, cluster)
	if err != nil {
		return nil, err
	}
	return admission.NewWebhooks(hooks)
}
