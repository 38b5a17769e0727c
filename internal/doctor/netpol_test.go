package doctor

import (
	"strconv"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
)

// apiServerSlice is default/kubernetes's EndpointSlice with addrs.
func apiServerSlice(addrs ...string) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes", Namespace: "default", Labels: map[string]string{discoveryv1.LabelServiceName: "kubernetes"}},
		AddressType: discoveryv1.AddressTypeIPv4, Ports: []discoveryv1.EndpointPort{{Name: ptrTo("https"), Port: ptrTo(int32(6443))}}}
	for _, a := range addrs {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{a}})
	}
	return s
}

func netpol(name string, podSel map[string]string, types []networkingv1.PolicyType, rules ...networkingv1.NetworkPolicyIngressRule) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: lwsNS},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: podSel}, PolicyTypes: types, Ingress: rules}}
}

var ingressOnly = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}

func npPort(p intstr.IntOrString, proto corev1.Protocol, end *int32) networkingv1.NetworkPolicyPort {
	np := networkingv1.NetworkPolicyPort{Port: &p, EndPort: end}
	if proto != "" {
		np.Protocol = &proto
	}
	return np
}

func ipPeer(cidr string, except ...string) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: cidr, Except: except}}
}

// kueueWebhook is one webhook pod of Kueue behind lws-webhook-service
// (targetPort 9443, container port "https"), failurePolicy Fail, with
// extra objects (policies, the API server's slice).
func kueueWebhook(extra ...runtime.Object) []runtime.Object {
	pod := rsPod("kueue-controller-manager", "7d9f6c4b8", kueueLabels(), "10.244.1.5")
	pod.Status.HostIP = "192.168.0.21"
	return append([]runtime.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: lwsNS}},
		deployment("kueue-controller-manager", kueueLabels()), replicaSet("kueue-controller-manager", "7d9f6c4b8", kueueLabels()), pod,
		svc("lws-webhook-service", kueueLabels()), slice("lws-webhook-service", pod),
		mutatingConfig("kueue-mutating-webhook-configuration", "mjob.kb.io", "lws-webhook-service"),
	}, extra...)
}

func kd107(t *testing.T, objs ...runtime.Object) []Finding {
	t.Helper()
	return diagnose(t, fake.NewClientset(kueueWebhook(objs...)...)).Webhook("kueue-mutating-webhook-configuration", "mjob.kb.io").ByID(IDNetworkPolicyBlocks)
}

// The runbook case (AKS and EKS troubleshooting guides, seed 004's
// "security groups" in cluster form): a default-deny policy in the
// webhook's namespace turns every call into a timeout.
func TestNetworkPolicyDefaultDeny(t *testing.T) {
	fs := kd107(t, apiServerSlice("192.168.0.10", "192.168.0.11"), netpol("default-deny", nil, ingressOnly))
	if len(fs) != 1 {
		t.Fatalf("KD107: %+v", fs)
	}
	f := fs[0]
	if f.Severity != SeverityError || !strings.Contains(f.What, "lws-system/default-deny") || !strings.Contains(f.What, "192.168.0.10, 192.168.0.11") ||
		!strings.Contains(f.What, "port 9443/TCP (https)") || !strings.Contains(f.What, "Deployment/kueue-controller-manager") {
		t.Errorf("what: %s (%s)", f.What, f.Severity)
	}
	if !strings.Contains(f.Why, "context deadline exceeded") || !strings.Contains(f.Why, "failurePolicy is Fail") {
		t.Errorf("why: %s", f.Why)
	}
	want := `echo '{"apiVersion":"networking.k8s.io/v1","kind":"NetworkPolicy","metadata":{"name":"allow-apiserver-to-lws-webhook-service","namespace":"lws-system"},"spec":{"ingress":[{"from":[{"ipBlock":{"cidr":"192.168.0.10/32"}},{"ipBlock":{"cidr":"192.168.0.11/32"}}],"ports":[{"port":9443,"protocol":"TCP"}]}],"podSelector":{"matchLabels":{"app.kubernetes.io/name":"kueue","control-plane":"controller-manager"}},"policyTypes":["Ingress"]}}' | kubectl apply -f -`
	if !strings.HasPrefix(f.Fix, want) {
		t.Errorf("fix %q\nwant prefix %q", f.Fix, want)
	}

	// The fix, applied: the policies add up and KD107 is gone.
	fix := netpol("allow-apiserver-to-lws-webhook-service", kueueLabels(), ingressOnly, networkingv1.NetworkPolicyIngressRule{
		Ports: []networkingv1.NetworkPolicyPort{npPort(intstr.FromInt32(9443), corev1.ProtocolTCP, nil)},
		From:  []networkingv1.NetworkPolicyPeer{ipPeer("192.168.0.10/32"), ipPeer("192.168.0.11/32")}})
	if fs := kd107(t, apiServerSlice("192.168.0.10", "192.168.0.11"), netpol("default-deny", nil, ingressOnly), fix); len(fs) != 0 {
		t.Errorf("after the fix: %+v", fs)
	}
}

// kadmit's own chart (deploy/helm/kadmit/templates/networkpolicy.yaml):
// the webhook port by name with no from (the default), or from
// networkPolicy.webhook.apiServerCIDRs, and the metrics port from the
// monitoring namespace. Only CIDRs that miss an API server are flagged.
func TestNetworkPolicyKadmitChartShape(t *testing.T) {
	chart := func(from ...networkingv1.NetworkPolicyPeer) *networkingv1.NetworkPolicy {
		return netpol("kadmit", kueueLabels(), ingressOnly,
			networkingv1.NetworkPolicyIngressRule{Ports: []networkingv1.NetworkPolicyPort{npPort(intstr.FromString("https"), corev1.ProtocolTCP, nil)}, From: from},
			networkingv1.NetworkPolicyIngressRule{Ports: []networkingv1.NetworkPolicyPort{npPort(intstr.FromString("metrics"), corev1.ProtocolTCP, nil)},
				From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{metadataNameLabel: "monitoring"}}, PodSelector: &metav1.LabelSelector{}}}})
	}
	api := apiServerSlice("10.0.0.10")
	for _, c := range []struct {
		name string
		np   *networkingv1.NetworkPolicy
		want bool
	}{
		{"default values: no from", chart(), false},
		{"apiServerCIDRs covering the API server", chart(ipPeer("10.0.0.10/32")), false},
		{"apiServerCIDRs as a range", chart(ipPeer("10.0.0.0/24")), false},
		{"apiServerCIDRs missing the API server", chart(ipPeer("10.0.1.0/24")), true},
		{"the API server in except", chart(ipPeer("10.0.0.0/24", "10.0.0.8/29")), true},
	} {
		fs := kd107(t, api, c.np)
		if (len(fs) > 0) != c.want {
			t.Errorf("%s: KD107 %+v, want %v", c.name, fs, c.want)
		}
		if c.want && (fs[0].Severity != SeverityError || !strings.Contains(fs[0].What, "10.0.0.10")) {
			t.Errorf("%s: %+v", c.name, fs[0])
		}
	}
}

// Ports: by number, by range (endPort), by name (the pod's container port
// name), of protocol TCP; a rule without ports admits every port.
func TestNetworkPolicyPorts(t *testing.T) {
	api := apiServerSlice("10.0.0.10")
	all := []networkingv1.NetworkPolicyPeer{ipPeer("0.0.0.0/0")}
	rule := func(ports ...networkingv1.NetworkPolicyPort) *networkingv1.NetworkPolicy {
		return netpol("p", kueueLabels(), ingressOnly, networkingv1.NetworkPolicyIngressRule{Ports: ports, From: all})
	}
	for _, c := range []struct {
		name    string
		np      *networkingv1.NetworkPolicy
		blocked bool
	}{
		{"number", rule(npPort(intstr.FromInt32(9443), "", nil)), false},
		{"other number", rule(npPort(intstr.FromInt32(443), "", nil)), true},
		{"range containing it", rule(npPort(intstr.FromInt32(9000), "", ptrTo(int32(9500)))), false},
		{"range ending before it", rule(npPort(intstr.FromInt32(8000), "", ptrTo(int32(9442)))), true},
		{"the container port's name", rule(npPort(intstr.FromString("https"), "", nil)), false},
		{"another name", rule(npPort(intstr.FromString("webhook-server"), "", nil)), true},
		{"UDP", rule(npPort(intstr.FromInt32(9443), corev1.ProtocolUDP, nil)), true},
		{"protocol only", rule(networkingv1.NetworkPolicyPort{Protocol: ptrTo(corev1.ProtocolTCP)}), false},
		{"no ports", rule(), false},
		{"second entry matches", rule(npPort(intstr.FromInt32(80), "", nil), npPort(intstr.FromInt32(9443), "", nil)), false},
	} {
		if fs := kd107(t, api, c.np); (len(fs) > 0) != c.blocked {
			t.Errorf("%s: KD107 %+v, want blocked=%v", c.name, fs, c.blocked)
		}
	}
}

// Isolation: only policies that select the webhook's pods and affect
// ingress count; rules add up across policies.
func TestNetworkPolicyIsolation(t *testing.T) {
	api := apiServerSlice("10.0.0.10")
	deny := func(name string, sel map[string]string, types []networkingv1.PolicyType) *networkingv1.NetworkPolicy {
		return netpol(name, sel, types)
	}
	if fs := kd107(t, api, deny("egress", nil, []networkingv1.PolicyType{networkingv1.PolicyTypeEgress})); len(fs) != 0 {
		t.Errorf("egress-only policy: %+v", fs)
	}
	if fs := kd107(t, api, deny("other-pods", map[string]string{"app": "other"}, ingressOnly)); len(fs) != 0 {
		t.Errorf("policy selecting other pods: %+v", fs)
	}
	// No policyTypes: every policy affects ingress.
	if fs := kd107(t, api, deny("untyped", nil, nil)); len(fs) != 1 {
		t.Errorf("policy without policyTypes: %+v", fs)
	}
	// A second policy admitting everything on the port lifts the first.
	open := netpol("open", kueueLabels(), ingressOnly, networkingv1.NetworkPolicyIngressRule{Ports: []networkingv1.NetworkPolicyPort{npPort(intstr.FromInt32(9443), "", nil)}})
	if fs := kd107(t, api, deny("deny", nil, ingressOnly), open); len(fs) != 0 {
		t.Errorf("additive policies: %+v", fs)
	}
}

// Pod and namespace selectors do not admit the API server: it is not a
// pod. Allowing the namespace its own (host-network) pod lives in is
// left to each CNI: a warning that says so.
func TestNetworkPolicySelectorPeers(t *testing.T) {
	api := apiServerSlice("10.0.0.10")
	sameNS := netpol("same-namespace", nil, ingressOnly, networkingv1.NetworkPolicyIngressRule{From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{}}}})
	fs := kd107(t, api, sameNS)
	if len(fs) != 1 || fs[0].Severity != SeverityError || !strings.Contains(fs[0].Why, `podSelector {} (everything)`) || !strings.Contains(fs[0].Why, "the API server is not a pod") {
		t.Errorf("allow same namespace: %+v", fs)
	}
	kubeSystem := netpol("from-kube-system", nil, ingressOnly, networkingv1.NetworkPolicyIngressRule{From: []networkingv1.NetworkPolicyPeer{
		{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{metadataNameLabel: "kube-system"}}}}})
	fs = kd107(t, api, kubeSystem, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kube-system", Labels: map[string]string{metadataNameLabel: "kube-system"}}})
	if len(fs) != 1 || fs[0].Severity != SeverityWarning || !strings.Contains(fs[0].What, "host-network static pod") {
		t.Errorf("allow kube-system: %+v", fs)
	}
}

// Traffic from a pod's own node is always allowed: on a single-node
// cluster (kind, MicroShift) a deny-all policy does not stop the API
// server. Pods on other nodes are still blocked.
func TestNetworkPolicyLocalNode(t *testing.T) {
	deny := netpol("default-deny", nil, ingressOnly)
	if fs := kd107(t, apiServerSlice("192.168.0.21"), deny); len(fs) != 0 {
		t.Errorf("API server on the pod's node: %+v", fs)
	}
	fs := kd107(t, apiServerSlice("192.168.0.21", "192.168.0.22"), deny)
	if len(fs) != 1 || !strings.Contains(fs[0].What, "(192.168.0.22,") || strings.Contains(fs[0].What, "192.168.0.21") {
		t.Errorf("second API server elsewhere: %+v", fs)
	}
}

// Without the API server's addresses, ipBlock rules are undecidable (a
// lower severity, saying so); a policy that admits no address at all is
// still an error.
func TestNetworkPolicyAddressesUnknown(t *testing.T) {
	withIP := netpol("from-cidr", nil, ingressOnly, networkingv1.NetworkPolicyIngressRule{From: []networkingv1.NetworkPolicyPeer{ipPeer("10.0.0.0/8")}})
	fs := kd107(t, withIP)
	if len(fs) != 1 || fs[0].Severity != SeverityWarning || !strings.Contains(fs[0].What, "addresses are unknown") {
		t.Errorf("ipBlock, addresses unknown: %+v", fs)
	}
	if !strings.HasPrefix(fs[0].Fix, "kubectl get endpointslices -n default -l kubernetes.io/service-name=kubernetes") || !strings.Contains(fs[0].Fix, `"cidr":"\u003cAPI server address\u003e/32"`) {
		t.Errorf("fix: %s", fs[0].Fix)
	}
	fs = kd107(t, netpol("default-deny", nil, ingressOnly))
	if len(fs) != 1 || fs[0].Severity != SeverityError || !strings.Contains(fs[0].What, "whatever its address") {
		t.Errorf("deny, addresses unknown: %+v", fs)
	}
	// The list refused: a gap, and the same lower severity.
	cs := fake.NewClientset(kueueWebhook(withIP)...)
	forbid(cs, "list", "discovery.k8s.io", "endpointslices")
	rep := diagnose(t, cs)
	if len(rep.Gaps) == 0 {
		t.Error("no gap for the refused EndpointSlices")
	}
}

// IPv6 API servers and an Ignore webhook (a warning: calls time out and
// the policy is skipped).
func TestNetworkPolicyIPv6Ignore(t *testing.T) {
	objs := kueueWebhook(apiServerSlice("fd00::10"), netpol("v4-only", nil, ingressOnly, networkingv1.NetworkPolicyIngressRule{From: []networkingv1.NetworkPolicyPeer{ipPeer("0.0.0.0/0")}}))
	for _, o := range objs {
		if c, ok := o.(*admissionregistrationv1.MutatingWebhookConfiguration); ok {
			ig := admissionregistrationv1.Ignore
			c.Webhooks[0].FailurePolicy = &ig
		}
	}
	fs := diagnose(t, fake.NewClientset(objs...)).Webhook("kueue-mutating-webhook-configuration", "mjob.kb.io").ByID(IDNetworkPolicyBlocks)
	if len(fs) != 1 || fs[0].Severity != SeverityWarning || !strings.Contains(fs[0].Fix, `"cidr":"fd00::10/128"`) || !strings.Contains(fs[0].Why, "failurePolicy is Ignore") {
		t.Errorf("IPv6, Ignore: %+v", fs)
	}
	if fs := kd107(t, apiServerSlice("fd00::10"), netpol("v6", nil, ingressOnly, networkingv1.NetworkPolicyIngressRule{From: []networkingv1.NetworkPolicyPeer{ipPeer("fd00::/64")}})); len(fs) != 0 {
		t.Errorf("IPv6 admitted: %+v", fs)
	}
}

// Policies that cannot be listed: a gap for the namespace, no KD107.
func TestNetworkPolicyForbidden(t *testing.T) {
	cs := fake.NewClientset(kueueWebhook(apiServerSlice("10.0.0.10"), netpol("default-deny", nil, ingressOnly))...)
	forbid(cs, "list", "networking.k8s.io", "networkpolicies")
	w := diagnose(t, cs).Webhook("kueue-mutating-webhook-configuration", "mjob.kb.io")
	if w.Has(IDNetworkPolicyBlocks) {
		t.Errorf("KD107 without the policies: %+v", w.ByID(IDNetworkPolicyBlocks))
	}
	found := false
	for _, f := range w.ByID(IDAccessGap) {
		if strings.Contains(f.What, "networkpolicies.networking.k8s.io in namespace lws-system") && strings.Contains(f.Why, IDNetworkPolicyBlocks) {
			found = true
		}
	}
	if !found {
		t.Errorf("no KD001 for NetworkPolicies: %+v", w.ByID(IDAccessGap))
	}
}

// APIServerAddressesFrom: deduplicated, sorted, bounded.
func TestAPIServerAddressesFrom(t *testing.T) {
	a, ok := APIServerAddressesFrom([]discoveryv1.EndpointSlice{*apiServerSlice("10.0.0.12", "10.0.0.10"), *apiServerSlice("10.0.0.10")})
	if !ok || strings.Join(a, ",") != "10.0.0.10,10.0.0.12" {
		t.Errorf("got %v %v", a, ok)
	}
	if a, ok := APIServerAddressesFrom(nil); ok || a != nil {
		t.Errorf("none: %v %v", a, ok)
	}
	var many []string
	for i := 0; i <= MaxAPIServerAddresses; i++ {
		many = append(many, "10.1."+strconv.Itoa(i/256)+"."+strconv.Itoa(i%256))
	}
	if a, ok := APIServerAddressesFrom([]discoveryv1.EndpointSlice{*apiServerSlice(many...)}); ok || a != nil {
		t.Errorf("beyond the bound: %d addresses, known %v", len(a), ok)
	}
	if a, ok := APIServerAddressesFrom([]discoveryv1.EndpointSlice{*apiServerSlice(many[:MaxAPIServerAddresses]...)}); !ok || len(a) != MaxAPIServerAddresses {
		t.Errorf("at the bound: %d addresses, known %v", len(a), ok)
	}
}
