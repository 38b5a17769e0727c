package colocation

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/clustercache"
	"github.com/kadmit/kadmit/internal/policy"
)

// PriorityClassesResource is the scheduling.k8s.io/v1 PriorityClass cache a
// profile with a priorityClassName reads, where upstream Gets the class
// (cluster_colocation_profile.go:222-231).
var PriorityClassesResource = clustercache.Resource{GroupVersionResource: schema.GroupVersionResource{
	Group: "scheduling.k8s.io", Version: "v1", Resource: "priorityclasses"}}

// Definition is the colocation policy's entry in builtin.Registry: section
// policies.colocation, off in the seed profile. Profiles with a
// namespaceSelector read namespace labels, profiles with a
// priorityClassName PriorityClasses, from the cluster caches; offline see
// New.
var Definition = &policy.Definition[Config]{
	PolicyName: Name,
	SectionKey: "colocation",
	Defaults:   DefaultConfig,
	Caches: func(cfg Config) []clustercache.Read {
		return Caches(cfg.Profiles, true)
	},
	Build: func(cfg Config, env policy.Env) ([]admission.Hook, error) {
		p, err := New(cfg, NamespacesFrom(env, cfg.Profiles), WithPriorityClasses(PriorityClassesFrom(env, cfg.Profiles)))
		if err != nil {
			return nil, err
		}
		return p.Hooks(), nil
	},
}

// Caches lists the caches profiles read: namespaces (when withNamespaces
// and a profile has a namespaceSelector) and PriorityClasses (when a
// profile sets one).
//
// Of a namespace the profiles read its labels; of a PriorityClass its
// value and preemptionPolicy.
func Caches(profiles []Profile, withNamespaces bool) []clustercache.Read {
	var out []clustercache.Read
	var ns, pc bool
	for _, pr := range profiles {
		ns = ns || (withNamespaces && pr.NamespaceSelector != nil)
		pc = pc || pr.PriorityClassName != ""
	}
	if ns {
		out = append(out, clustercache.Namespaces.Keep(clustercache.P("metadata", "labels")))
	}
	if pc {
		out = append(out, PriorityClassesResource.Keep(clustercache.P("value"), clustercache.P("preemptionPolicy")))
	}
	return out
}

// NamespacesFrom returns the namespace cache of env when profiles read it
// (Caches), nil offline.
func NamespacesFrom(env policy.Env, profiles []Profile) Namespaces {
	if inf, ok := informer(env, profiles, clustercache.Namespaces); ok {
		return namespaceStore{inf.GetStore()}
	}
	return nil
}

// PriorityClassesFrom returns the PriorityClass cache of env when profiles
// read it (Caches), nil offline.
func PriorityClassesFrom(env policy.Env, profiles []Profile) PriorityClasses {
	if inf, ok := informer(env, profiles, PriorityClassesResource); ok {
		return classStore{inf.GetStore()}
	}
	return nil
}

// informer is env.Cluster.Informer(r) when profiles declare r.
func informer(env policy.Env, profiles []Profile, r clustercache.Resource) (cache.SharedIndexInformer, bool) {
	if !slices.ContainsFunc(Caches(profiles, true), func(rd clustercache.Read) bool { return rd.Resource == r }) {
		return nil, false
	}
	return env.Cluster.Informer(r)
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

// classStore answers PriorityClass lookups from the informer's store.
type classStore struct{ store cache.Store }

// PriorityClass implements PriorityClasses with the API server's NotFound
// error for a class not in the cache.
func (s classStore) PriorityClass(name string) (int32, *corev1.PreemptionPolicy, error) {
	obj, exists, err := s.store.GetByKey(name)
	if err != nil {
		return 0, nil, err
	}
	pc, ok := obj.(*schedulingv1.PriorityClass)
	if !exists || !ok {
		return 0, nil, apierrors.NewNotFound(schema.GroupResource{Group: "scheduling.k8s.io", Resource: "priorityclasses"}, name)
	}
	return pc.Value, pc.PreemptionPolicy, nil
}
