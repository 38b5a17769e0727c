package doctor

import (
	"context"
	"fmt"
	"sort"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
)

// backend is what stands behind one webhook Service: the Service, its
// EndpointSlices, the pods (live, or modelled from workload templates when
// none run, as in a bootstrap deadlock) and the workloads and
// PodDisruptionBudgets around them.
type backend struct {
	Namespace, Name string
	// NamespaceExists is false when the Service's namespace is gone.
	NamespaceExists bool
	NamespaceLabels map[string]string
	Service         *corev1.Service // nil when missing
	Slices          []discoveryv1.EndpointSlice
	// Pods are live pods selected by the Service or referenced by an
	// endpoint, sorted by name.
	Pods []*corev1.Pod
	// Templates are pods that would exist: one per workload whose pod
	// template the Service selects but which has no live pod here.
	Templates []templatePod
	// Workload maps a live pod's name to its top-level controller.
	Workload map[string]WorkloadRef
	// Owners are the controllers of Pods and Templates, by "Kind/name".
	ReplicaSets map[string]*appsv1.ReplicaSet
	Deployments map[string]*appsv1.Deployment
	PDBs        []policyv1.PodDisruptionBudget
}

// templatePod stands in for the pods of a workload that has none running.
type templatePod struct {
	Workload WorkloadRef
	Labels   map[string]string
	Spec     corev1.PodSpec
}

// endpoint is one address the API server may pick for a Service port.
type endpoint struct {
	Address string // IP
	Port    int32
	Ready   bool
	PodName string // from targetRef, when it names a Pod
}

func (e endpoint) HostPort() string { return joinHostPort(e.Address, e.Port) }

// endpointsFor returns the endpoints of the EndpointSlices for the Service
// port named portName, as the API server's resolver reads them: a port entry
// with exactly that name, the first address of each endpoint, ready unless
// conditions.ready is false. found is false when no slice carries that port.
func (b *backend) endpointsFor(portName string) (eps []endpoint, found bool) {
	for _, s := range b.Slices {
		for _, p := range s.Ports {
			if p.Name == nil || *p.Name != portName || p.Port == nil {
				continue
			}
			found = true
			for _, e := range s.Endpoints {
				if len(e.Addresses) == 0 {
					continue
				}
				ep := endpoint{Address: e.Addresses[0], Port: *p.Port, Ready: e.Conditions.Ready == nil || *e.Conditions.Ready}
				if e.TargetRef != nil && e.TargetRef.Kind == "Pod" {
					ep.PodName = e.TargetRef.Name
				}
				eps = append(eps, ep)
			}
		}
	}
	sort.Slice(eps, func(a, b int) bool { return eps[a].HostPort() < eps[b].HostPort() })
	return eps, found
}

// podInfos lists live pods and template stand-ins for collision detection.
func (b *backend) podInfos(addrByPod map[string]string) []PodInfo {
	var out []PodInfo
	for _, p := range b.Pods {
		out = append(out, PodInfo{Name: p.Name, Namespace: p.Namespace, Labels: p.Labels, Workload: b.Workload[p.Name], Address: addrByPod[p.Name]})
	}
	for _, t := range b.Templates {
		out = append(out, PodInfo{Name: "(template of " + t.Workload.String() + ")", Namespace: b.Namespace, Labels: t.Labels, Workload: t.Workload})
	}
	return out
}

// loadBackend reads everything behind Service ns/name. A missing namespace
// or Service is recorded, not an error; other API errors are returned
// wrapped, since doctor cannot judge without them.
func loadBackend(ctx context.Context, cs kubernetes.Interface, ns, name string) (*backend, error) {
	b := &backend{Namespace: ns, Name: name, Workload: map[string]WorkloadRef{},
		ReplicaSets: map[string]*appsv1.ReplicaSet{}, Deployments: map[string]*appsv1.Deployment{}}
	nsObj, err := cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return b, nil
	case err != nil:
		return nil, fmt.Errorf("get namespace %s: %w", ns, err)
	}
	b.NamespaceExists, b.NamespaceLabels = true, nsObj.Labels
	svc, err := cs.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return b, nil
	case err != nil:
		return nil, fmt.Errorf("get service %s/%s: %w", ns, name, err)
	}
	b.Service = svc
	sl, err := cs.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + name})
	if err != nil {
		return nil, fmt.Errorf("list EndpointSlices of service %s/%s: %w", ns, name, err)
	}
	b.Slices = sl.Items

	pods := map[string]*corev1.Pod{}
	if len(svc.Spec.Selector) > 0 {
		pl, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: labels.SelectorFromSet(svc.Spec.Selector).String()})
		if err != nil {
			return nil, fmt.Errorf("list pods selected by service %s/%s: %w", ns, name, err)
		}
		for i := range pl.Items {
			pods[pl.Items[i].Name] = &pl.Items[i]
		}
	}
	// Endpoints may name pods the selector does not (hand-made slices).
	for _, s := range b.Slices {
		for _, e := range s.Endpoints {
			if e.TargetRef == nil || e.TargetRef.Kind != "Pod" || pods[e.TargetRef.Name] != nil {
				continue
			}
			tns := e.TargetRef.Namespace
			if tns == "" {
				tns = ns
			}
			p, err := cs.CoreV1().Pods(tns).Get(ctx, e.TargetRef.Name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("get endpoint pod %s/%s: %w", tns, e.TargetRef.Name, err)
			}
			pods[p.Name] = p
		}
	}
	for _, p := range pods {
		b.Pods = append(b.Pods, p)
	}
	sort.Slice(b.Pods, func(i, j int) bool { return b.Pods[i].Name < b.Pods[j].Name })

	rsl, err := cs.AppsV1().ReplicaSets(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list ReplicaSets in %s: %w", ns, err)
	}
	for i := range rsl.Items {
		b.ReplicaSets[rsl.Items[i].Name] = &rsl.Items[i]
	}
	dl, err := cs.AppsV1().Deployments(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list Deployments in %s: %w", ns, err)
	}
	for i := range dl.Items {
		b.Deployments[dl.Items[i].Name] = &dl.Items[i]
	}
	live := map[WorkloadRef]bool{}
	for _, p := range b.Pods {
		ref := b.topOwner(p.Name, p.OwnerReferences)
		b.Workload[p.Name] = ref
		live[ref] = true
	}
	if len(svc.Spec.Selector) > 0 {
		b.addTemplates(svc.Spec.Selector, live)
		if err := b.addOtherTemplates(ctx, cs, svc.Spec.Selector, live); err != nil {
			return nil, err
		}
	}

	pdbs, err := cs.PolicyV1().PodDisruptionBudgets(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list PodDisruptionBudgets in %s: %w", ns, err)
	}
	b.PDBs = pdbs.Items
	return b, nil
}

// topOwner follows controller owner references from a pod up through
// ReplicaSets to a Deployment; other controllers (StatefulSet, DaemonSet,
// Job, custom kinds) end the walk. A pod without a controller is its own
// workload.
func (b *backend) topOwner(pod string, refs []metav1.OwnerReference) WorkloadRef {
	ref := WorkloadRef{Kind: "Pod", Name: pod}
	c := metav1.GetControllerOfNoCopy(&metav1.ObjectMeta{OwnerReferences: refs})
	if c == nil {
		return ref
	}
	ref = WorkloadRef{Kind: c.Kind, Name: c.Name}
	if c.Kind == "ReplicaSet" {
		if rs := b.ReplicaSets[c.Name]; rs != nil {
			if d := metav1.GetControllerOfNoCopy(rs); d != nil {
				ref = WorkloadRef{Kind: d.Kind, Name: d.Name}
			}
		}
	}
	return ref
}

// addTemplates models the pods of Deployments and ReplicaSets whose template
// the selector matches and which have no live pod: in a bootstrap deadlock
// these are exactly the pods that can never be created.
func (b *backend) addTemplates(selector map[string]string, live map[WorkloadRef]bool) {
	sel := labels.SelectorFromSet(selector)
	names := sortedKeysOf(b.Deployments)
	for _, n := range names {
		d := b.Deployments[n]
		ref := WorkloadRef{Kind: "Deployment", Name: d.Name}
		if !live[ref] && sel.Matches(labels.Set(d.Spec.Template.Labels)) {
			b.Templates = append(b.Templates, templatePod{Workload: ref, Labels: d.Spec.Template.Labels, Spec: d.Spec.Template.Spec})
			live[ref] = true
		}
	}
	for _, n := range sortedKeysOf(b.ReplicaSets) {
		rs := b.ReplicaSets[n]
		ref := WorkloadRef{Kind: "ReplicaSet", Name: rs.Name}
		if d := metav1.GetControllerOfNoCopy(rs); d != nil && d.Kind == "Deployment" {
			ref = WorkloadRef{Kind: "Deployment", Name: d.Name}
		}
		if !live[ref] && sel.Matches(labels.Set(rs.Spec.Template.Labels)) {
			b.Templates = append(b.Templates, templatePod{Workload: ref, Labels: rs.Spec.Template.Labels, Spec: rs.Spec.Template.Spec})
			live[ref] = true
		}
	}
}

// addOtherTemplates does the same for StatefulSets and DaemonSets.
func (b *backend) addOtherTemplates(ctx context.Context, cs kubernetes.Interface, selector map[string]string, live map[WorkloadRef]bool) error {
	sel := labels.SelectorFromSet(selector)
	sts, err := cs.AppsV1().StatefulSets(b.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list StatefulSets in %s: %w", b.Namespace, err)
	}
	for _, s := range sts.Items {
		ref := WorkloadRef{Kind: "StatefulSet", Name: s.Name}
		if !live[ref] && sel.Matches(labels.Set(s.Spec.Template.Labels)) {
			b.Templates = append(b.Templates, templatePod{Workload: ref, Labels: s.Spec.Template.Labels, Spec: s.Spec.Template.Spec})
			live[ref] = true
		}
	}
	dss, err := cs.AppsV1().DaemonSets(b.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list DaemonSets in %s: %w", b.Namespace, err)
	}
	for _, s := range dss.Items {
		ref := WorkloadRef{Kind: "DaemonSet", Name: s.Name}
		if !live[ref] && sel.Matches(labels.Set(s.Spec.Template.Labels)) {
			b.Templates = append(b.Templates, templatePod{Workload: ref, Labels: s.Spec.Template.Labels, Spec: s.Spec.Template.Spec})
			live[ref] = true
		}
	}
	return nil
}

// objects lists what must be admitted for the backend's pods to (re)start:
// pod CREATE for each live pod and template, ReplicaSet CREATE and UPDATE and
// Deployment UPDATE for their controllers.
func (b *backend) objects() []Object {
	nsl := namespaceLabels(b.Namespace, b.NamespaceLabels)
	mk := func(group, res string, op string, lbls map[string]string, desc string) Object {
		return Object{Request: Request{Group: group, Version: "v1", Resource: res, Operation: opType(op), Namespaced: true},
			Namespace: b.Namespace, NamespaceLabels: nsl, Labels: lbls, Describe: desc}
	}
	var out []Object
	seenRS, seenDeploy := map[string]bool{}, map[string]bool{}
	addOwners := func(ref WorkloadRef) {
		if ref.Kind == "Deployment" && !seenDeploy[ref.Name] {
			seenDeploy[ref.Name] = true
			if d := b.Deployments[ref.Name]; d != nil {
				out = append(out, mk("apps", "deployments", "UPDATE", d.Labels, "Deployment "+b.Namespace+"/"+d.Name))
			}
			for _, n := range sortedKeysOf(b.ReplicaSets) {
				rs := b.ReplicaSets[n]
				if c := metav1.GetControllerOfNoCopy(rs); c != nil && c.Kind == "Deployment" && c.Name == ref.Name && !seenRS[rs.Name] {
					seenRS[rs.Name] = true
					out = append(out, mk("apps", "replicasets", "CREATE", rs.Labels, "ReplicaSet "+b.Namespace+"/"+rs.Name))
				}
			}
		}
	}
	for _, p := range b.Pods {
		out = append(out, mk("", "pods", "CREATE", p.Labels, "pod "+b.Namespace+"/"+p.Name))
		addOwners(b.Workload[p.Name])
	}
	for _, t := range b.Templates {
		out = append(out, mk("", "pods", "CREATE", t.Labels, "new pods of "+t.Workload.String()+" in "+b.Namespace))
		addOwners(t.Workload)
	}
	return out
}

func sortedKeysOf[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
