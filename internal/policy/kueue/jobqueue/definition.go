package jobqueue

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/clustercache"
	"github.com/kadmit/kadmit/internal/policy"
)

// Definition is the job-queue policy's entry in builtin.Registry: section
// policies.jobQueue, off in the seed profile. It reads Kueue's LocalQueues
// (LocalQueueDefaulting, requireQueue) and, with
// manageJobsWithoutQueueName, namespaces from the cluster caches; offline
// (`kadmit review` without --state) what needs them is skipped with a
// warning.
var Definition = &policy.Definition[Config]{
	PolicyName: Name,
	SectionKey: "jobQueue",
	Defaults:   DefaultConfig,
	// A LocalQueue is only looked up by name; a namespace by its labels.
	Caches: func(cfg Config) []clustercache.Read {
		rs := []clustercache.Read{clustercache.LocalQueues.Keep()}
		if cfg.ManageJobsWithoutQueueName {
			rs = append(rs, clustercache.Namespaces.Keep(clustercache.P("metadata", "labels")))
		}
		return rs
	},
	Build: func(cfg Config, env policy.Env) ([]admission.Hook, error) {
		opts := Options{Offline: env.Cluster == nil}
		if inf, ok := env.Cluster.Informer(clustercache.LocalQueues); ok {
			opts.LocalQueues = localQueueStore{inf.GetStore()}
		}
		if cfg.ManageJobsWithoutQueueName {
			if inf, ok := env.Cluster.Informer(clustercache.Namespaces); ok {
				opts.Namespaces = namespaceStore{inf.GetStore()}
			}
		}
		p, err := New(cfg, opts)
		if err != nil {
			return nil, err
		}
		return p.Hooks(), nil
	},
}

// localQueueStore answers LocalQueue lookups from the informer's store.
type localQueueStore struct{ store cache.Store }

// HasLocalQueue implements LocalQueues.
func (s localQueueStore) HasLocalQueue(namespace, name string) bool {
	_, exists, err := s.store.GetByKey(namespace + "/" + name)
	return err == nil && exists
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
