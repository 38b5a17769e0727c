// Package clustercache holds the informer caches that policies reading
// cluster state (Kueue LocalQueues, Koordinator ElasticQuotas and pods,
// namespace labels) consult on the admission path. Policies never call the
// API server while answering a review: they read these caches.
//
// A policy declares the resources it reads and the fields of their objects
// it reads (policy.Definition.Caches, a Read each); the server starts one
// informer per resource, which keeps of each object only the union of the
// declared fields (Pruner, an informer transform), waits for them to sync,
// and only then serves. A custom resource whose CRD is not served at start is left
// out and reported: the policy sees no such objects until a restart.
package clustercache

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// SyncTimeout bounds the wait for the caches before serving.
const SyncTimeout = 2 * time.Minute

// Resource is one cached resource. Built-in resources (core/v1 pods,
// namespaces) are cached as typed objects (*corev1.Pod); custom resources as
// *unstructured.Unstructured.
type Resource struct {
	schema.GroupVersionResource
	// Custom is true for a resource served by a CRD, which may be absent.
	Custom bool
	// Namespace, when set, limits the cache to that namespace: the informer
	// lists and watches only there, so kadmit needs a namespaced Role rather
	// than a cluster-wide read (slo-config's ConfigMap in
	// koordinator-system, not every ConfigMap in the cluster).
	Namespace string
}

// String is the resource as "resource.version.group", followed by
// " in namespace NS" when the cache is limited to one namespace.
func (r Resource) String() string {
	if r.Namespace == "" {
		return r.GroupVersionResource.String()
	}
	return r.GroupVersionResource.String() + " in namespace " + r.Namespace
}

// The resources policies read today.
var (
	Pods        = Resource{GroupVersionResource: schema.GroupVersionResource{Version: "v1", Resource: "pods"}}
	Namespaces  = Resource{GroupVersionResource: schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}}
	LocalQueues = Resource{GroupVersionResource: schema.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta1", Resource: "localqueues"}, Custom: true}
	// ElasticQuotas is the scheduler-plugins ElasticQuota that Koordinator uses.
	ElasticQuotas = Resource{GroupVersionResource: schema.GroupVersionResource{Group: "scheduling.sigs.k8s.io", Version: "v1alpha1", Resource: "elasticquotas"}, Custom: true}
)

// Key returns a stable identity for a set of reads: two sets with the same
// key (the same resources, keeping the same fields) can share one Caches.
func Key(reads []Read) string {
	byRes := group(reads)
	out := make([]string, 0, len(byRes))
	for r, rs := range byRes {
		out = append(out, r.String()+"{"+pruner(rs).String()+"}")
	}
	slices.Sort(out)
	return strings.Join(out, ";")
}

// group collects the reads of each resource.
func group(reads []Read) map[Resource][]Read {
	out := map[Resource][]Read{}
	for _, r := range reads {
		out[r.Resource] = append(out[r.Resource], r)
	}
	return out
}

// Caches is a set of started, synced informers.
type Caches struct {
	informers map[Resource]cache.SharedIndexInformer

	mu     sync.Mutex
	shared map[string]any
}

// Informer returns the informer of r, or false when r's CRD was not served
// at start. It panics when r was not requested from Start: a policy that
// reads a resource must declare it, and a test would catch the omission.
func (c *Caches) Informer(r Resource) (cache.SharedIndexInformer, bool) {
	if c == nil {
		return nil, false
	}
	inf, ok := c.informers[r]
	if !ok {
		panic(fmt.Sprintf("clustercache: %s was not declared by any enabled policy", r.String()))
	}
	return inf, inf != nil
}

// Start starts an informer for each resource reads name, running until ctx
// ends, and returns once they have synced, or an error after SyncTimeout.
// Each informer keeps of every object only the union of the fields the
// reads of its resource declare (Pruner), managedFields never.
//
// The initial sync streams the objects (client-go's WatchListClient, on by
// default since v0.35, against an API server serving watch-list): each
// object is decoded and pruned before the next, so the sync peak is one
// object plus the pruned cache. An API server that refuses watch-list gets
// a plain list instead, whose pages client-go's pager gathers whole before
// any is pruned (tools/pager ListWithAlloc, v0.37.1): paging would not
// lower that peak, so none is set.
func Start(ctx context.Context, rc *rest.Config, reads []Read, log *slog.Logger) (*Caches, error) {
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("cluster caches: client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("cluster caches: dynamic client: %w", err)
	}
	// One factory pair per namespace scope ("" is cluster-wide).
	typedF := map[string]informers.SharedInformerFactory{}
	dynamicF := map[string]dynamicinformer.DynamicSharedInformerFactory{}
	c := &Caches{informers: map[Resource]cache.SharedIndexInformer{}}
	byRes := group(reads)
	for _, rd := range reads {
		r := rd.Resource
		if _, done := c.informers[r]; done {
			continue
		}
		if typedF[r.Namespace] == nil {
			typedF[r.Namespace] = informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(r.Namespace))
			dynamicF[r.Namespace] = dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, 0, r.Namespace, nil)
		}
		typed := typedF[r.Namespace]
		var inf cache.SharedIndexInformer
		if r.Custom {
			ok, err := served(cs.Discovery(), r.GroupVersionResource)
			if err != nil {
				return nil, err
			}
			if !ok {
				log.Warn("CRD not served; the policies that read it see no such objects until kadmit restarts", "resource", r.String())
				c.informers[r] = nil
				continue
			}
			inf = dynamicF[r.Namespace].ForResource(r.GroupVersionResource).Informer()
		} else {
			gi, err := typed.ForResource(r.GroupVersionResource)
			if err != nil {
				return nil, fmt.Errorf("cluster caches: %s: %w", r.String(), err)
			}
			inf = gi.Informer()
		}
		if err := inf.SetTransform(pruner(byRes[r]).Transform()); err != nil {
			return nil, fmt.Errorf("cluster caches: %s transform: %w", r.String(), err)
		}
		c.informers[r] = inf
	}
	for ns := range typedF {
		typedF[ns].Start(ctx.Done())
		dynamicF[ns].Start(ctx.Done())
	}
	syncCtx, cancel := context.WithTimeout(ctx, SyncTimeout)
	defer cancel()
	for ns := range typedF {
		for t, ok := range typedF[ns].WaitForCacheSync(syncCtx.Done()) {
			if !ok {
				return nil, fmt.Errorf("cluster caches: %v did not sync within %s: %w", t, SyncTimeout, context.Cause(syncCtx))
			}
		}
		for r, ok := range dynamicF[ns].WaitForCacheSync(syncCtx.Done()) {
			if !ok {
				return nil, fmt.Errorf("cluster caches: %s did not sync within %s: %w", r.String(), SyncTimeout, context.Cause(syncCtx))
			}
		}
	}
	return c, nil
}

// served asks discovery, once at start, whether the API server serves gvr.
func served(d discovery.DiscoveryInterface, gvr schema.GroupVersionResource) (bool, error) {
	list, err := d.ServerResourcesForGroupVersion(gvr.GroupVersion().String())
	if err != nil {
		// An unknown group version is a 404: not served, not a failure.
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("cluster caches: discover %s: %w", gvr.GroupVersion(), err)
	}
	return slices.ContainsFunc(list.APIResources, func(r metav1.APIResource) bool { return r.Name == gvr.Resource }), nil
}

// Shared returns the value build makes from these caches, building it once
// per Caches: a view that registers indexers or event handlers on an
// informer (the ElasticQuota tree) is made once however often policies are
// rebuilt on a configuration reload, and goes away with the caches.
func (c *Caches) Shared(name string, build func() (any, error)) (any, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if v, ok := c.shared[name]; ok {
		return v, nil
	}
	v, err := build()
	if err != nil {
		return nil, err
	}
	if c.shared == nil {
		c.shared = map[string]any{}
	}
	c.shared[name] = v
	return v, nil
}
