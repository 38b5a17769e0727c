package elasticquota

import (
	"fmt"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"
)

const quotaLabelIndex = "kadmit.io/quota-label"

// InformerCache is the Cache of a running server: a quota snapshot rebuilt
// on every ElasticQuota event and a pod indexer, both fed by informers.
// Readers only load a pointer or read an index, so a request never waits on
// the API server.
type InformerCache struct {
	snap   atomic.Pointer[Snapshot]
	quotas cache.Store
	pods   cache.Indexer
	// OnParseError, when set, hears about quotas left out of the snapshot
	// because they do not parse (written while kadmit was not looking).
	OnParseError func(namespace, name string, err error)
}

// NewInformerCache wires the cache to an informer of unstructured
// ElasticQuotas and an informer of pods. Call it before the informers start:
// it adds the pod indexers and the quota event handler. quotas is nil when
// the ElasticQuota CRD is not served: the snapshot then stays empty, so no
// pod is bound to a quota.
func NewInformerCache(quotas, pods cache.SharedIndexInformer) (*InformerCache, error) {
	c := &InformerCache{pods: pods.GetIndexer()}
	c.snap.Store(NewSnapshot(nil))
	indexers := cache.Indexers{
		quotaLabelIndex: func(obj any) ([]string, error) {
			m, err := meta.Accessor(obj)
			if err != nil {
				return nil, nil
			}
			if v := m.GetLabels()[LabelQuotaName]; v != "" {
				return []string{v}, nil
			}
			return nil, nil
		},
	}
	// Informers from a SharedInformerFactory already index by namespace.
	if _, ok := pods.GetIndexer().GetIndexers()[cache.NamespaceIndex]; !ok {
		indexers[cache.NamespaceIndex] = cache.MetaNamespaceIndexFunc
	}
	if err := pods.AddIndexers(indexers); err != nil {
		return nil, fmt.Errorf("elastic-quota: pod indexers: %w", err)
	}
	if quotas == nil {
		return c, nil
	}
	c.quotas = quotas.GetStore()
	rebuild := func(any) { c.Rebuild() }
	if _, err := quotas.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: rebuild, UpdateFunc: func(_, o any) { rebuild(o) }, DeleteFunc: rebuild,
	}); err != nil {
		return nil, fmt.Errorf("elastic-quota: quota event handler: %w", err)
	}
	return c, nil
}

// Rebuild replaces the snapshot with one built from the quota store. The
// informer calls it on every event; handlers of one informer run one at a
// time, so snapshots never go back in time.
func (c *InformerCache) Rebuild() {
	if c.quotas == nil {
		return
	}
	var qs []*Quota
	for _, obj := range c.quotas.List() {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		raw, err := u.MarshalJSON()
		if err == nil {
			var q *Quota
			if q, err = Parse(raw); err == nil {
				qs = append(qs, q)
				continue
			}
		}
		if c.OnParseError != nil {
			c.OnParseError(u.GetNamespace(), u.GetName(), err)
		}
	}
	c.snap.Store(NewSnapshot(qs))
}

// Snapshot implements Cache.
func (c *InformerCache) Snapshot() *Snapshot { return c.snap.Load() }

// PodsWithQuotaLabel implements Cache.
func (c *InformerCache) PodsWithQuotaLabel(name string) []*corev1.Pod {
	return c.podsBy(quotaLabelIndex, name)
}

// PodsInNamespace implements Cache.
func (c *InformerCache) PodsInNamespace(ns string) []*corev1.Pod {
	return c.podsBy(cache.NamespaceIndex, ns)
}

func (c *InformerCache) podsBy(index, value string) []*corev1.Pod {
	objs, err := c.pods.ByIndex(index, value)
	if err != nil {
		return nil
	}
	out := make([]*corev1.Pod, 0, len(objs))
	for _, o := range objs {
		if p, ok := o.(*corev1.Pod); ok {
			out = append(out, p)
		}
	}
	return out
}
