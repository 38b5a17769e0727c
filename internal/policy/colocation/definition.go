package colocation

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/clustercache"
	"github.com/kadmit/kadmit/internal/policy"
)

// Definition is the colocation policy's entry in builtin.Registry: section
// policies.colocation, off in the seed profile. Profiles with a
// namespaceSelector read namespace labels from the cluster caches; offline
// they match namespaces by name only.
var Definition = &policy.Definition[Config]{
	PolicyName: Name,
	SectionKey: "colocation",
	Defaults:   DefaultConfig,
	Caches: func(cfg Config) []clustercache.Resource {
		for _, pr := range cfg.Profiles {
			if pr.NamespaceSelector != nil {
				return []clustercache.Resource{clustercache.Namespaces}
			}
		}
		return nil
	},
	Build: func(cfg Config, env policy.Env) ([]admission.Hook, error) {
		var ns Namespaces
		if inf, ok := env.Cluster.Informer(clustercache.Namespaces); ok {
			ns = namespaceStore{inf.GetStore()}
		}
		p, err := New(cfg, ns)
		if err != nil {
			return nil, err
		}
		return p.Hooks(), nil
	},
}

// namespaceStore answers namespace-label lookups from the informer's store.
type namespaceStore struct{ store cache.Store }

// NamespaceLabels implements Namespaces.
func (s namespaceStore) NamespaceLabels(name string) (map[string]string, bool) {
	obj, exists, err := s.store.GetByKey(name)
	if err != nil || !exists {
		return nil, false
	}
	ns, ok := obj.(*corev1.Namespace)
	if !ok {
		return nil, false
	}
	return ns.Labels, true
}
