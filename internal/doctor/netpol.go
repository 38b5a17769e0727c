package doctor

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
)

// KD107 reads NetworkPolicies statically, with the semantics the API
// documents (k8s.io/api v0.37.1 networking/v1/types.go, NetworkPolicySpec,
// NetworkPolicyIngressRule, NetworkPolicyPort, NetworkPolicyPeer, IPBlock):
//
//   - a pod is isolated for ingress when a policy of its namespace selects
//     it (podSelector) and lists Ingress in policyTypes (an empty
//     policyTypes counts as Ingress);
//   - traffic to an isolated pod is allowed when it comes from the pod's
//     own node, or when at least one ingress rule of one selecting policy
//     admits it: rules add up across policies;
//   - a rule admits traffic that matches one of its ports (none: every
//     port) and one of its peers (none: every source);
//   - a port matches by protocol (default TCP) and by number, by a range
//     port..endPort, or by name (the pod's container port of that name);
//   - an ipBlock peer admits addresses inside cidr and outside every
//     except; podSelector/namespaceSelector peers select pods, and the API
//     server is not one (hostNetwork pods are matched, or not, as each CNI
//     decides: the API does not define it).
//
// The API server's calls come from the addresses of Service
// default/kubernetes's EndpointSlices (APIServerAddresses).

// MaxAPIServerAddresses bounds APIServerAddresses: more than any control
// plane has. Slices listing more leave the addresses unknown (a cut list
// would make KD107 blame a policy for refusing addresses it was never
// shown).
const MaxAPIServerAddresses = 64

// APIServerAddressesFrom returns the addresses of the EndpointSlices of
// Service default/kubernetes (the caller selects them by the label
// kubernetes.io/service-name=kubernetes in namespace default): every
// address of every endpoint, deduplicated and sorted. known is false when
// they name none (an API server with --endpoint-reconciler-type=none) or
// more than MaxAPIServerAddresses; the addresses are then nil.
func APIServerAddressesFrom(sl []discoveryv1.EndpointSlice) (addrs []string, known bool) {
	seen := map[string]bool{}
	for _, s := range sl {
		for _, e := range s.Endpoints {
			for _, a := range e.Addresses {
				if seen[a] {
					continue
				}
				if len(addrs) == MaxAPIServerAddresses {
					return nil, false
				}
				seen[a] = true
				addrs = append(addrs, a)
			}
		}
	}
	sort.Strings(addrs)
	return addrs, len(addrs) > 0
}

// loadAPIServerAddresses fills APIServerAddresses from the EndpointSlices
// of default/kubernetes. A refused list becomes an AccessGap.
//
// Errors: the list failed with anything but Forbidden/not served (wrapped).
func (s *Snapshot) loadAPIServerAddresses(ctx context.Context, cs kubernetes.Interface) error {
	sl, err := cs.DiscoveryV1().EndpointSlices(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{
		LabelSelector: labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: "kubernetes"}).String()})
	switch {
	case isAccessGap(err):
		s.Gaps = append(s.Gaps, newGap("list", "endpointslices", "discovery.k8s.io", metav1.NamespaceDefault, err,
			"the API server's addresses (Service default/kubernetes): NetworkPolicy ipBlock peers could not be compared with them ("+IDNetworkPolicyBlocks+" says so, at a lower severity)"))
		return nil
	case err != nil:
		return fmt.Errorf("list EndpointSlices of service default/kubernetes: %w", err)
	}
	s.APIServerAddresses, s.APIServerAddressesKnown = APIServerAddressesFrom(sl.Items)
	return nil
}

// npTarget is one pod (live, or a template stand-in) behind the webhook's
// Service, with the port the API server's calls reach it on.
type npTarget struct {
	workload WorkloadRef
	name     string // "pod x", or "new pods of Deployment/x"
	labels   map[string]string
	hostIPs  []string
	port     int32
	// portNames are the names of the pod's TCP container ports numbered
	// port: what a named policy port matches.
	portNames []string
}

// npOutcome is what the selecting policies do to the API server's calls to
// one target.
type npOutcome struct {
	policies []string // the selecting policies, "ns/name"
	// blocked are the API server addresses no rule admits (all of them
	// when they are unknown and no rule could admit any).
	blocked []string
	// undecidable: the addresses are unknown and only ipBlock peers could
	// admit them.
	undecidable bool
	// peers describes podSelector/namespaceSelector peers on rules for
	// the port: they do not admit the API server.
	peers []string
	// unsure lists why a blocking verdict may not hold.
	unsure []string
}

// checkNetworkPolicies runs KD107 for a Service webhook: NetworkPolicies of
// the webhook's namespace that isolate its pods for ingress without
// admitting the API server on the port its calls arrive at.
func (r *run) checkNetworkPolicies(w *Webhook) []Finding {
	b := r.backends[w.ServiceKey()]
	if b == nil || b.Service == nil || b.NetworkPoliciesUnknown || len(b.NetworkPolicies) == 0 {
		return nil
	}
	var sp *corev1.ServicePort
	for i := range b.Service.Spec.Ports {
		if b.Service.Spec.Ports[i].Port == w.ServicePort() {
			sp = &b.Service.Spec.Ports[i]
		}
	}
	if sp == nil {
		return nil // KD102
	}
	type hit struct {
		t npTarget
		o npOutcome
	}
	var hits []hit
	total := 0
	for _, t := range npTargets(b, sp) {
		total++
		if o, blocked := r.evalPolicies(b, t); blocked {
			hits = append(hits, hit{t, o})
		}
	}
	if len(hits) == 0 {
		return nil
	}
	var workloads, policies, blockedAddrs, peers, unsure []string
	undecidable := false
	for _, h := range hits {
		if !slices.Contains(workloads, h.t.workload.String()) {
			workloads = append(workloads, h.t.workload.String())
		}
		policies = appendNew(policies, h.o.policies...)
		blockedAddrs = appendNew(blockedAddrs, h.o.blocked...)
		peers = appendNew(peers, h.o.peers...)
		unsure = appendNew(unsure, h.o.unsure...)
		if len(unsure) > maxListed {
			unsure = unsure[:maxListed] // each names a peer; the first few say it
		}
		undecidable = undecidable || h.o.undecidable
	}
	sort.Strings(blockedAddrs)
	t := hits[0].t
	portDesc := fmt.Sprintf("port %d/TCP", t.port)
	if len(t.portNames) > 0 {
		portDesc += " (" + strings.Join(t.portNames, ", ") + ")"
	}
	of := ""
	if len(hits) < total {
		of = fmt.Sprintf(" (%d of the %d pods and templates behind the Service)", len(hits), total)
	}
	what := fmt.Sprintf("NetworkPolicy %s selects the pods of %s%s behind Service %s/%s and isolates them for ingress, ",
		joinListed(policies), joinListed(workloads), of, b.Namespace, b.Name)
	switch {
	case undecidable:
		what += fmt.Sprintf("but its ingress rules admit %s only from ipBlock peers, and the API server's addresses are unknown: doctor cannot tell whether they admit the API server.", portDesc)
	case !r.snap.APIServerAddressesKnown:
		what += fmt.Sprintf("and no ingress rule admits any source outside the cluster's pods on %s: the API server (whatever its address) cannot reach them.", portDesc)
	default:
		what += fmt.Sprintf("and no ingress rule admits the API server (%s, the addresses of Service default/kubernetes) on %s.", joinListed(blockedAddrs), portDesc)
	}
	// Error for a Fail webhook, warning for Ignore (calls time out and the
	// policy is silently skipped); one step lower when doctor cannot tell.
	sev := SeverityError
	if !w.Fail() {
		sev = SeverityWarning
	}
	if len(unsure) > 0 && !undecidable {
		what = cannotTell(what, unsure)
	}
	if undecidable || len(unsure) > 0 {
		sev = lower(sev)
	}
	why := fmt.Sprintf("Where the CNI enforces NetworkPolicy (Calico, Cilium, Antrea, OVN-Kubernetes, kube-router ... do; some managed CNIs need it enabled), it drops the API server's connections to the webhook: each call waits timeoutSeconds (%ds) and fails with \"context deadline exceeded\" or \"dial tcp ...: i/o timeout\"; %s", w.TimeoutSeconds, consequence(w))
	if len(peers) > 0 {
		why += fmt.Sprintf(" The rules for this port admit %s: podSelector and namespaceSelector peers select pods, and the API server is not a pod of the cluster network (on a node, its traffic comes from the node's address; some CNIs treat host traffic specially, and traffic from a pod's own node is always allowed).", joinListed(peers))
	}
	why += " (NetworkPolicy semantics: k8s.io/api networking/v1 NetworkPolicySpec.ingress, NetworkPolicyPeer, IPBlock.)"
	return []Finding{{ID: IDNetworkPolicyBlocks, Severity: sev, What: what, Why: why, Fix: r.netpolFix(b, t)}}
}

// lower is the next lower severity.
func lower(s Severity) Severity {
	if s == SeverityError {
		return SeverityWarning
	}
	return SeverityInfo
}

// appendNew appends each of vs not yet in out.
func appendNew(out []string, vs ...string) []string {
	for _, v := range vs {
		if !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	return out
}

// npTargets lists the webhook's pods (one per workload and label set) and
// template stand-ins, with the port number the Service's targetPort names
// on each: a number as is (0: the Service port), a name through the pod's
// container ports (as the endpoints controller resolves it; a name the pod
// does not declare is KD103's, and the pod is left out).
func npTargets(b *Backend, sp *corev1.ServicePort) []npTarget {
	var out []npTarget
	add := func(ref WorkloadRef, name string, lbls map[string]string, spec *corev1.PodSpec, hostIPs []string) {
		port, ok := resolveTargetPort(sp, spec)
		if !ok {
			return
		}
		out = append(out, npTarget{workload: ref, name: name, labels: lbls, hostIPs: hostIPs, port: port, portNames: portNamesOf(spec, port)})
	}
	seen := map[string]bool{}
	for _, p := range b.Pods {
		ref := b.Workload[p.Name]
		var hostIPs []string
		for _, h := range p.Status.HostIPs {
			hostIPs = append(hostIPs, h.IP)
		}
		if p.Status.HostIP != "" && !slices.Contains(hostIPs, p.Status.HostIP) {
			hostIPs = append(hostIPs, p.Status.HostIP)
		}
		// Pods of one workload differ only by node: keep one per node
		// address, since traffic from a pod's own node is allowed.
		key := ref.String() + "|" + labels.Set(p.Labels).String() + "|" + strings.Join(hostIPs, ",")
		if seen[key] {
			continue
		}
		seen[key] = true
		add(ref, "pod "+p.Name, p.Labels, &p.Spec, hostIPs)
	}
	for i := range b.Templates {
		t := &b.Templates[i]
		add(t.Workload, "new pods of "+t.Workload.String(), t.Labels, &t.Spec, nil)
	}
	return out
}

// resolveTargetPort is the container port number the Service port sends to.
func resolveTargetPort(sp *corev1.ServicePort, spec *corev1.PodSpec) (int32, bool) {
	tp := sp.TargetPort
	switch {
	case tp.Type == intstr.Int && tp.IntVal == 0:
		return sp.Port, true
	case tp.Type == intstr.Int:
		return tp.IntVal, true
	}
	for _, c := range spec.Containers {
		for _, p := range c.Ports {
			if p.Name == tp.StrVal && (p.Protocol == "" || p.Protocol == corev1.ProtocolTCP) {
				return p.ContainerPort, true
			}
		}
	}
	return 0, false
}

// portNamesOf lists the names of spec's TCP container ports numbered port.
func portNamesOf(spec *corev1.PodSpec, port int32) []string {
	var out []string
	for _, c := range spec.Containers {
		for _, p := range c.Ports {
			if p.ContainerPort == port && p.Name != "" && (p.Protocol == "" || p.Protocol == corev1.ProtocolTCP) {
				out = append(out, p.Name)
			}
		}
	}
	return out
}

// isolatesIngress reports whether np affects ingress: policyTypes lists
// Ingress, or is empty (then every policy affects ingress, types.go
// NetworkPolicySpec.policyTypes).
func isolatesIngress(np *networkingv1.NetworkPolicy) bool {
	return len(np.Spec.PolicyTypes) == 0 || slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress)
}

// evalPolicies decides whether the policies of b's namespace let the API
// server reach target t. blocked is false when no policy isolates t, or
// some rule admits every API server address (or any source).
func (r *run) evalPolicies(b *Backend, t npTarget) (npOutcome, bool) {
	var o npOutcome
	type block struct {
		prefix netip.Prefix
		except []netip.Prefix
	}
	var blocks []block
	for i := range b.NetworkPolicies {
		np := &b.NetworkPolicies[i]
		if !isolatesIngress(np) {
			continue
		}
		if ok, err := SelectorMatches(&np.Spec.PodSelector, t.labels); err != nil || !ok {
			continue
		}
		o.policies = append(o.policies, np.Namespace+"/"+np.Name)
		for _, rule := range np.Spec.Ingress {
			if !portsAdmit(rule.Ports, t.port, t.portNames) {
				continue
			}
			if len(rule.From) == 0 {
				return o, false // every source
			}
			for _, peer := range rule.From {
				if peer.IPBlock != nil {
					p, err := netip.ParsePrefix(peer.IPBlock.CIDR)
					if err != nil {
						continue // the API server validates cidr; an old object, never matched
					}
					bl := block{prefix: p}
					for _, e := range peer.IPBlock.Except {
						if ep, err := netip.ParsePrefix(e); err == nil {
							bl.except = append(bl.except, ep)
						}
					}
					blocks = append(blocks, bl)
					continue
				}
				o.peers = appendNew(o.peers, describePeer(peer))
				if why := r.mayMatchAPIServerPod(peer, np.Namespace); why != "" {
					o.unsure = appendNew(o.unsure, why)
				}
			}
		}
	}
	if len(o.policies) == 0 {
		return o, false
	}
	if !r.snap.APIServerAddressesKnown {
		if len(blocks) > 0 {
			o.undecidable = true
		}
		return o, true
	}
	for _, a := range r.snap.APIServerAddresses {
		if slices.Contains(t.hostIPs, a) {
			continue // traffic from the pod's own node is allowed
		}
		addr, err := netip.ParseAddr(a)
		admitted := false
		if err == nil {
			addr = addr.Unmap()
			for _, bl := range blocks {
				if bl.prefix.Contains(addr) && !slices.ContainsFunc(bl.except, func(e netip.Prefix) bool { return e.Contains(addr) }) {
					admitted = true
					break
				}
			}
		}
		if !admitted {
			o.blocked = append(o.blocked, a)
		}
	}
	return o, len(o.blocked) > 0
}

// portsAdmit reports whether a rule's ports admit TCP port (whose
// container port names are names): no ports admits every port; a port
// entry matches by protocol (default TCP), then by number, range
// port..endPort, name, or (no port) every port of the protocol.
func portsAdmit(ports []networkingv1.NetworkPolicyPort, port int32, names []string) bool {
	if len(ports) == 0 {
		return true
	}
	for _, p := range ports {
		if p.Protocol != nil && *p.Protocol != corev1.ProtocolTCP {
			continue
		}
		switch {
		case p.Port == nil:
			return true
		case p.Port.Type == intstr.String:
			if slices.Contains(names, p.Port.StrVal) {
				return true
			}
		case p.EndPort != nil:
			if port >= p.Port.IntVal && port <= *p.EndPort {
				return true
			}
		case p.Port.IntVal == port:
			return true
		}
	}
	return false
}

// describePeer renders a podSelector/namespaceSelector peer for messages.
func describePeer(p networkingv1.NetworkPolicyPeer) string {
	var parts []string
	if p.NamespaceSelector != nil {
		parts = append(parts, "namespaceSelector "+selectorString(p.NamespaceSelector))
	}
	if p.PodSelector != nil {
		parts = append(parts, "podSelector "+selectorString(p.PodSelector))
	}
	return strings.Join(parts, " + ")
}

// apiServerPods are the labels of the API server's own (static, host
// network) pods: kubeadm's manifests in kube-system
// (component=kube-apiserver, tier=control-plane) and OpenShift's in
// openshift-kube-apiserver (app=openshift-kube-apiserver, apiserver=true).
var apiServerPods = []struct {
	namespace string
	labels    map[string]string
}{
	{"kube-system", map[string]string{"component": "kube-apiserver", "tier": "control-plane"}},
	{"openshift-kube-apiserver", map[string]string{"app": "openshift-kube-apiserver", "apiserver": "true"}},
}

// mayMatchAPIServerPod says why a podSelector/namespaceSelector peer may
// still admit the API server: it selects the namespace and labels of the
// API server's own host-network pod, and the NetworkPolicy API leaves it
// to each CNI whether such selectors match host-network pods. "" when it
// does not select them.
func (r *run) mayMatchAPIServerPod(p networkingv1.NetworkPolicyPeer, policyNS string) string {
	for _, a := range apiServerPods {
		if p.NamespaceSelector == nil && a.namespace != policyNS {
			continue
		}
		if p.NamespaceSelector != nil {
			if ok, err := SelectorMatches(p.NamespaceSelector, namespaceLabels(a.namespace, r.namespaces[a.namespace])); err != nil || !ok {
				continue
			}
		}
		if ok, err := SelectorMatches(p.PodSelector, a.labels); err != nil || !ok {
			continue
		}
		return fmt.Sprintf("peer %s selects the API server's own pod in %s (a host-network static pod), and whether a podSelector or namespaceSelector matches host-network pods is left to each CNI", describePeer(p), a.namespace)
	}
	return ""
}

// netpolFix is an additional NetworkPolicy (ingress rules add up across
// policies) admitting the API server's addresses on t's port, selecting
// the pods the Service selects, as one kubectl command.
func (r *run) netpolFix(b *Backend, t npTarget) string {
	sel := b.Service.Spec.Selector
	if len(sel) == 0 {
		sel = map[string]string{}
		for k, v := range t.labels {
			if k != "pod-template-hash" && k != "controller-revision-hash" {
				sel[k] = v
			}
		}
	}
	name := "allow-apiserver-to-" + b.Name
	if len(name) > 63 {
		name = strings.TrimRight(name[:63], "-.")
	}
	var from []map[string]any
	addrs := r.snap.APIServerAddresses
	prefix := ""
	if !r.snap.APIServerAddressesKnown {
		addrs = []string{"<API server address>"}
		prefix = "kubectl get endpointslices -n default -l kubernetes.io/service-name=kubernetes -o jsonpath='{.items[*].endpoints[*].addresses[*]}'  # the API server's addresses; put each in an ipBlock below, then: "
	}
	for _, a := range addrs {
		bits := "/32"
		if addr, err := netip.ParseAddr(a); err == nil && addr.Unmap().Is6() {
			bits = "/128"
		}
		from = append(from, map[string]any{"ipBlock": map[string]any{"cidr": a + bits}})
	}
	np := map[string]any{
		"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
		"metadata": map[string]any{"name": name, "namespace": b.Namespace},
		"spec": map[string]any{
			"podSelector": map[string]any{"matchLabels": sel},
			"policyTypes": []string{"Ingress"},
			"ingress":     []map[string]any{{"ports": []map[string]any{{"port": t.port, "protocol": "TCP"}}, "from": from}},
		},
	}
	data, _ := json.Marshal(np) // maps of strings and numbers always encode
	return prefix + "echo " + shellQuote(string(data)) + " | kubectl apply -f -  # admits the API server on port " + strconv.Itoa(int(t.port)) + "; NetworkPolicies add up, so the existing ones stay as they are"
}
