package builtin

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/kadmit/kadmit/internal/config"
	"github.com/kadmit/kadmit/internal/policy/elasticquota"
)

// The custom resources the scheduling policies read.
var (
	LocalQueueResource   = schema.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta1", Resource: "localqueues"}
	ElasticQuotaResource = schema.GroupVersionResource{Group: "scheduling.sigs.k8s.io", Version: "v1alpha1", Resource: "elasticquotas"}
)

// SyncTimeout bounds the wait for the informer caches before serving.
const SyncTimeout = 2 * time.Minute

// Cluster is what the policies that read cluster state see of it: informer
// caches, never the API server itself. The zero value (and nil) is offline.
type Cluster struct {
	// Online is true in `kadmit serve` with StartCluster's caches.
	Online bool
	// LocalQueues is nil when the LocalQueue CRD was not served at start.
	LocalQueues *LocalQueueCache
	// Quotas is nil unless elastic-quota is enabled.
	Quotas *elasticquota.InformerCache
	// Namespaces is nil unless a colocation profile has a namespaceSelector.
	Namespaces *NamespaceCache
}

// NeedsCluster reports whether an enabled policy reads cluster state:
// job-queue (LocalQueues), elastic-quota (quotas and pods) or colocation
// with a namespaceSelector (namespace labels).
func NeedsCluster(cfg *config.Configuration) bool {
	p := cfg.Policies
	return p.JobQueue.Enabled || p.ElasticQuota.Enabled || colocationNeedsNamespaces(cfg)
}

func colocationNeedsNamespaces(cfg *config.Configuration) bool {
	if !cfg.Policies.Colocation.Enabled {
		return false
	}
	for _, pr := range cfg.Policies.Colocation.Profiles {
		if pr.NamespaceSelector != nil {
			return true
		}
	}
	return false
}

// StartCluster starts the informers the enabled policies need, running
// until ctx ends, and returns once their caches have synced (or fails after
// SyncTimeout). A CRD that is not served when kadmit starts is logged and
// left out: job-queue then knows only its configured queues, elastic-quota
// sees no quotas. Installing the CRD later needs a restart.
func StartCluster(ctx context.Context, rc *rest.Config, cfg *config.Configuration, log *slog.Logger) (*Cluster, error) {
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("cluster caches: client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("cluster caches: dynamic client: %w", err)
	}
	typed := informers.NewSharedInformerFactory(cs, 0)
	dynamicF := dynamicinformer.NewDynamicSharedInformerFactory(dyn, 0)
	cl := &Cluster{Online: true}
	p := cfg.Policies

	if p.JobQueue.Enabled {
		ok, err := served(cs, LocalQueueResource)
		if err != nil {
			return nil, err
		}
		if ok {
			cl.LocalQueues = &LocalQueueCache{informer: dynamicF.ForResource(LocalQueueResource).Informer()}
		} else {
			log.Warn("LocalQueue CRD not served; job-queue knows only its configured queues", "resource", LocalQueueResource.String())
		}
	}
	if p.ElasticQuota.Enabled {
		ok, err := served(cs, ElasticQuotaResource)
		if err != nil {
			return nil, err
		}
		var quotas cache.SharedIndexInformer
		if ok {
			quotas = dynamicF.ForResource(ElasticQuotaResource).Informer()
		} else {
			log.Warn("ElasticQuota CRD not served; elastic-quota sees no quotas", "resource", ElasticQuotaResource.String())
		}
		pods := typed.Core().V1().Pods().Informer()
		// Managed fields are most of a pod's bytes and no check reads them.
		if err := pods.SetTransform(func(obj any) (any, error) {
			if m, err := meta.Accessor(obj); err == nil {
				m.SetManagedFields(nil)
			}
			return obj, nil
		}); err != nil {
			return nil, fmt.Errorf("cluster caches: pod transform: %w", err)
		}
		if cl.Quotas, err = elasticquota.NewInformerCache(quotas, pods); err != nil {
			return nil, err
		}
		cl.Quotas.OnParseError = func(ns, name string, err error) {
			log.Warn("ElasticQuota left out of the quota tree", "namespace", ns, "name", name, "err", err)
		}
	}
	if colocationNeedsNamespaces(cfg) {
		cl.Namespaces = &NamespaceCache{lister: typed.Core().V1().Namespaces().Lister()}
	}

	typed.Start(ctx.Done())
	dynamicF.Start(ctx.Done())
	syncCtx, cancel := context.WithTimeout(ctx, SyncTimeout)
	defer cancel()
	for t, ok := range typed.WaitForCacheSync(syncCtx.Done()) {
		if !ok {
			return nil, fmt.Errorf("cluster caches: %v did not sync within %s: %w", t, SyncTimeout, context.Cause(syncCtx))
		}
	}
	for r, ok := range dynamicF.WaitForCacheSync(syncCtx.Done()) {
		if !ok {
			return nil, fmt.Errorf("cluster caches: %s did not sync within %s: %w", r.String(), SyncTimeout, context.Cause(syncCtx))
		}
	}
	if cl.Quotas != nil {
		cl.Quotas.Rebuild()
	}
	return cl, nil
}

// served asks discovery, once at start, whether the API server serves gvr.
func served(cs kubernetes.Interface, gvr schema.GroupVersionResource) (bool, error) {
	list, err := cs.Discovery().ServerResourcesForGroupVersion(gvr.GroupVersion().String())
	if err != nil {
		// An unknown group version is a 404: not served, not a failure.
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("cluster caches: discover %s: %w", gvr.GroupVersion(), err)
	}
	return slices.ContainsFunc(list.APIResources, func(r metav1.APIResource) bool { return r.Name == gvr.Resource }), nil
}

// LocalQueueCache answers job-queue's LocalQueue lookups from an informer.
type LocalQueueCache struct{ informer cache.SharedIndexInformer }

// HasLocalQueue implements jobqueue.LocalQueues.
func (c *LocalQueueCache) HasLocalQueue(namespace, name string) bool {
	_, exists, err := c.informer.GetStore().GetByKey(namespace + "/" + name)
	return err == nil && exists
}

// NamespaceCache answers colocation's namespace-label lookups from an informer.
type NamespaceCache struct{ lister corev1listers.NamespaceLister }

// NamespaceLabels implements colocation.Namespaces.
func (c *NamespaceCache) NamespaceLabels(name string) (map[string]string, bool) {
	ns, err := c.lister.Get(name)
	if err != nil {
		return nil, false
	}
	return ns.Labels, true
}
