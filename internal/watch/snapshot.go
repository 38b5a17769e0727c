package watch

import (
	"fmt"
	"sort"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kadmit/kadmit/internal/doctor"
)

// view is one evaluation's input: the snapshot, and what the reports need
// beyond it.
type view struct {
	snap *doctor.Snapshot
	// uids maps "<Kind>/<configuration>" to the configuration's UID, for
	// the Events' involvedObject.
	uids map[string]types.UID
	// annotations maps "<Kind>/<configuration>" to its annotations (the
	// cert-manager injection checks read them).
	annotations map[string]map[string]string
}

// snapshot builds from the listers the doctor.Snapshot that
// doctor.LoadSnapshot would read with API calls: every webhook (with the
// caBundle and failurePolicy writes the watch saw, Webhook.Writes), the
// namespaces, each webhook Service's backend, resolved, the API server's
// version and addresses. policies may be nil (not read yet). The listers
// return shared cache objects: nothing here writes to them.
//
// Errors: a lister failed with anything but NotFound (wrapped).
func (c *cluster) snapshot(policies *doctor.PolicySet) (*view, error) {
	v := &view{uids: map[string]types.UID{}, annotations: map[string]map[string]string{}}
	s := &doctor.Snapshot{Namespaces: map[string]map[string]string{}, NamespacesKnown: true, Backends: map[string]*doctor.Backend{}, Policies: policies}
	if s.Policies == nil {
		s.Policies = &doctor.PolicySet{}
	}
	ml, err := c.mutating.List(labels.Everything())
	if err != nil {
		return nil, fmt.Errorf("list MutatingWebhookConfigurations: %w", err)
	}
	vl, err := c.validating.List(labels.Everything())
	if err != nil {
		return nil, fmt.Errorf("list ValidatingWebhookConfigurations: %w", err)
	}
	// The API server lists in name order; the listers do not.
	sort.Slice(ml, func(a, b int) bool { return ml[a].Name < ml[b].Name })
	sort.Slice(vl, func(a, b int) bool { return vl[a].Name < vl[b].Name })
	seen := map[string]bool{}
	live := map[cfgKey]bool{}
	for _, m := range ml {
		live[cfgKey{doctor.KindMutating, m.Name}] = true
		k := doctor.KindMutating + "/" + m.Name
		s.Webhooks = append(s.Webhooks, c.hooks(k, m.ResourceVersion, seen, func() []*doctor.Webhook { return doctor.FromMutating(m) })...)
		v.uids[k], v.annotations[k] = m.UID, m.Annotations
	}
	for _, m := range vl {
		live[cfgKey{doctor.KindValidating, m.Name}] = true
		k := doctor.KindValidating + "/" + m.Name
		s.Webhooks = append(s.Webhooks, c.hooks(k, m.ResourceVersion, seen, func() []*doctor.Webhook { return doctor.FromValidating(m) })...)
		v.uids[k], v.annotations[k] = m.UID, m.Annotations
	}
	for k := range c.hookCache {
		if !seen[k] {
			delete(c.hookCache, k)
		}
	}
	// The history changes without the configuration's resourceVersion
	// (writes age out), so it is set on the cached webhooks at every
	// evaluation; only this loop reads Writes (Diagnose's KD609).
	now := c.now()
	c.history.sweep(now, live)
	for _, w := range s.Webhooks {
		w.Writes = c.history.writes(keyOf(w), now)
	}
	s.ServerVersion = c.version.Load()
	if err := c.apiServerAddresses(s); err != nil {
		return nil, err
	}
	if err := c.dependencies(s); err != nil {
		return nil, err
	}
	var nl []*corev1.Namespace
	if c.unreadable["namespaces"] {
		s.MarkNamespacesUnreadable(nil)
	} else if nl, err = c.namespaces.List(labels.Everything()); err != nil {
		return nil, fmt.Errorf("list namespaces: %w", err)
	}
	for _, n := range nl {
		if n.Status.Phase != corev1.NamespaceTerminating {
			s.Namespaces[n.Name] = n.Labels
		}
	}
	for _, w := range s.Webhooks {
		sv := w.ClientConfig.Service
		if sv == nil || s.Backends[w.ServiceKey()] != nil {
			continue
		}
		b, err := c.backend(sv.Namespace, sv.Name)
		if err != nil {
			return nil, fmt.Errorf("webhook %s: %w", w.Name, err)
		}
		s.Backends[w.ServiceKey()] = b
		if !s.NamespacesKnown && b.NamespaceLabelsKnown {
			s.Namespaces[b.Namespace] = b.NamespaceLabels
		}
	}
	v.snap = s
	return v, nil
}

// cachedHooks are the doctor.Webhooks of one configuration version.
type cachedHooks struct {
	resourceVersion string
	hooks           []*doctor.Webhook
}

// hooks returns the webhooks of configuration key ("<Kind>/<name>") at
// resourceVersion, converting only when it changed: a doctor.Webhook
// compiles its matchConditions (CEL) once, on first use, so reusing it
// keeps an evaluation from recompiling every configuration's conditions.
// Diagnose never modifies a Webhook; snapshot sets its Writes at every
// evaluation (they change without the resourceVersion). Only the
// evaluation loop calls it.
func (c *cluster) hooks(key, resourceVersion string, seen map[string]bool, convert func() []*doctor.Webhook) []*doctor.Webhook {
	seen[key] = true
	if h, ok := c.hookCache[key]; ok && h.resourceVersion == resourceVersion && resourceVersion != "" {
		return h.hooks
	}
	hs := convert()
	c.hookCache[key] = cachedHooks{resourceVersion, hs}
	return hs
}

// backend fills a doctor.Backend for Service ns/name from the listers, the
// way doctor's loadBackend reads it from the API server, and resolves it.
func (c *cluster) backend(ns, name string) (*doctor.Backend, error) {
	b := &doctor.Backend{Namespace: ns, Name: name, ReplicaSets: map[string]*appsv1.ReplicaSet{}, Deployments: map[string]*appsv1.Deployment{}}
	u := c.unreadable
	wl := c.wl.Load() // one set of workload informers for the whole backend
	if u["namespaces"] {
		b.MarkUnreadable("namespaces", nil)
	} else {
		nsObj, err := c.namespaces.Get(ns)
		switch {
		case apierrors.IsNotFound(err):
			return b, nil
		case err != nil:
			return nil, fmt.Errorf("get namespace %s: %w", ns, err)
		}
		b.NamespaceExists, b.NamespaceLabelsKnown, b.NamespaceLabels = true, true, nsObj.Labels
	}
	if u["services"] {
		b.MarkUnreadable("services", nil)
		return b, nil
	}
	svc, err := c.services.Services(ns).Get(name)
	switch {
	case apierrors.IsNotFound(err):
		b.Resolve()
		return b, nil
	case err != nil:
		return nil, fmt.Errorf("get service %s/%s: %w", ns, name, err)
	}
	b.Service = svc
	if u["endpointslices"] {
		b.MarkUnreadable("endpointslices", nil)
	} else {
		sl, err := c.slices.EndpointSlices(ns).List(labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: name}))
		if err != nil {
			return nil, fmt.Errorf("list EndpointSlices of service %s/%s: %w", ns, name, err)
		}
		sort.Slice(sl, func(a, b int) bool { return sl[a].Name < sl[b].Name })
		for _, x := range sl {
			b.Slices = append(b.Slices, *x)
		}
	}
	pods := map[string]*corev1.Pod{}
	if u["pods"] {
		b.MarkUnreadable("pods", nil)
	}
	if len(svc.Spec.Selector) > 0 && !u["pods"] {
		pl, err := wl.pods.Pods(ns).List(labels.SelectorFromSet(svc.Spec.Selector))
		if err != nil {
			return nil, fmt.Errorf("list pods selected by service %s/%s: %w", ns, name, err)
		}
		for _, p := range pl {
			pods[p.Name] = p
		}
	}
	// Endpoints may name pods the selector does not (hand-made slices).
	for _, s := range b.Slices {
		for _, e := range s.Endpoints {
			if u["pods"] || e.TargetRef == nil || e.TargetRef.Kind != "Pod" || pods[e.TargetRef.Name] != nil {
				continue
			}
			tns := e.TargetRef.Namespace
			if tns == "" {
				tns = ns
			}
			// A stub in the pod cache is fetched whole (workloads.go).
			if p, err := wl.pods.Pods(tns).Get(e.TargetRef.Name); err == nil {
				pods[p.Name] = p
			}
		}
	}
	for _, p := range pods {
		b.Pods = append(b.Pods, p)
	}
	sort.Slice(b.Pods, func(i, j int) bool { return b.Pods[i].Name < b.Pods[j].Name })
	if u["replicasets"] {
		b.MarkUnreadable("replicasets", nil)
	} else {
		rsl, err := wl.replicaSets.ReplicaSets(ns).List(labels.Everything())
		if err != nil {
			return nil, fmt.Errorf("list ReplicaSets in %s: %w", ns, err)
		}
		for _, rs := range rsl {
			b.ReplicaSets[rs.Name] = rs
		}
	}
	if u["deployments"] {
		b.MarkUnreadable("deployments", nil)
	} else {
		dl, err := wl.deployments.Deployments(ns).List(labels.Everything())
		if err != nil {
			return nil, fmt.Errorf("list Deployments in %s: %w", ns, err)
		}
		for _, d := range dl {
			b.Deployments[d.Name] = d
		}
	}
	if u["statefulsets"] {
		b.MarkUnreadable("statefulsets", nil)
	} else {
		sts, err := wl.statefulSets.StatefulSets(ns).List(labels.Everything())
		if err != nil {
			return nil, fmt.Errorf("list StatefulSets in %s: %w", ns, err)
		}
		sort.Slice(sts, func(a, b int) bool { return sts[a].Name < sts[b].Name })
		for _, x := range sts {
			b.StatefulSets = append(b.StatefulSets, *x)
		}
	}
	if u["daemonsets"] {
		b.MarkUnreadable("daemonsets", nil)
	} else {
		dss, err := wl.daemonSets.DaemonSets(ns).List(labels.Everything())
		if err != nil {
			return nil, fmt.Errorf("list DaemonSets in %s: %w", ns, err)
		}
		sort.Slice(dss, func(a, b int) bool { return dss[a].Name < dss[b].Name })
		for _, x := range dss {
			b.DaemonSets = append(b.DaemonSets, *x)
		}
	}
	b.Resolve()
	if u["poddisruptionbudgets"] {
		b.MarkUnreadable("poddisruptionbudgets", nil)
	} else {
		pdbs, err := c.pdbs.PodDisruptionBudgets(ns).List(labels.Everything())
		if err != nil {
			return nil, fmt.Errorf("list PodDisruptionBudgets in %s: %w", ns, err)
		}
		sort.Slice(pdbs, func(a, b int) bool { return pdbs[a].Name < pdbs[b].Name })
		for _, x := range pdbs {
			b.PDBs = append(b.PDBs, *x)
		}
	}
	if u["networkpolicies"] {
		b.MarkUnreadable("networkpolicies", nil)
	} else {
		nps, err := c.netpols.NetworkPolicies(ns).List(labels.Everything())
		if err != nil {
			return nil, fmt.Errorf("list NetworkPolicies in %s: %w", ns, err)
		}
		sort.Slice(nps, func(a, b int) bool { return nps[a].Name < nps[b].Name })
		for _, x := range nps {
			b.NetworkPolicies = append(b.NetworkPolicies, *x)
		}
	}
	return b, nil
}

// apiServerAddresses fills s.APIServerAddresses from the EndpointSlices of
// the default/kubernetes Service (doctor.APIServerAddressesFrom: where the
// API server's calls to webhooks come from, KD107), as doctor's
// LoadSnapshot reads them. With EndpointSlices unreadable they stay
// unknown; every backend's KD001 says EndpointSlices could not be read.
//
// Errors: the lister failed (wrapped).
func (c *cluster) apiServerAddresses(s *doctor.Snapshot) error {
	if c.unreadable["endpointslices"] {
		return nil
	}
	sl, err := c.slices.EndpointSlices(metav1.NamespaceDefault).List(labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: "kubernetes"}))
	if err != nil {
		return fmt.Errorf("list EndpointSlices of service default/kubernetes: %w", err)
	}
	vals := make([]discoveryv1.EndpointSlice, 0, len(sl))
	for _, x := range sl {
		vals = append(vals, *x)
	}
	s.APIServerAddresses, s.APIServerAddressesKnown = doctor.APIServerAddressesFrom(vals)
	return nil
}

// dependencies fills s.Dependencies with doctor.DependenciesFrom over every
// DaemonSet and Deployment the workload informers hold, cluster-wide (their
// template labels, hostNetwork and hostPath volumes survive the pruning
// everywhere, prune.go), and the Services (DependenciesFrom picks the
// cluster DNS ones, whose selectors name the DNS pods). DependenciesKnown
// needs both workload kinds: with one refused, the other's dependencies
// are still given, but the check cannot say a webhook intercepts none.
//
// Errors: a lister failed (wrapped).
func (c *cluster) dependencies(s *doctor.Snapshot) error {
	u, wl := c.unreadable, c.wl.Load()
	if wl == nil {
		return nil
	}
	var (
		dss  []*appsv1.DaemonSet
		ds   []*appsv1.Deployment
		svcs []*corev1.Service
		err  error
	)
	if !u["daemonsets"] {
		if dss, err = wl.daemonSets.List(labels.Everything()); err != nil {
			return fmt.Errorf("list DaemonSets: %w", err)
		}
	}
	if !u["deployments"] {
		if ds, err = wl.deployments.List(labels.Everything()); err != nil {
			return fmt.Errorf("list Deployments: %w", err)
		}
	}
	if !u["services"] {
		if svcs, err = c.services.List(labels.Everything()); err != nil {
			return fmt.Errorf("list Services: %w", err)
		}
	}
	s.Dependencies = doctor.DependenciesFrom(dss, ds, svcs)
	s.DependenciesKnown = !u["daemonsets"] && !u["deployments"]
	return nil
}
