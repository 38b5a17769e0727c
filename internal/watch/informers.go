package watch

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	admissionlisters "k8s.io/client-go/listers/admissionregistration/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	policylisters "k8s.io/client-go/listers/policy/v1"
	"k8s.io/client-go/tools/cache"
)

// cluster is the informer-backed view the snapshot is built from: every
// resource doctor's checks read for a webhook, cluster-wide.
type cluster struct {
	factory informers.SharedInformerFactory
	synced  []cache.InformerSynced

	mutating   admissionlisters.MutatingWebhookConfigurationLister
	validating admissionlisters.ValidatingWebhookConfigurationLister
	namespaces corelisters.NamespaceLister
	services   corelisters.ServiceLister
	slices     discoverylisters.EndpointSliceLister
	pdbs       policylisters.PodDisruptionBudgetLister

	// cs builds the workload informers (workloads.go); wl holds the
	// running ones, replaced when a webhook Service appears in a namespace
	// whose pods and workloads were cached without their spec.
	cs     kubernetes.Interface
	wl     atomic.Pointer[workloads]
	scoped cache.ResourceEventHandler
	wlMu   sync.Mutex // serialises restarts of wl
	// restarting is true while a background restart of wl runs.
	restarting atomic.Bool
	// targetNS are the namespaces of pods the last snapshot's
	// EndpointSlices name (hand-made slices may point elsewhere): their
	// specs are read too. Written and read by the evaluation only.
	targetNS map[string]bool
	ctx      context.Context

	// unreadable names the resources this replica may not list and watch
	// (access.go): no informer runs for them, and every backend says so.
	unreadable map[string]bool
	// hookCache holds the converted webhooks of each configuration
	// version (snapshot.go); pruned to the existing configurations.
	hookCache map[string]cachedHooks

	// backendNS holds the namespaces of the Services webhooks call, as of
	// the last evaluation: workload and pod events elsewhere cannot change
	// a finding, so they do not trigger one.
	mu        sync.RWMutex
	backendNS map[string]bool
}

// newCluster prepares the informer factory. Objects are stored without
// managedFields, which no check reads; pods and workloads keep only the
// fields the checks read (transform, prune.go), to keep the cluster-wide
// caches small.
func newCluster(cs kubernetes.Interface) *cluster {
	f := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithTransform(transform))
	return &cluster{factory: f, cs: cs, backendNS: map[string]bool{}, unreadable: map[string]bool{}, hookCache: map[string]cachedHooks{}}
}

// register adds the informers of every readable resource, calling kick on
// every event that may change a finding. Call it once, before start.
func (c *cluster) register(unreadable map[string]bool, kick func()) error {
	f := c.factory
	c.unreadable = unreadable
	always := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { kick() },
		UpdateFunc: func(any, any) { kick() },
		DeleteFunc: func(any) { kick() },
	}
	inBackendNS := func(o any) {
		if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
			o = d.Obj
		}
		m, ok := o.(metav1.Object)
		if !ok {
			return
		}
		c.mu.RLock()
		hit := c.backendNS[m.GetNamespace()]
		c.mu.RUnlock()
		if hit {
			kick()
		}
	}
	scoped := cache.ResourceEventHandlerFuncs{
		AddFunc:    inBackendNS,
		UpdateFunc: func(_, n any) { inBackendNS(n) },
		DeleteFunc: inBackendNS,
	}
	c.scoped = scoped
	add := func(inf cache.SharedIndexInformer, h cache.ResourceEventHandler) error {
		if _, err := inf.AddEventHandler(h); err != nil {
			return fmt.Errorf("add event handler: %w", err)
		}
		c.synced = append(c.synced, inf.HasSynced)
		return nil
	}
	reg := f.Admissionregistration().V1()
	// Lister() starts an informer in the factory: only for readable ones.
	ok := func(r string) bool { return !unreadable[r] }
	if ok("mutatingwebhookconfigurations") {
		c.mutating = reg.MutatingWebhookConfigurations().Lister()
	}
	if ok("validatingwebhookconfigurations") {
		c.validating = reg.ValidatingWebhookConfigurations().Lister()
	}
	if ok("namespaces") {
		c.namespaces = f.Core().V1().Namespaces().Lister()
	}
	if ok("services") {
		c.services = f.Core().V1().Services().Lister()
	}
	if ok("endpointslices") {
		c.slices = f.Discovery().V1().EndpointSlices().Lister()
	}
	if ok("poddisruptionbudgets") {
		c.pdbs = f.Policy().V1().PodDisruptionBudgets().Lister()
	}
	for _, x := range []struct {
		resource string
		inf      func() cache.SharedIndexInformer
		h        cache.ResourceEventHandler
	}{
		{"mutatingwebhookconfigurations", reg.MutatingWebhookConfigurations().Informer, always},
		{"validatingwebhookconfigurations", reg.ValidatingWebhookConfigurations().Informer, always},
		{"namespaces", f.Core().V1().Namespaces().Informer, always},
		{"services", f.Core().V1().Services().Informer, scoped},
		{"endpointslices", f.Discovery().V1().EndpointSlices().Informer, scoped},
		{"poddisruptionbudgets", f.Policy().V1().PodDisruptionBudgets().Informer, scoped},
	} {
		if unreadable[x.resource] {
			continue
		}
		if err := add(x.inf(), x.h); err != nil {
			return err
		}
	}
	return nil
}

// start runs the informers until ctx ends. The workload informers start
// in waitSynced, once the webhook configurations say which namespaces hold
// webhook Services.
func (c *cluster) start(ctx context.Context) {
	c.ctx = ctx
	c.factory.Start(ctx.Done())
}

// hasSynced reports whether every informer has listed once.
func (c *cluster) hasSynced() bool {
	for _, s := range c.synced {
		if !s() {
			return false
		}
	}
	w := c.wl.Load()
	return w != nil && w.hasSynced()
}

// waitSynced blocks until every informer has synced or ctx ends: first
// the configurations and the other cluster-wide resources, then the
// workload informers, started for the namespaces of the webhook Services
// the configurations name.
//
// Errors: ctx ended first (a list is refused or never answered; the
// informers' own log says which), wrapping ctx.Err().
func (c *cluster) waitSynced(ctx context.Context) error {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for started := false; !c.hasSynced(); {
		if !started && c.baseSynced() {
			c.restartWorkloads(c.serviceNamespaces())
			started = true
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("informers not synced: %w", ctx.Err())
		case <-t.C:
		}
	}
	return nil
}

func (c *cluster) baseSynced() bool {
	for _, s := range c.synced {
		if !s() {
			return false
		}
	}
	return true
}

// setBackendNamespaces records the namespaces whose workload events matter.
// A namespace whose pods and workloads were cached without their spec
// restarts the workload informers in the background (workloads.go).
func (c *cluster) setBackendNamespaces(ns map[string]bool) {
	c.mu.Lock()
	c.backendNS = ns
	c.mu.Unlock()
	spec := maps.Clone(ns)
	maps.Copy(spec, c.targetNS)
	c.growSpecNamespaces(spec)
}
