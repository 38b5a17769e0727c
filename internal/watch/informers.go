package watch

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	admissionlisters "k8s.io/client-go/listers/admissionregistration/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	networkinglisters "k8s.io/client-go/listers/networking/v1"
	policylisters "k8s.io/client-go/listers/policy/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/kadmit/kadmit/internal/clustercache"
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
	netpols    networkinglisters.NetworkPolicyLister

	// history is the configurations' caBundle and failurePolicy writes
	// (history.go), recorded by their informers' update events.
	history *writeHistory
	now     func() time.Time
	// version is the API server's /version as last read (version.go);
	// nil until a read succeeded.
	version atomic.Pointer[version.Info]

	// cs builds the workload informers and the pod cache (workloads.go);
	// wl holds the running ones, the workload informers replaced when a
	// webhook Service's selector is new to them (their templates are
	// cached by selection).
	cs     kubernetes.Interface
	wl     atomic.Pointer[workloads]
	scoped cache.ResourceEventHandler
	wlMu   sync.Mutex // serialises restarts of wl
	// restarting is true while a background restart of wl runs.
	restarting atomic.Bool
	ctx        context.Context

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
// managedFields, except the webhook configurations, whose managedFields
// name the field managers of caBundle and failurePolicy (KD609); pods,
// workloads and NetworkPolicies keep only the fields the checks read
// (clusterTransform, prune.go), to keep the cluster-wide caches small. now
// is the clock of the write history.
func newCluster(cs kubernetes.Interface, now func() time.Time) *cluster {
	f := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithTransform(clusterTransform))
	return &cluster{factory: f, cs: cs, backendNS: map[string]bool{}, unreadable: map[string]bool{}, hookCache: map[string]cachedHooks{},
		history: newWriteHistory(), now: now}
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
	// A configuration's update may be a write of caBundle or
	// failurePolicy: recorded before the evaluation it asks for reads it.
	configs := cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { kick() },
		UpdateFunc: func(o, n any) {
			c.history.update(c.now(), o, n)
			kick()
		},
		DeleteFunc: func(o any) {
			c.history.forget(o)
			kick()
		},
	}
	// EndpointSlices: those of webhook Services, and the default/kubernetes
	// Service's, which say where the API server calls from (KD107).
	apiServerSlice := func(o any) bool {
		if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
			o = d.Obj
		}
		m, ok := o.(metav1.Object)
		return ok && m.GetNamespace() == metav1.NamespaceDefault && m.GetLabels()[discoveryv1.LabelServiceName] == "kubernetes"
	}
	sliceEvents := cache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) {
			if apiServerSlice(o) {
				kick()
			} else {
				inBackendNS(o)
			}
		},
		UpdateFunc: func(_, n any) {
			if apiServerSlice(n) {
				kick()
			} else {
				inBackendNS(n)
			}
		},
		DeleteFunc: func(o any) {
			if apiServerSlice(o) {
				kick()
			} else {
				inBackendNS(o)
			}
		},
	}
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
	if ok("networkpolicies") {
		c.netpols = f.Networking().V1().NetworkPolicies().Lister()
	}
	for _, x := range []struct {
		resource string
		inf      func() cache.SharedIndexInformer
		h        cache.ResourceEventHandler
	}{
		{"mutatingwebhookconfigurations", reg.MutatingWebhookConfigurations().Informer, configs},
		{"validatingwebhookconfigurations", reg.ValidatingWebhookConfigurations().Informer, configs},
		{"namespaces", f.Core().V1().Namespaces().Informer, always},
		{"services", f.Core().V1().Services().Informer, scoped},
		{"endpointslices", f.Discovery().V1().EndpointSlices().Informer, sliceEvents},
		{"poddisruptionbudgets", f.Policy().V1().PodDisruptionBudgets().Informer, scoped},
		{"networkpolicies", f.Networking().V1().NetworkPolicies().Informer, scoped},
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
			c.restartWorkloads(c.webhookSelection())
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

// setBackendNamespaces records the namespaces whose workload events matter,
// and brings the pod cache's and the workload informers' selection up to
// date with the webhook Services (growSelection, workloads.go).
func (c *cluster) setBackendNamespaces(ns map[string]bool) {
	c.mu.Lock()
	c.backendNS = ns
	c.mu.Unlock()
	c.growSelection()
}

// netpolTransform keeps of a NetworkPolicy its identity and spec, all
// KD107 reads (podSelector, policyTypes, ingress rules; egress is kept
// with the spec as one subtree, it is small): not its annotations
// (kubectl's last-applied-configuration doubles it), status or
// managedFields.
var netpolTransform = clustercache.NewPruner(false, clustercache.P("spec")).Transform()

// clusterTransform is the transform of the cluster-wide informers (not the
// workload ones, workloads.go): webhook configurations are kept whole,
// managedFields included, since their entries name the field managers of
// caBundle and failurePolicy (KD609; a configuration's few entries are
// small next to its webhooks); NetworkPolicies are pruned to their spec;
// everything else loses its managedFields only (transform, prune.go).
func clusterTransform(o any) (any, error) {
	switch o.(type) {
	case *admissionregistrationv1.MutatingWebhookConfiguration, *admissionregistrationv1.ValidatingWebhookConfiguration:
		return o, nil
	case *networkingv1.NetworkPolicy:
		return netpolTransform(o)
	}
	return transform(o)
}
