package watch

import (
	"context"
	"maps"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	appslisters "k8s.io/client-go/listers/apps/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

// workloads are the cluster-wide pod, ReplicaSet, Deployment, StatefulSet
// and DaemonSet informers of one set of spec namespaces: objects in those
// namespaces (the namespaces of webhook Services) keep what the checks read,
// the pod spec and the workload template included (prune.go); elsewhere
// only labels and owner references, so a user's pods of 1.4 MB in their own
// namespace cost a few hundred bytes each. The checks only read pods and
// workloads in namespaces holding a webhook Service (snapshot.go backend).
type workloads struct {
	specNS map[string]bool
	stop   context.CancelFunc
	synced []cache.InformerSynced

	pods         corelisters.PodLister
	replicaSets  appslisters.ReplicaSetLister
	deployments  appslisters.DeploymentLister
	statefulSets appslisters.StatefulSetLister
	daemonSets   appslisters.DaemonSetLister
}

func (w *workloads) hasSynced() bool {
	for _, s := range w.synced {
		if !s() {
			return false
		}
	}
	return true
}

// serviceNamespaces are the namespaces of the Services the webhook
// configurations call.
func (c *cluster) serviceNamespaces() map[string]bool {
	out := map[string]bool{}
	if c.mutating != nil {
		ml, _ := c.mutating.List(labels.Everything())
		for _, m := range ml {
			for _, w := range m.Webhooks {
				if s := w.ClientConfig.Service; s != nil {
					out[s.Namespace] = true
				}
			}
		}
	}
	if c.validating != nil {
		vl, _ := c.validating.List(labels.Everything())
		for _, v := range vl {
			for _, w := range v.Webhooks {
				if s := w.ClientConfig.Service; s != nil {
					out[s.Namespace] = true
				}
			}
		}
	}
	return out
}

// growSpecNamespaces restarts the workload informers, in the background,
// when ns holds a namespace the running ones prune to labels and owner
// references: a new webhook Service's pods must be listed again with their
// spec. The set only grows, so restarts are bounded by the number of
// namespaces that ever held a webhook Service; until the new informers have
// synced, the old ones answer and a finding about that namespace's pods may
// lag by one re-list.
func (c *cluster) growSpecNamespaces(ns map[string]bool) {
	w := c.wl.Load()
	if w == nil || c.ctx == nil {
		return
	}
	for n := range ns {
		if !w.specNS[n] {
			// One restart at a time: evaluations during its re-list find
			// it running and leave it; the first one after the swap checks
			// again.
			if !c.restarting.CompareAndSwap(false, true) {
				return
			}
			union := maps.Clone(w.specNS)
			maps.Copy(union, ns)
			go func() {
				defer c.restarting.Store(false)
				c.restartWorkloads(union)
			}()
			return
		}
	}
}

// restartWorkloads starts workload informers keeping specs in specNS and,
// once they have synced, replaces the running ones with them (stopping
// those). The first call publishes at once: waitSynced waits for them. A
// call whose set is no larger than the running one's does nothing.
func (c *cluster) restartWorkloads(specNS map[string]bool) {
	c.wlMu.Lock()
	defer c.wlMu.Unlock()
	old := c.wl.Load()
	if old != nil {
		grows := false
		for n := range specNS {
			grows = grows || !old.specNS[n]
		}
		if !grows {
			return
		}
	}
	ctx, stop := context.WithCancel(c.ctx)
	w := &workloads{specNS: specNS, stop: stop}
	f := informers.NewSharedInformerFactoryWithOptions(c.cs, 0, informers.WithTransform(workloadTransform(specNS)))
	ok := func(r string) bool { return !c.unreadable[r] }
	add := func(inf cache.SharedIndexInformer) {
		if c.scoped != nil {
			if _, err := inf.AddEventHandler(c.scoped); err != nil {
				// Only a stopped informer refuses a handler; this one is new.
				panic(err)
			}
		}
		w.synced = append(w.synced, inf.HasSynced)
	}
	if ok("pods") {
		i := f.Core().V1().Pods()
		w.pods = i.Lister()
		add(i.Informer())
	}
	if ok("replicasets") {
		i := f.Apps().V1().ReplicaSets()
		w.replicaSets = i.Lister()
		add(i.Informer())
	}
	if ok("deployments") {
		i := f.Apps().V1().Deployments()
		w.deployments = i.Lister()
		add(i.Informer())
	}
	if ok("statefulsets") {
		i := f.Apps().V1().StatefulSets()
		w.statefulSets = i.Lister()
		add(i.Informer())
	}
	if ok("daemonsets") {
		i := f.Apps().V1().DaemonSets()
		w.daemonSets = i.Lister()
		add(i.Informer())
	}
	f.Start(ctx.Done())
	if old == nil {
		c.wl.Store(w)
		return
	}
	if !cache.WaitForCacheSync(ctx.Done(), w.synced...) {
		stop()
		return
	}
	c.wl.Store(w)
	old.stop()
}
