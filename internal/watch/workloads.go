package watch

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	appslisters "k8s.io/client-go/listers/apps/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

// workloads are the cluster-wide ReplicaSet, Deployment, StatefulSet and
// DaemonSet informers of one selection, and the pod cache. A workload
// whose pod template a webhook Service of its namespace selects (by the
// template's labels), or whose pods it may select, keeps what the checks
// read, the template included; every other one only its labels, owner
// references, selector and template labels (DaemonSets also what KD506
// reads), whatever its namespace (workloadTransform, prune.go). Pods are
// cached by selection too (podCache): so 50,000 pods and 6,000 workloads
// of which 4,000 and 4,000 serve webhooks cost what those do plus a few
// hundred bytes each for the rest (test/e2e/scale). The checks only
// read pods and workloads behind a webhook Service (snapshot.go backend).
type workloads struct {
	// sel is the selection the workload informers' transform keeps
	// templates for; keys are its keys().
	sel  podSelection
	keys map[string]bool
	stop context.CancelFunc
	// synced holds the workload informers' and the pod cache's.
	synced []cache.InformerSynced

	// pc is the pod cache: one for the watch's life, handed from each set
	// of workload informers to the next (it is never restarted); pods
	// lists and gets through it.
	pc           *podCache
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

// webhookServices are the Services the webhook configurations call, each
// once.
func (c *cluster) webhookServices() []cache.ObjectName {
	seen := map[cache.ObjectName]bool{}
	var out []cache.ObjectName
	add := func(ns, name string) {
		k := cache.NewObjectName(ns, name)
		if !seen[k] {
			seen[k] = true
			out = append(out, k)
		}
	}
	if c.mutating != nil {
		ml, _ := c.mutating.List(labels.Everything())
		for _, m := range ml {
			for _, w := range m.Webhooks {
				if s := w.ClientConfig.Service; s != nil {
					add(s.Namespace, s.Name)
				}
			}
		}
	}
	if c.validating != nil {
		vl, _ := c.validating.List(labels.Everything())
		for _, v := range vl {
			for _, w := range v.Webhooks {
				if s := w.ClientConfig.Service; s != nil {
					add(s.Namespace, s.Name)
				}
			}
		}
	}
	return out
}

// webhookSelection is, by namespace, the selectors of the webhook
// Services (those with one) as the Services informer holds them now.
func (c *cluster) webhookSelection() podSelection {
	sel := podSelection{}
	if c.services == nil {
		return sel
	}
	seen := map[string]bool{}
	for _, r := range c.webhookServices() {
		svc, err := c.services.Services(r.Namespace).Get(r.Name)
		if err != nil || len(svc.Spec.Selector) == 0 {
			continue
		}
		s := labels.SelectorFromSet(svc.Spec.Selector)
		if k := selectionKey(r.Namespace, s); !seen[k] {
			seen[k] = true
			sel[r.Namespace] = append(sel[r.Namespace], s)
		}
	}
	return sel
}

// growSelection is called after every evaluation. It sets the pod cache's
// selection to the current webhook Services' selectors and drops fetched
// pods it no longer needs (podCache), and it restarts the workload
// informers, in the background, when a webhook Service's selector is not
// in their selection: workloads it selects must be listed again with their
// template. Their selection only grows (the union of the running one and
// the current one), so restarts are bounded by the number of selectors
// webhook Services ever had; until the new informers have synced, the old
// ones answer and a finding about the new selector's workload templates
// may lag by one re-list. Pods are never listed again: those cached
// without their spec are fetched when selected.
func (c *cluster) growSelection() {
	w := c.wl.Load()
	if w == nil || c.ctx == nil {
		return
	}
	sel := c.webhookSelection()
	if w.pc != nil {
		w.pc.setSelection(sel)
		w.pc.sweep()
	}
	for k := range sel.keys() {
		if !w.keys[k] {
			// One restart at a time: evaluations during its re-list find
			// it running and leave it; the first one after the swap checks
			// again.
			if !c.restarting.CompareAndSwap(false, true) {
				return
			}
			union := w.sel.union(sel)
			go func() {
				defer c.restarting.Store(false)
				c.restartWorkloads(union)
			}()
			return
		}
	}
}

// restartWorkloads starts workload informers keeping the templates sel
// selects and, once they have synced, replaces the running ones with them
// (stopping those). The first call also starts the pod cache, with the
// webhook Services' selectors as the informers hold them then, and
// publishes at once: waitSynced waits for them. A call whose selection
// holds no selector the running one lacks does nothing.
func (c *cluster) restartWorkloads(sel podSelection) {
	c.wlMu.Lock()
	defer c.wlMu.Unlock()
	old := c.wl.Load()
	keys := sel.keys()
	if old != nil {
		grows := false
		for k := range keys {
			grows = grows || !old.keys[k]
		}
		if !grows {
			return
		}
	}
	ctx, stop := context.WithCancel(c.ctx)
	w := &workloads{sel: sel, keys: keys, stop: stop}
	ok := func(r string) bool { return !c.unreadable[r] }
	f := informers.NewSharedInformerFactoryWithOptions(c.cs, 0, informers.WithTransform(workloadTransform(sel, ok("deployments"))))
	add := func(inf cache.SharedIndexInformer) {
		if c.scoped != nil {
			if _, err := inf.AddEventHandler(c.scoped); err != nil {
				// Only a stopped informer refuses a handler; this one is new.
				panic(err)
			}
		}
		w.synced = append(w.synced, inf.HasSynced)
	}
	switch {
	case old != nil && old.pc != nil:
		w.pc, w.pods = old.pc, old.pods
		w.synced = append(w.synced, w.pc.informer.HasSynced)
	case ok("pods"):
		// The pod cache lives as long as the watch (c.ctx), not as long as
		// this set of workload informers.
		w.pc = newPodCache(c.ctx, c.cs, c.webhookSelection())
		if c.scoped != nil {
			if _, err := w.pc.informer.AddEventHandler(selectedPodEvents{pc: w.pc, next: c.scoped}); err != nil {
				panic(err) // a new informer accepts handlers
			}
		}
		w.pods = podLister{w.pc}
		w.synced = append(w.synced, w.pc.informer.HasSynced)
		go w.pc.informer.RunWithContext(c.ctx)
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

// podSelection is, by namespace, the label selectors of the webhook
// Services there: the pods the checks read.
type podSelection map[string][]labels.Selector

// selects reports whether a pod in namespace ns with labels l is selected.
func (s podSelection) selects(ns string, l map[string]string) bool {
	for _, sel := range s[ns] {
		if sel.Matches(labels.Set(l)) {
			return true
		}
	}
	return false
}

// union is a selection holding the selectors of s and t, each once.
func (s podSelection) union(t podSelection) podSelection {
	out := podSelection{}
	seen := map[string]bool{}
	for _, x := range []podSelection{s, t} {
		for ns, sels := range x {
			for _, sel := range sels {
				if k := selectionKey(ns, sel); !seen[k] {
					seen[k] = true
					out[ns] = append(out[ns], sel)
				}
			}
		}
	}
	return out
}

// keys are the selection's "<namespace>\x00<selector>" strings.
func (s podSelection) keys() map[string]bool {
	out := map[string]bool{}
	for ns, sels := range s {
		for _, sel := range sels {
			out[selectionKey(ns, sel)] = true
		}
	}
	return out
}

func selectionKey(ns string, sel labels.Selector) string { return ns + "\x00" + sel.String() }

// Bounds of the pod cache's fetches (podCache).
const (
	// maxFetchedPods bounds the pods fetched and kept beside the informer
	// (podCache.fetched): pods of webhook Services that appeared after
	// they were cached as stubs. Past it, such pods are fetched again at
	// each evaluation instead of kept.
	maxFetchedPods = 2000
	// fetchTimeout bounds one fetch (a GET or a List by selector).
	fetchTimeout = 10 * time.Second
)

// podCache is the watch's pod informer, cluster-wide, started once. Its
// transform (prunePod, prune.go) keeps, of each pod a webhook Service
// selects at the time (selection), the name, labels, owner references,
// spec and node addresses; of every other pod only its name, namespace
// and resourceVersion, as a *metav1.PartialObjectMetadata (a stub, about
// 0.35 KB, against the 1.2 KB of an empty *corev1.Pod and 0.7 KB more for
// a Deployment pod's eight labels).
//
// The selection is set after every evaluation (growSelection), so
// pods created or changed later are cached whole when selected. A pod
// cached as a stub before a webhook Service selected it (a webhook
// installed after its pods were created, which kadmit's own registrar
// does: it registers once its pods are ready) stays a stub until it
// changes. So the first time the pods of a selector are listed after it
// joined the selection, the listers (podLister) ask the API server (one
// List by selector; one GET for a pod asked for by name) and keep the
// pods it returns that the informer holds as stubs in fetched, keyed by
// namespace/name with the stub's resourceVersion; the selector is then
// covered: every pod it selects is whole in the informer or fetched, until
// it leaves the selection. A fetched pod goes when the informer holds it
// whole, or a newer stub, or no pod (sweep). So the pods selected are
// always read with their spec, and nothing is listed again when the
// selection grows.
type podCache struct {
	ctx       context.Context
	cs        kubernetes.Interface
	informer  cache.SharedIndexInformer
	selection atomic.Pointer[podSelection]

	mu      sync.Mutex
	fetched map[string]fetchedPod // namespace/name
	// covered holds the selection keys (selectionKey) listed from the API
	// server since they joined the selection (the first selection's, at
	// start): a subset of the selection's keys.
	covered map[string]bool
	// fetches counts the API requests the listers made (tests).
	fetches atomic.Int64
}

// fetchedPod is a pod fetched whole while the informer held it as a stub
// of resourceVersion stubRV.
type fetchedPod struct {
	stubRV string
	pod    *corev1.Pod
}

// newPodCache builds the pod informer with selection sel, every selector
// of which is covered: the informer lists every pod under it. The caller
// adds handlers and runs it.
func newPodCache(ctx context.Context, cs kubernetes.Interface, sel podSelection) *podCache {
	pc := &podCache{ctx: ctx, cs: cs, fetched: map[string]fetchedPod{}, covered: sel.keys()}
	pc.selection.Store(&sel)
	f := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithTransform(pc.transform))
	pc.informer = f.Core().V1().Pods().Informer()
	if err := pc.informer.AddIndexers(cache.Indexers{wholeByNamespace: indexWholeByNamespace}); err != nil {
		panic(err) // a new informer accepts indexers
	}
	return pc
}

func (pc *podCache) transform(o any) (any, error) {
	return prunePod(o, *pc.selection.Load()), nil
}

// setSelection sets the selectors the transform keeps pods whole for. A
// selector new to it is not covered (pods cached before may be stubs), and
// one that leaves it is no longer.
func (pc *podCache) setSelection(sel podSelection) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	keys := sel.keys()
	for k := range pc.covered {
		if !keys[k] {
			delete(pc.covered, k)
		}
	}
	pc.selection.Store(&sel)
}

// selected reports whether o (a cached pod, stub or whole, or a tombstone
// of one) is read by the checks: whole, or a stub whose pod was fetched.
func (pc *podCache) selected(o any) bool {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = d.Obj
	}
	switch p := o.(type) {
	case *corev1.Pod:
		return true
	case *metav1.PartialObjectMetadata:
		pc.mu.Lock()
		_, ok := pc.fetched[p.Namespace+"/"+p.Name]
		pc.mu.Unlock()
		return ok
	}
	return false
}

// sweep drops the fetched pods the informer now holds whole, or as a
// newer stub, or not at all.
func (pc *podCache) sweep() {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	for k, f := range pc.fetched {
		o, ok, err := pc.informer.GetIndexer().GetByKey(k)
		if s, stub := o.(*metav1.PartialObjectMetadata); err != nil || !ok || !stub || s.ResourceVersion != f.stubRV {
			delete(pc.fetched, k)
		}
	}
}

// fetchedIn returns the fetched pods of namespace ns ("": all) whose
// stub the informer still holds unchanged.
func (pc *podCache) fetchedIn(ns string) []*corev1.Pod {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	var out []*corev1.Pod
	for _, f := range pc.fetched {
		if ns != metav1.NamespaceAll && f.pod.Namespace != ns {
			continue
		}
		o, ok, err := pc.informer.GetIndexer().GetByKey(f.pod.Namespace + "/" + f.pod.Name)
		if s, stub := o.(*metav1.PartialObjectMetadata); err == nil && ok && stub && s.ResourceVersion == f.stubRV {
			out = append(out, f.pod)
		}
	}
	return out
}

// wholeByNamespace indexes the pod cache's whole pods (not its stubs) by
// namespace.
const wholeByNamespace = "wholeByNamespace"

func indexWholeByNamespace(o any) ([]string, error) {
	if p, ok := o.(*corev1.Pod); ok {
		return []string{p.Namespace}, nil
	}
	return nil, nil
}

// cached returns the fetched pod of stub s, if still valid.
func (pc *podCache) cached(s *metav1.PartialObjectMetadata) *corev1.Pod {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if f, ok := pc.fetched[s.Namespace+"/"+s.Name]; ok && f.stubRV == s.ResourceVersion {
		return f.pod
	}
	return nil
}

// keep records p, fetched while the informer held stub s, within
// maxFetchedPods, and reports whether it did.
func (pc *podCache) keep(s *metav1.PartialObjectMetadata, p *corev1.Pod) bool {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	k := s.Namespace + "/" + s.Name
	if _, ok := pc.fetched[k]; !ok && len(pc.fetched) >= maxFetchedPods {
		return false
	}
	pc.fetched[k] = fetchedPod{stubRV: s.ResourceVersion, pod: p}
	return true
}

// list returns the pods of namespace ns (all namespaces when ns is "")
// that sel selects, whole: the informer's whole pods, and, when sel is a
// covered selector of the selection, the fetched pods of its stubs;
// otherwise the stubs among the pods one List by sel from the API server
// returns (after which sel is covered, if it is in the selection and every
// one of them could be kept). Pods the informer does not hold (yet, or any
// more) are left out: it is the one view of which pods exist.
//
// Errors: the List failed (wrapped, naming the namespace and selector).
func (pc *podCache) list(ns string, sel labels.Selector) ([]*corev1.Pod, error) {
	idx := pc.informer.GetIndexer()
	var objs []any
	if ns == metav1.NamespaceAll {
		objs = idx.List()
	} else {
		// Whole pods only: a namespace's stubs (hundreds, against a few
		// webhook pods) are not walked for each of its webhook Services.
		var err error
		if objs, err = idx.ByIndex(wholeByNamespace, ns); err != nil {
			return nil, fmt.Errorf("pods in %s: %w", ns, err)
		}
	}
	key := selectionKey(ns, sel)
	pc.mu.Lock()
	covered := pc.covered[key]
	pc.mu.Unlock()
	var out []*corev1.Pod
	for _, o := range objs {
		if p, ok := o.(*corev1.Pod); ok && sel.Matches(labels.Set(p.Labels)) {
			out = append(out, p)
		}
	}
	if covered {
		for _, p := range pc.fetchedIn(ns) {
			if sel.Matches(labels.Set(p.Labels)) {
				out = append(out, p)
			}
		}
		return out, nil
	}
	ctx, cancel := context.WithTimeout(pc.ctx, fetchTimeout)
	defer cancel()
	pc.fetches.Add(1)
	l, err := pc.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return nil, fmt.Errorf("list the pods %q selects in %q, cached without their spec: %w", sel.String(), ns, err)
	}
	all := true
	for i := range l.Items {
		p := &l.Items[i]
		o, ok, _ := idx.GetByKey(p.Namespace + "/" + p.Name)
		if s, stub := o.(*metav1.PartialObjectMetadata); ok && stub {
			kept := keptPod(p)
			all = pc.keep(s, kept) && all
			out = append(out, kept)
		}
	}
	pc.mu.Lock()
	if all && (*pc.selection.Load()).keys()[key] {
		pc.covered[key] = true
	}
	pc.mu.Unlock()
	return out, nil
}

// get returns pod ns/name whole: as the informer holds it, or fetched
// (one GET) when it holds a stub.
//
// Errors: NotFound when neither the informer nor the API server has it;
// a failed GET (wrapped).
func (pc *podCache) get(ns, name string) (*corev1.Pod, error) {
	o, ok, err := pc.informer.GetIndexer().GetByKey(ns + "/" + name)
	if err != nil {
		return nil, fmt.Errorf("pod %s/%s: %w", ns, name, err)
	}
	if !ok {
		return nil, apierrors.NewNotFound(corev1.Resource("pod"), name)
	}
	switch p := o.(type) {
	case *corev1.Pod:
		return p, nil
	case *metav1.PartialObjectMetadata:
		if f := pc.cached(p); f != nil {
			return f, nil
		}
		ctx, cancel := context.WithTimeout(pc.ctx, fetchTimeout)
		defer cancel()
		pc.fetches.Add(1)
		full, err := pc.cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			if apierrors.IsNotFound(err) {
				return nil, err
			}
			return nil, fmt.Errorf("fetch pod %s/%s, cached without its spec: %w", ns, name, err)
		}
		kept := keptPod(full)
		pc.keep(p, kept)
		return kept, nil
	}
	return nil, fmt.Errorf("pod %s/%s: cached as %T", ns, name, o)
}

// podLister is the pod cache as a corelisters.PodLister: every pod it
// returns is whole (podCache.list, podCache.get).
type podLister struct{ pc *podCache }

func (l podLister) List(sel labels.Selector) ([]*corev1.Pod, error) {
	return l.pc.list(metav1.NamespaceAll, sel)
}

func (l podLister) Pods(ns string) corelisters.PodNamespaceLister {
	return podNamespaceLister{l.pc, ns}
}

type podNamespaceLister struct {
	pc *podCache
	ns string
}

func (l podNamespaceLister) List(sel labels.Selector) ([]*corev1.Pod, error) {
	return l.pc.list(l.ns, sel)
}

func (l podNamespaceLister) Get(name string) (*corev1.Pod, error) { return l.pc.get(l.ns, name) }

// selectedPodEvents passes to next only the events of pods the checks
// read (podCache.selected): with a webhook Service in every namespace,
// every pod's status update would otherwise start an evaluation.
type selectedPodEvents struct {
	pc   *podCache
	next cache.ResourceEventHandler
}

func (h selectedPodEvents) OnAdd(o any, initial bool) {
	if h.pc.selected(o) {
		h.next.OnAdd(o, initial)
	}
}

func (h selectedPodEvents) OnUpdate(o, n any) {
	if h.pc.selected(o) || h.pc.selected(n) {
		h.next.OnUpdate(o, n)
	}
}

func (h selectedPodEvents) OnDelete(o any) {
	if h.pc.selected(o) {
		h.next.OnDelete(o)
	}
}
