package celpolicy

import (
	corelisters "k8s.io/client-go/listers/core/v1"

	"github.com/kadmit/kadmit/internal/clustercache"
)

// Caches are the cluster caches declared policies read: namespaces, for
// namespaceSelector and the namespaceObject variable, as the API server's
// policy plugins read them from its namespace informer (k8s.io/apiserver
// v0.37.1 pkg/admission/plugin/policy/matching). namespaceObject is the
// whole namespace, so the cache keeps it whole. `kadmit serve` starts
// them against the cluster (clustercache.Start), `kadmit review --state`
// fills them from manifests (clustercache.NewStatic); either way WithCluster
// hands them to the engine.
func Caches() []clustercache.Read {
	return []clustercache.Read{clustercache.Namespaces.Whole()}
}

// WithCluster returns opts with namespace lookups (Options.Namespaces)
// answered by cluster's namespace cache, which cluster must have been
// built with (Caches). A nil cluster (offline without a state) leaves
// opts as they are: every namespace then has only the label
// kubernetes.io/metadata.name.
func (o Options) WithCluster(cluster *clustercache.Caches) Options {
	if inf, ok := cluster.Informer(clustercache.Namespaces); ok {
		o.Namespaces = corelisters.NewNamespaceLister(inf.GetIndexer())
	}
	return o
}
