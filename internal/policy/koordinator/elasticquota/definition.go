package elasticquota

import (
	"errors"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/clustercache"
	"github.com/kadmit/kadmit/internal/policy"
)

// Definition is the elastic-quota policy's entry in builtin.Registry:
// section policies.elasticQuota, off in the seed profile. It reads
// ElasticQuotas and pods from the cluster caches; offline it skips the
// checks against other quotas and pods with a warning.
var Definition = &policy.Definition[Config]{
	PolicyName: Name,
	SectionKey: "elasticQuota",
	Defaults:   DefaultConfig,
	Caches: func(Config) []clustercache.Read {
		return []clustercache.Read{QuotaFields, PodFields}
	},
	Build: func(cfg Config, env policy.Env) ([]admission.Hook, error) {
		var c Cache
		if env.Cluster != nil {
			// One tree per set of caches: a reload that keeps the caches
			// keeps the tree and its single event handler.
			v, err := env.Cluster.Shared(Name, func() (any, error) {
				quotas, _ := env.Cluster.Informer(clustercache.ElasticQuotas)
				pods, ok := env.Cluster.Informer(clustercache.Pods)
				if !ok {
					return nil, errPodsNotCached
				}
				ic, err := NewInformerCache(quotas, pods)
				if err != nil {
					return nil, err
				}
				if env.Log != nil {
					ic.OnParseError = func(ns, name string, err error) {
						env.Log.Warn("ElasticQuota left out of the quota tree", "namespace", ns, "name", name, "err", err)
					}
				}
				ic.Rebuild()
				return ic, nil
			})
			if err != nil {
				return nil, err
			}
			c = v.(*InformerCache)
		}
		p, err := New(cfg, c)
		if err != nil {
			return nil, err
		}
		return p.Hooks(), nil
	},
}

// QuotaFields are the fields of an ElasticQuota Parse reads: the tree's
// labels and annotations, spec.min, spec.max and status.used.
var QuotaFields = clustercache.ElasticQuotas.Keep(
	clustercache.P("metadata", "labels", LabelParent),
	clustercache.P("metadata", "labels", LabelIsParent),
	clustercache.P("metadata", "labels", LabelTreeID),
	clustercache.P("metadata", "labels", LabelIsRoot),
	clustercache.P("metadata", "labels", LabelAllowForceUpdate),
	clustercache.P("metadata", "annotations", AnnotationSharedWeight),
	clustercache.P("metadata", "annotations", AnnotationNamespaces),
	clustercache.P("metadata", "annotations", AnnotationAdmission),
	clustercache.P("metadata", "annotations", AnnotationMaxStrictCheckResourceKeys),
	clustercache.P("spec", "min"), clustercache.P("spec", "max"), clustercache.P("status", "used"),
)

// PodFields are the fields of a cached pod the quota checks read: its
// quota label (quotaNameOf), whether it still counts (counts: phase,
// deletion time and grace) and its effective request
// (podrequest.Effective: the containers' and init containers' resources,
// init containers' restartPolicy, pod-level resources, overhead). A pod's
// env, volumes, other annotations and status are not kept.
var PodFields = clustercache.Pods.Keep(
	clustercache.P("metadata", "labels", LabelQuotaName),
	clustercache.P("metadata", "deletionTimestamp"),
	clustercache.P("metadata", "deletionGracePeriodSeconds"),
	clustercache.P("spec", "containers", "resources"),
	clustercache.P("spec", "initContainers", "resources"),
	clustercache.P("spec", "initContainers", "restartPolicy"),
	clustercache.P("spec", "resources"),
	clustercache.P("spec", "overhead"),
	clustercache.P("status", "phase"),
)

// errPodsNotCached means the server started the caches without pods, which
// Definition.Caches asks for: a programming error.
var errPodsNotCached = errors.New("the pod cache is not running")
