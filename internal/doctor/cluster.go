package doctor

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
)

// Backend is what stands behind one webhook Service: the Service, its
// EndpointSlices, the pods (live, or modelled from workload templates when
// none run, as in a bootstrap deadlock) and the workloads and
// PodDisruptionBudgets around them.
type Backend struct {
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
	// template the Service selects but which has no live pod here
	// (computed by Resolve).
	Templates []TemplatePod
	// Workload maps a live pod's name to its top-level controller
	// (computed by Resolve).
	Workload map[string]WorkloadRef
	// Inferred holds, by pod name, how Workload was found when part of the
	// owner chain could not be read (see resolveOwner).
	Inferred map[string]Inference
	// Gaps are what doctor could not read for this backend.
	Gaps []AccessGap
	// NamespaceLabelsKnown is false when the namespace could not be read
	// (NamespaceLabels then hold only what the API server always sets).
	NamespaceLabelsKnown bool
	// ServiceUnknown, SlicesUnknown, PodsUnknown, ReplicaSetsUnknown,
	// DeploymentsUnknown, PDBsUnknown: that read was refused (see Gaps);
	// the corresponding fields are empty, not "none exist".
	ServiceUnknown, SlicesUnknown, PodsUnknown, ReplicaSetsUnknown, DeploymentsUnknown, PDBsUnknown bool
	// OtherTemplatesUnknown names the kinds (StatefulSets, DaemonSets) that
	// could not be listed.
	OtherTemplatesUnknown []string
	// ReplicaSets and Deployments of the namespace, by name; StatefulSets
	// and DaemonSets of the namespace.
	ReplicaSets  map[string]*appsv1.ReplicaSet
	Deployments  map[string]*appsv1.Deployment
	StatefulSets []appsv1.StatefulSet
	DaemonSets   []appsv1.DaemonSet
	PDBs         []policyv1.PodDisruptionBudget
	// NetworkPolicies of the namespace (KD107); NetworkPoliciesUnknown is
	// true when they could not be listed.
	NetworkPolicies        []networkingv1.NetworkPolicy
	NetworkPoliciesUnknown bool
}

// TemplatePod stands in for the pods of a workload that has none running.
type TemplatePod struct {
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
func (b *Backend) endpointsFor(portName string) (eps []endpoint, found bool) {
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
func (b *Backend) podInfos(addrByPod map[string]string) []PodInfo {
	var out []PodInfo
	for _, p := range b.Pods {
		out = append(out, PodInfo{Name: p.Name, Namespace: p.Namespace, Labels: p.Labels, Workload: b.Workload[p.Name], Address: addrByPod[p.Name],
			Inferred: b.Inferred[p.Name].How, Unconfirmed: !b.ownerKnown(p.Name)})
	}
	for _, t := range b.Templates {
		out = append(out, PodInfo{Name: "(template of " + t.Workload.String() + ")", Namespace: b.Namespace, Labels: t.Labels, Workload: t.Workload})
	}
	return out
}

// nsObjects is what doctor reads of one namespace that holds webhook
// Services, each kind listed once however many webhooks call into the
// namespace (624 webhooks used to cost nine reads each, minutes at
// client-go's default 5 requests per second). gaps holds, by resource
// (as Backend.MarkUnreadable names it), the refusal (isAccessGap) of that
// list; other errors end the run.
type nsObjects struct {
	services     map[string]*corev1.Service // nil: list refused, read one by one
	slices       map[string][]discoveryv1.EndpointSlice
	pods         map[string]*corev1.Pod
	replicaSets  *appsv1.ReplicaSetList
	deployments  *appsv1.DeploymentList
	statefulSets *appsv1.StatefulSetList
	daemonSets   *appsv1.DaemonSetList
	pdbs         *policyv1.PodDisruptionBudgetList
	netpols      *networkingv1.NetworkPolicyList
	gaps         map[string]error
}

// listed records the outcome err of listing resource (kind in errors) in
// ns: nil, a refusal kept in o.gaps (false: the list is not there), or
// another error, returned wrapped.
func (o *nsObjects) listed(ns, resource, kind string, err error) (bool, error) {
	switch {
	case err == nil:
		return true, nil
	case isAccessGap(err):
		o.gaps[resource] = err
		return false, nil
	default:
		return false, fmt.Errorf("list %s in %s: %w", kind, ns, err)
	}
}

// backendLoader reads backends, listing each namespace's objects once.
type backendLoader struct {
	cs kubernetes.Interface
	// namespaces holds every namespace (Terminating included) when they
	// could be listed; nil otherwise (then each is read by name).
	namespaces map[string]*corev1.Namespace
	byNS       map[string]*nsObjects
}

// namespace lists what doctor reads of namespace ns, once per run.
func (l *backendLoader) namespace(ctx context.Context, ns string) (*nsObjects, error) {
	if o := l.byNS[ns]; o != nil {
		return o, nil
	}
	o := &nsObjects{slices: map[string][]discoveryv1.EndpointSlice{}, pods: map[string]*corev1.Pod{}, gaps: map[string]error{}}
	svcs, err := l.cs.CoreV1().Services(ns).List(ctx, metav1.ListOptions{})
	switch {
	case isAccessGap(err): // read one by one, as doctor did before
	case err != nil:
		return nil, fmt.Errorf("list Services in %s: %w", ns, err)
	default:
		o.services = map[string]*corev1.Service{}
		for i := range svcs.Items {
			o.services[svcs.Items[i].Name] = &svcs.Items[i]
		}
	}
	sl, err := l.cs.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{})
	if ok, err := o.listed(ns, "endpointslices", "EndpointSlices", err); err != nil {
		return nil, err
	} else if ok {
		for _, s := range sl.Items {
			if svc := s.Labels[discoveryv1.LabelServiceName]; svc != "" {
				o.slices[svc] = append(o.slices[svc], s)
			}
		}
	}
	pl, err := l.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if ok, err := o.listed(ns, "pods", "pods", err); err != nil {
		return nil, err
	} else if ok {
		for i := range pl.Items {
			o.pods[pl.Items[i].Name] = &pl.Items[i]
		}
	}
	o.replicaSets, err = l.cs.AppsV1().ReplicaSets(ns).List(ctx, metav1.ListOptions{})
	if _, err := o.listed(ns, "replicasets", "ReplicaSets", err); err != nil {
		return nil, err
	}
	o.deployments, err = l.cs.AppsV1().Deployments(ns).List(ctx, metav1.ListOptions{})
	if _, err := o.listed(ns, "deployments", "Deployments", err); err != nil {
		return nil, err
	}
	o.statefulSets, err = l.cs.AppsV1().StatefulSets(ns).List(ctx, metav1.ListOptions{})
	if _, err := o.listed(ns, "statefulsets", "StatefulSets", err); err != nil {
		return nil, err
	}
	o.daemonSets, err = l.cs.AppsV1().DaemonSets(ns).List(ctx, metav1.ListOptions{})
	if _, err := o.listed(ns, "daemonsets", "DaemonSets", err); err != nil {
		return nil, err
	}
	o.pdbs, err = l.cs.PolicyV1().PodDisruptionBudgets(ns).List(ctx, metav1.ListOptions{})
	if _, err := o.listed(ns, "poddisruptionbudgets", "PodDisruptionBudgets", err); err != nil {
		return nil, err
	}
	o.netpols, err = l.cs.NetworkingV1().NetworkPolicies(ns).List(ctx, metav1.ListOptions{})
	if _, err := o.listed(ns, "networkpolicies", "NetworkPolicies", err); err != nil {
		return nil, err
	}
	if l.byNS == nil {
		l.byNS = map[string]*nsObjects{}
	}
	l.byNS[ns] = o
	return o, nil
}

// load reads everything behind Service ns/name. A missing namespace
// or Service is recorded, not an error; so is an object doctor may not read
// (403 Forbidden) or a resource the API server does not serve: each becomes
// an AccessGap naming what it could not tell. Other API errors are returned
// wrapped, since doctor cannot judge without them.
func (l *backendLoader) load(ctx context.Context, ns, name string) (*Backend, error) {
	cs := l.cs
	b := &Backend{Namespace: ns, Name: name, Workload: map[string]WorkloadRef{}, Inferred: map[string]Inference{},
		ReplicaSets: map[string]*appsv1.ReplicaSet{}, Deployments: map[string]*appsv1.Deployment{}}
	var nsObj *corev1.Namespace
	var err error
	if l.namespaces != nil {
		if nsObj = l.namespaces[ns]; nsObj == nil {
			err = apierrors.NewNotFound(corev1.Resource("namespaces"), ns)
		}
	} else {
		nsObj, err = cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	}
	switch {
	case apierrors.IsNotFound(err):
		return b, nil
	case isAccessGap(err):
		b.MarkUnreadable("namespaces", err)
	case err != nil:
		return nil, fmt.Errorf("get namespace %s: %w", ns, err)
	default:
		b.NamespaceExists, b.NamespaceLabelsKnown, b.NamespaceLabels = true, true, nsObj.Labels
	}
	o, err := l.namespace(ctx, ns)
	if err != nil {
		return nil, err
	}
	var svc *corev1.Service
	if o.services != nil {
		if svc = o.services[name]; svc == nil {
			err = apierrors.NewNotFound(corev1.Resource("services"), name)
		}
	} else {
		svc, err = cs.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
	}
	switch {
	case apierrors.IsNotFound(err):
		return b, nil
	case isAccessGap(err):
		b.MarkUnreadable("services", err)
		return b, nil
	case err != nil:
		return nil, fmt.Errorf("get service %s/%s: %w", ns, name, err)
	}
	b.Service = svc
	if o.gaps["endpointslices"] != nil {
		b.MarkUnreadable("endpointslices", o.gaps["endpointslices"])
	} else {
		b.Slices = o.slices[name]
	}

	pods := map[string]*corev1.Pod{}
	if len(svc.Spec.Selector) > 0 {
		if o.gaps["pods"] != nil {
			b.MarkUnreadable("pods", o.gaps["pods"])
		} else {
			sel := labels.SelectorFromSet(svc.Spec.Selector)
			for _, p := range o.pods {
				if sel.Matches(labels.Set(p.Labels)) {
					pods[p.Name] = p
				}
			}
		}
	}
	// Endpoints may name pods the selector does not (hand-made slices).
	if !b.PodsUnknown {
		for _, s := range b.Slices {
			for _, e := range s.Endpoints {
				if e.TargetRef == nil || e.TargetRef.Kind != "Pod" || pods[e.TargetRef.Name] != nil {
					continue
				}
				tns := e.TargetRef.Namespace
				if tns == "" {
					tns = ns
				}
				if p := o.pods[e.TargetRef.Name]; tns == ns && p != nil {
					pods[p.Name] = p
					continue
				}
				if tns == ns && o.gaps["pods"] == nil {
					continue // listed: the pod is gone
				}
				p, err := cs.CoreV1().Pods(tns).Get(ctx, e.TargetRef.Name, metav1.GetOptions{})
				if apierrors.IsNotFound(err) || isAccessGap(err) {
					continue
				}
				if err != nil {
					return nil, fmt.Errorf("get endpoint pod %s/%s: %w", tns, e.TargetRef.Name, err)
				}
				pods[p.Name] = p
			}
		}
	}
	for _, p := range pods {
		b.Pods = append(b.Pods, p)
	}
	sort.Slice(b.Pods, func(i, j int) bool { return b.Pods[i].Name < b.Pods[j].Name })

	if o.gaps["replicasets"] != nil {
		b.MarkUnreadable("replicasets", o.gaps["replicasets"])
	} else {
		for i := range o.replicaSets.Items {
			b.ReplicaSets[o.replicaSets.Items[i].Name] = &o.replicaSets.Items[i]
		}
	}
	if o.gaps["deployments"] != nil {
		b.MarkUnreadable("deployments", o.gaps["deployments"])
	} else {
		for i := range o.deployments.Items {
			b.Deployments[o.deployments.Items[i].Name] = &o.deployments.Items[i]
		}
	}
	if o.gaps["statefulsets"] != nil {
		b.MarkUnreadable("statefulsets", o.gaps["statefulsets"])
	} else {
		b.StatefulSets = o.statefulSets.Items
	}
	if o.gaps["daemonsets"] != nil {
		b.MarkUnreadable("daemonsets", o.gaps["daemonsets"])
	} else {
		b.DaemonSets = o.daemonSets.Items
	}
	b.Resolve()
	if o.gaps["poddisruptionbudgets"] != nil {
		b.MarkUnreadable("poddisruptionbudgets", o.gaps["poddisruptionbudgets"])
	} else {
		b.PDBs = o.pdbs.Items
	}
	if o.gaps["networkpolicies"] != nil {
		b.MarkUnreadable("networkpolicies", o.gaps["networkpolicies"])
	} else {
		b.NetworkPolicies = o.netpols.Items
	}
	return b, nil
}

// Resolve computes what the checks derive from the objects: each live
// pod's workload (Workload, with Inferred where the owner chain could not
// be read) and the template stand-ins for workloads the Service selects
// that run no pod. loadBackend calls it; a caller that fills a Backend's
// objects itself (from informers) calls it after each change.
func (b *Backend) Resolve() {
	b.Workload, b.Inferred, b.Templates = map[string]WorkloadRef{}, map[string]Inference{}, nil
	if b.ReplicaSets == nil {
		b.ReplicaSets = map[string]*appsv1.ReplicaSet{}
	}
	if b.Deployments == nil {
		b.Deployments = map[string]*appsv1.Deployment{}
	}
	live := map[WorkloadRef]bool{}
	for _, p := range b.Pods {
		ref, inf := b.resolveOwner(p)
		b.Workload[p.Name] = ref
		if inf.How != "" {
			b.Inferred[p.Name] = inf
		}
		live[ref] = true
	}
	if b.Service != nil && len(b.Service.Spec.Selector) > 0 {
		b.addTemplates(b.Service.Spec.Selector, live)
		b.addOtherTemplates(b.Service.Spec.Selector, live)
	}
}

// MarkUnreadable records that resource ("namespaces", "services",
// "endpointslices", "pods", "replicasets", "deployments", "statefulsets",
// "daemonsets", "poddisruptionbudgets" or "networkpolicies") could not be read for this
// backend (err: the API server's refusal, e.g. 403 Forbidden; any other
// error, or nil when a caller knows beforehand, as kadmit watch does from a
// SelfSubjectAccessReview, counts as "forbidden" if err is nil): it sets
// the matching ...Unknown field and adds the AccessGap saying what the
// checks cannot tell. loadBackend calls it for every refused read.
// An unknown resource name panics (a programming error).
func (b *Backend) MarkUnreadable(resource string, err error) {
	ns, name := b.Namespace, b.Name
	const lostTemplates = "pods of %s that run none were not modelled (the bootstrap deadlock " + IDSelfInterception + " and " + IDSelectorCollision + " may be missed)"
	switch resource {
	case "namespaces":
		// The namespace may exist; its labels are unknown. The API server
		// always sets kubernetes.io/metadata.name, so selectors on the name
		// are still decided exactly.
		b.NamespaceExists = true
		b.gap("get", "namespaces", "", ns, err, "whether namespace "+ns+" still exists ("+IDOrphan+") and its labels, which namespaceSelectors are matched against ("+IDSelfInterception+" is a warning, not an error, unless the selector decides on the name alone)")
	case "services":
		b.ServiceUnknown = true
		b.gap("get", "services", "", ns, err, "whether Service "+ns+"/"+name+" exists ("+IDServiceMissing+"), its ports ("+IDServicePortMissing+") and selector: no endpoint, collision or certificate check was made")
	case "endpointslices":
		b.SlicesUnknown = true
		b.gap("list", "endpointslices", "discovery.k8s.io", ns, err, "which endpoints the API server would call: ready endpoints ("+IDNoReadyEndpoints+"), refused connections ("+IDEndpointRefused+") and the serving certificates (KD4xx) were not checked")
	case "pods":
		b.PodsUnknown = true
		b.gap("list", "pods", "", ns, err, "which running pods the Service selects: the selector collision check ("+IDSelectorCollision+") saw only workload templates, and the pods' container ports ("+IDTargetPortMismatch+") were not compared")
	case "replicasets":
		b.ReplicaSetsUnknown = true
		b.gap("list", "replicasets", "apps", ns, err, "which ReplicaSet, and so which Deployment, owns each pod: owners were inferred from the pod-template-hash label and the <deployment>-<hash> naming, so a selector collision ("+IDSelectorCollision+") is an error only where the Deployments read confirm it")
	case "deployments":
		b.DeploymentsUnknown = true
		b.gap("list", "deployments", "apps", ns, err, "the Deployments behind the pods: pods of Deployments that run none were not modelled (the bootstrap deadlock "+IDSelfInterception+" and "+IDSelectorCollision+" may be missed), and owners inferred from names stay unconfirmed")
	case "statefulsets":
		b.OtherTemplatesUnknown = append(b.OtherTemplatesUnknown, "StatefulSets")
		b.gap("list", "statefulsets", "apps", ns, err, fmt.Sprintf(lostTemplates, "StatefulSets"))
	case "daemonsets":
		b.OtherTemplatesUnknown = append(b.OtherTemplatesUnknown, "DaemonSets")
		b.gap("list", "daemonsets", "apps", ns, err, fmt.Sprintf(lostTemplates, "DaemonSets"))
	case "poddisruptionbudgets":
		b.PDBsUnknown = true
		b.gap("list", "poddisruptionbudgets", "policy", ns, err, "whether a PodDisruptionBudget covers the webhook's pods ("+IDNoPodDisruptionBudget+" was not checked)")
	case "networkpolicies":
		b.NetworkPoliciesUnknown = true
		b.gap("list", "networkpolicies", "networking.k8s.io", ns, err, "whether a NetworkPolicy isolates the webhook's pods from the API server ("+IDNetworkPolicyBlocks+" was not checked)")
	default:
		panic("doctor: MarkUnreadable: unknown resource " + resource)
	}
}

// isAccessGap reports whether err means doctor may not read the object (403
// Forbidden) or the API server does not serve the resource (404 on a list):
// both leave the check unable to tell, neither means doctor cannot run.
func isAccessGap(err error) bool {
	return err != nil && (apierrors.IsForbidden(err) || apierrors.IsMethodNotSupported(err))
}

// gap records what doctor could not read and what that leaves unknown.
func (b *Backend) gap(verb, resource, group, ns string, err error, lost string) {
	b.Gaps = append(b.Gaps, newGap(verb, resource, group, ns, err, lost))
}

// resolveOwner finds a pod's top-level controller and says how, when it is
// inferred rather than read (zero Inference when every link was read):
//
//   - controller owner references are followed Pod -> ReplicaSet ->
//     Deployment when the ReplicaSet can be read;
//   - when it cannot (list forbidden, or the ReplicaSet no longer exists, as
//     in a namespace recreated from manifests), the Deployment is inferred
//     the way the Deployment controller names its ReplicaSets
//     (kubernetes pkg/controller/deployment/sync.go, getNewReplicaSet: Name d.Name + "-" + podTemplateSpecHash):
//     a ReplicaSet named N-H whose pod carries pod-template-hash=H belongs
//     to Deployment N. Confirmed means a Deployment N was read and its
//     selector matches the pod.
//   - a ReplicaSet that cannot be read and whose name does not follow that
//     scheme may still belong to a Deployment whose selector matches the
//     pod: when exactly one such Deployment was read, it is taken.
//
// Other controllers (StatefulSet, DaemonSet, Job, custom kinds) end the
// walk. A pod without a controller is its own workload.
func (b *Backend) resolveOwner(p *corev1.Pod) (WorkloadRef, Inference) {
	c := metav1.GetControllerOfNoCopy(p)
	if c == nil {
		return WorkloadRef{Kind: "Pod", Name: p.Name}, Inference{}
	}
	ref := WorkloadRef{Kind: c.Kind, Name: c.Name}
	if c.Kind != "ReplicaSet" {
		return ref, Inference{}
	}
	if rs := b.ReplicaSets[c.Name]; rs != nil {
		if d := metav1.GetControllerOfNoCopy(rs); d != nil {
			return WorkloadRef{Kind: d.Kind, Name: d.Name}, Inference{}
		}
		return ref, Inference{}
	}
	why := "absent"
	if b.ReplicaSetsUnknown {
		why = "not readable"
	}
	if hash := p.Labels[appsv1.DefaultDeploymentUniqueLabelKey]; hash != "" && strings.HasSuffix(c.Name, "-"+hash) && len(c.Name) > len(hash)+1 {
		name := strings.TrimSuffix(c.Name, "-"+hash)
		how := fmt.Sprintf("ReplicaSet %s is %s; Deployment/%s inferred from its name and the pod's label %s=%s", c.Name, why, name, appsv1.DefaultDeploymentUniqueLabelKey, hash)
		if d := b.Deployments[name]; d != nil && deploymentSelects(d, p.Labels) {
			return WorkloadRef{Kind: "Deployment", Name: name}, Inference{How: how + ", confirmed by Deployment " + name + "'s selector", Confirmed: true}
		}
		return WorkloadRef{Kind: "Deployment", Name: name}, Inference{How: how + " (no Deployment " + name + " selecting the pod was read)"}
	}
	var match []string
	for _, n := range slices.Sorted(maps.Keys(b.Deployments)) {
		if deploymentSelects(b.Deployments[n], p.Labels) {
			match = append(match, n)
		}
	}
	if len(match) == 1 {
		return WorkloadRef{Kind: "Deployment", Name: match[0]}, Inference{How: fmt.Sprintf("ReplicaSet %s is %s; Deployment/%s is the only Deployment whose selector matches the pod", c.Name, why, match[0])}
	}
	return ref, Inference{How: fmt.Sprintf("ReplicaSet %s is %s, so the Deployment above it (if any) is unknown", c.Name, why)}
}

// Inference says how a pod's workload was found when not every link of its
// owner chain could be read. Confirmed is true when an object doctor read
// (the Deployment, by its selector) agrees with the inference: such an owner
// counts as known for error-severity findings.
type Inference struct {
	How       string
	Confirmed bool
}

func deploymentSelects(d *appsv1.Deployment, podLabels map[string]string) bool {
	if d.Spec.Selector == nil {
		return false
	}
	ok, err := SelectorMatches(d.Spec.Selector, podLabels)
	return err == nil && ok && len(d.Spec.Selector.MatchLabels)+len(d.Spec.Selector.MatchExpressions) > 0
}

// ownerKnown reports whether pod's workload rests only on objects doctor
// read (directly, or inferred and confirmed by a Deployment read).
func (b *Backend) ownerKnown(pod string) bool {
	inf, inferred := b.Inferred[pod]
	return !inferred || inf.Confirmed
}

// addTemplates models the pods of Deployments and ReplicaSets whose template
// the selector matches and which have no live pod: in a bootstrap deadlock
// these are exactly the pods that can never be created.
func (b *Backend) addTemplates(selector map[string]string, live map[WorkloadRef]bool) {
	sel := labels.SelectorFromSet(selector)
	names := slices.Sorted(maps.Keys(b.Deployments))
	for _, n := range names {
		d := b.Deployments[n]
		ref := WorkloadRef{Kind: "Deployment", Name: d.Name}
		if !live[ref] && sel.Matches(labels.Set(d.Spec.Template.Labels)) && !b.mayRunPodsOf(d) {
			b.Templates = append(b.Templates, TemplatePod{Workload: ref, Labels: d.Spec.Template.Labels, Spec: d.Spec.Template.Spec})
			live[ref] = true
		}
	}
	for _, n := range slices.Sorted(maps.Keys(b.ReplicaSets)) {
		rs := b.ReplicaSets[n]
		ref := WorkloadRef{Kind: "ReplicaSet", Name: rs.Name}
		if d := metav1.GetControllerOfNoCopy(rs); d != nil && d.Kind == "Deployment" {
			ref = WorkloadRef{Kind: "Deployment", Name: d.Name}
		}
		if !live[ref] && sel.Matches(labels.Set(rs.Spec.Template.Labels)) {
			b.Templates = append(b.Templates, TemplatePod{Workload: ref, Labels: rs.Spec.Template.Labels, Spec: rs.Spec.Template.Spec})
			live[ref] = true
		}
	}
}

// mayRunPodsOf reports whether a live pod whose owner chain could not be
// read completely is matched by d's selector: that pod is most likely d's,
// so d gets no template stand-in (which would count d twice).
func (b *Backend) mayRunPodsOf(d *appsv1.Deployment) bool {
	for _, p := range b.Pods {
		if _, inferred := b.Inferred[p.Name]; inferred && deploymentSelects(d, p.Labels) {
			return true
		}
	}
	return false
}

// addOtherTemplates does the same for StatefulSets and DaemonSets.
func (b *Backend) addOtherTemplates(selector map[string]string, live map[WorkloadRef]bool) {
	sel := labels.SelectorFromSet(selector)
	for _, s := range b.StatefulSets {
		ref := WorkloadRef{Kind: "StatefulSet", Name: s.Name}
		if !live[ref] && sel.Matches(labels.Set(s.Spec.Template.Labels)) {
			b.Templates = append(b.Templates, TemplatePod{Workload: ref, Labels: s.Spec.Template.Labels, Spec: s.Spec.Template.Spec})
			live[ref] = true
		}
	}
	for _, s := range b.DaemonSets {
		ref := WorkloadRef{Kind: "DaemonSet", Name: s.Name}
		if !live[ref] && sel.Matches(labels.Set(s.Spec.Template.Labels)) {
			b.Templates = append(b.Templates, TemplatePod{Workload: ref, Labels: s.Spec.Template.Labels, Spec: s.Spec.Template.Spec})
			live[ref] = true
		}
	}
}

// objects lists what must be admitted for the backend's pods to (re)start:
// pod CREATE for each live pod and template, ReplicaSet CREATE and UPDATE and
// Deployment UPDATE for their controllers.
func (b *Backend) objects() []Object {
	nsl := namespaceLabels(b.Namespace, b.NamespaceLabels)
	mk := func(group, res, kind, op, name string, lbls map[string]string, user Requester, desc string) Object {
		return Object{Request: Request{Group: group, Version: "v1", Resource: res, Operation: opType(op), Namespaced: true}, Kind: kind,
			Namespace: b.Namespace, NamespaceLabels: nsl, NamespaceLabelsUnknown: !b.NamespaceLabelsKnown, Labels: lbls, Name: name, User: user, Describe: desc}
	}
	var out []Object
	seenRS, seenDeploy := map[string]bool{}, map[string]bool{}
	addOwners := func(ref WorkloadRef) {
		if ref.Kind == "Deployment" && !seenDeploy[ref.Name] {
			seenDeploy[ref.Name] = true
			if d := b.Deployments[ref.Name]; d != nil {
				out = append(out, mk("apps", "deployments", "Deployment", "UPDATE", d.Name, d.Labels, anyUser, "Deployment "+b.Namespace+"/"+d.Name))
			}
			for _, n := range slices.Sorted(maps.Keys(b.ReplicaSets)) {
				rs := b.ReplicaSets[n]
				if c := metav1.GetControllerOfNoCopy(rs); c != nil && c.Kind == "Deployment" && c.Name == ref.Name && !seenRS[rs.Name] {
					seenRS[rs.Name] = true
					out = append(out, mk("apps", "replicasets", "ReplicaSet", "CREATE", rs.Name, rs.Labels, deploymentController, "ReplicaSet "+b.Namespace+"/"+rs.Name))
				}
			}
		}
	}
	// Pods of one workload with the same labels are the same request to a
	// webhook's rules, selectors and (since they share a template)
	// matchConditions: one stands for all, which bounds the CEL evaluations
	// by workloads, not replicas.
	seenPod := map[string]bool{}
	for _, p := range b.Pods {
		key := b.Workload[p.Name].String() + "|" + labels.Set(p.Labels).String()
		if seenPod[key] {
			continue
		}
		seenPod[key] = true
		o := mk("", "pods", "Pod", "CREATE", "", p.Labels, podCreator(b.Workload[p.Name]), "pod "+b.Namespace+"/"+p.Name)
		o.Body = podBody(p.Spec)
		out = append(out, o)
		addOwners(b.Workload[p.Name])
	}
	for _, t := range b.Templates {
		o := mk("", "pods", "Pod", "CREATE", "", t.Labels, podCreator(t.Workload), "new pods of "+t.Workload.String()+" in "+b.Namespace)
		o.Body = podBody(t.Spec)
		out = append(out, o)
		addOwners(t.Workload)
	}
	return out
}

// podCreator is who creates a workload's pods.
func podCreator(ref WorkloadRef) Requester {
	switch ref.Kind {
	case "Deployment", "ReplicaSet":
		return replicaSetController
	case "StatefulSet":
		return statefulSetController
	case "DaemonSet":
		return daemonSetController
	case "Job":
		return controllerSA("job-controller")
	default:
		return anyUser
	}
}

// podBody is a pod's spec as the JSON matchConditions see in object.spec.
func podBody(spec corev1.PodSpec) map[string]any {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&spec)
	if err != nil {
		return nil
	}
	return map[string]any{"spec": m}
}
