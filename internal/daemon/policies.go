package daemon

import (
	"fmt"

	corelisters "k8s.io/client-go/listers/core/v1"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/celpolicy"
	"github.com/kadmit/kadmit/internal/clustercache"
)

// declaredHooks loads and compiles the declared policies at paths and
// returns their hooks, namespace lookups answered by the cluster's
// namespace cache (nil offline: every namespace then has only its
// kubernetes.io/metadata.name label).
func declaredHooks(paths []string, cluster *clustercache.Caches) ([]admission.Hook, error) {
	var opts celpolicy.Options
	if cluster != nil {
		if inf, ok := cluster.Informer(clustercache.Namespaces); ok {
			opts.Namespaces = corelisters.NewNamespaceLister(inf.GetIndexer())
		}
	}
	set, err := celpolicy.Load(paths...)
	if err != nil {
		return nil, fmt.Errorf("--policies: %w", err)
	}
	e, err := celpolicy.New(set, opts)
	if err != nil {
		return nil, fmt.Errorf("--policies: %w", err)
	}
	return e.Hooks(), nil
}
