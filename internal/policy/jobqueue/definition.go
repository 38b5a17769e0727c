package jobqueue

import (
	"k8s.io/client-go/tools/cache"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/clustercache"
	"github.com/kadmit/kadmit/internal/policy"
)

// Definition is the job-queue policy's entry in builtin.Registry: section
// policies.jobQueue, off in the seed profile. It reads Kueue's LocalQueues
// from the cluster caches; offline (`kadmit review`) it knows only the
// configured queues and admits others with a warning.
var Definition = &policy.Definition[Config]{
	PolicyName: Name,
	SectionKey: "jobQueue",
	Defaults:   DefaultConfig,
	Caches: func(Config) []clustercache.Resource {
		return []clustercache.Resource{clustercache.LocalQueues}
	},
	Build: func(cfg Config, env policy.Env) ([]admission.Hook, error) {
		opts := Options{Offline: env.Cluster == nil}
		if inf, ok := env.Cluster.Informer(clustercache.LocalQueues); ok {
			opts.LocalQueues = localQueueStore{inf.GetStore()}
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
