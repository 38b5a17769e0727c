package watch

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/version"
	fakediscovery "k8s.io/client-go/discovery/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"

	"github.com/kadmit/kadmit/internal/doctor"
	"github.com/kadmit/kadmit/internal/testkit"
)

func netpol(ns, name string, port int32) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
		Annotations: map[string]string{"kubectl.kubernetes.io/last-applied-configuration": strings.Repeat("x", 4<<10)}},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "svc-n"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Port: ptr(intstr.FromInt32(port))}},
				From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/8"}}}}}}}
}

// apiServerSlice is the default/kubernetes Service's EndpointSlice the API
// servers publish their addresses in.
func apiServerSlice(addrs ...string) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes", Namespace: metav1.NamespaceDefault,
		Labels: map[string]string{discoveryv1.LabelServiceName: "kubernetes"}}, AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{{Name: ptr("https"), Port: ptr(int32(6443))}}}
	for _, a := range addrs {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{a}})
	}
	return s
}

// What KD107 reads reaches the snapshot: the NetworkPolicies of the
// webhook Service's namespace (not those of other namespaces; pruned to
// their spec), and the API server's addresses from the default/kubernetes
// EndpointSlices; a new policy reaches it through the informer.
func TestNetworkPoliciesAndAPIServerAddressesReachTheSnapshot(t *testing.T) {
	r := startController(t, nil, testService("svc-n", 9443), slice("svc-n", 9443), validatingConfig("cfg-n", "svc-n", true, nil, "n.example.com"),
		netpol(testNS, "deny-but-10", 9443), netpol("elsewhere", "other", 9443), apiServerSlice("192.0.2.20", "192.0.2.10", "192.0.2.20"))
	testkit.Eventually(t, 10*time.Second, "first evaluation", r.c.Ready)
	s := r.c.lastSnap.Load()
	b := s.Backends[testNS+"/svc-n"]
	if b == nil || b.NetworkPoliciesUnknown || len(b.NetworkPolicies) != 1 {
		t.Fatalf("backend's NetworkPolicies: %+v", b)
	}
	np := b.NetworkPolicies[0]
	if np.Name != "deny-but-10" || np.Annotations != nil || len(np.Spec.Ingress) != 1 || np.Spec.PodSelector.MatchLabels["app"] != "svc-n" {
		t.Errorf("policy as cached: %+v", np)
	}
	if !s.APIServerAddressesKnown || strings.Join(s.APIServerAddresses, ",") != "192.0.2.10,192.0.2.20" {
		t.Errorf("API server addresses %v (known %v)", s.APIServerAddresses, s.APIServerAddressesKnown)
	}
	if _, err := r.cs.NetworkingV1().NetworkPolicies(testNS).Create(context.Background(), netpol(testNS, "another", 443), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, "the new policy in the snapshot", func() bool {
		b := r.c.lastSnap.Load().Backends[testNS+"/svc-n"]
		return b != nil && len(b.NetworkPolicies) == 2 && b.NetworkPolicies[0].Name == "another"
	})
}

// A watch that may not list NetworkPolicies runs without that informer:
// the backend says its policies are unknown and the webhook's findings
// say what could not be read (KD001), as for the other resources.
func TestNetworkPoliciesUnreadable(t *testing.T) {
	r := startControllerDenying(t, map[string]bool{"networkpolicies": true}, nil,
		testService("svc-n", 9443), slice("svc-n", 9443), validatingConfig("cfg-n", "svc-n", true, nil, "n.example.com"))
	testkit.Eventually(t, 10*time.Second, "first evaluation", r.c.Ready)
	b := r.c.lastSnap.Load().Backends[testNS+"/svc-n"]
	if b == nil || !b.NetworkPoliciesUnknown || b.NetworkPolicies != nil {
		t.Fatalf("backend: %+v", b)
	}
	found := false
	for _, f := range r.states()["cfg-n/n.example.com"].findings {
		found = found || f.ID == doctor.IDAccessGap && strings.Contains(f.What, "networkpolicies")
	}
	if !found {
		t.Errorf("no KD001 about networkpolicies among %v", r.states()["cfg-n/n.example.com"].findings)
	}
	// The API server's addresses are read (EndpointSlices are readable).
	if s := r.c.lastSnap.Load(); s.APIServerAddressesKnown {
		t.Errorf("no default/kubernetes EndpointSlice, yet addresses known: %v", s.APIServerAddresses)
	}
}

// KD506's input: the CNI's DaemonSet and CoreDNS, in namespaces no webhook
// Service is in (so their workloads are pruned to labels and owners plus
// what doctor.DependenciesFrom reads), reach Snapshot.Dependencies; their
// containers are not kept.
func TestDependenciesReachTheSnapshot(t *testing.T) {
	big := corev1.Container{Name: "c", Image: "i", Env: []corev1.EnvVar{{Name: "BIG", Value: strings.Repeat("e", 32<<10)}}}
	cni := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "calico-node", Namespace: "calico-system"},
		Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"k8s-app": "calico-node"}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"k8s-app": "calico-node"}},
				Spec: corev1.PodSpec{HostNetwork: true, Containers: []corev1.Container{big}, Volumes: []corev1.Volume{
					{Name: "lib", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "x"}}}},
					{Name: "cni-net-dir", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/etc/cni/net.d"}}}}}}}}
	dns := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "coredns", Namespace: "kube-system"},
		Spec: appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"k8s-app": "kube-dns"}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"k8s-app": "kube-dns"}}, Spec: corev1.PodSpec{Containers: []corev1.Container{big}}}}}
	r := startController(t, nil, testService("svc-d", 9443), slice("svc-d", 9443), validatingConfig("cfg-d", "svc-d", true, nil, "d.example.com"), cni, dns)
	testkit.Eventually(t, 10*time.Second, "first evaluation", r.c.Ready)
	s := r.c.lastSnap.Load()
	if !s.DependenciesKnown {
		t.Fatal("dependencies unknown")
	}
	var got []string
	for _, d := range s.Dependencies {
		got = append(got, d.Role+" "+d.Namespace+"/"+d.Workload.String())
	}
	if want := []string{"cni calico-system/" + (doctor.WorkloadRef{Kind: "DaemonSet", Name: "calico-node"}).String(),
		"dns kube-system/" + (doctor.WorkloadRef{Kind: "Deployment", Name: "coredns"}).String()}; strings.Join(got, ";") != strings.Join(want, ";") {
		t.Errorf("dependencies %q, want %q", got, want)
	}
	wl := r.c.cl.wl.Load()
	d, err := wl.daemonSets.DaemonSets("calico-system").Get("calico-node")
	if err != nil {
		t.Fatal(err)
	}
	if d.Spec.Template.Spec.Containers != nil || len(d.Spec.Template.Spec.Volumes) != 2 || d.Spec.Template.Spec.Volumes[0].ConfigMap != nil {
		t.Errorf("a DaemonSet outside the webhook namespaces keeps more than DependenciesFrom reads: %+v", d.Spec.Template.Spec)
	}
}

// The version-aware checks' input: the API server's version is read before
// the first evaluation and read again every versionEvery (an upgrade).
func TestServerVersionReadAndRefreshed(t *testing.T) {
	var gitVersion atomic.Value
	gitVersion.Store("v1.36.2")
	cs := fake.NewClientset(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNS}})
	cs.PrependReactor("create", "selfsubjectaccessreviews", denyReview(nil))
	fd := cs.Discovery().(*fakediscovery.FakeDiscovery)
	// FakeDiscovery answers FakedServerVersion after its reactors ran, in
	// the reading goroutine: set it there, from what the test stores.
	cs.PrependReactor("get", "version", func(k8stesting.Action) (bool, runtime.Object, error) {
		v := gitVersion.Load().(string)
		fd.FakedServerVersion = &version.Info{GitVersion: v, Major: "1", Minor: strings.Split(v, ".")[1]}
		return true, nil, nil
	})
	c, err := New(Options{Client: cs, HandshakeInterval: time.Second, Debounce: 20 * time.Millisecond, Dial: loopbackDial}, record.NewFakeRecorder(100))
	if err != nil {
		t.Fatal(err)
	}
	c.versionEvery = 50 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, "") }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	testkit.Eventually(t, 10*time.Second, "first evaluation", c.Ready)
	if v := c.lastSnap.Load().ServerVersion; v == nil || v.GitVersion != "v1.36.2" {
		t.Fatalf("first snapshot's version %+v", v)
	}
	gitVersion.Store("v1.37.1")
	testkit.Eventually(t, 5*time.Second, "the upgrade in the snapshot", func() bool {
		v := c.lastSnap.Load().ServerVersion
		return v != nil && v.GitVersion == "v1.37.1"
	})
	// Run returning (deferred above) waits for versionLoop: it ends with
	// the context.
}

// denyReview answers SelfSubjectAccessReviews: allowed unless deny names
// the resource.
func denyReview(deny map[string]bool) k8stesting.ReactionFunc {
	return func(a k8stesting.Action) (bool, runtime.Object, error) {
		rev := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SelfSubjectAccessReview).DeepCopy()
		rev.Status.Allowed = !deny[rev.Spec.ResourceAttributes.Resource]
		return true, rev, nil
	}
}

// KD107 through the watch, both ways: a default-deny NetworkPolicy on the
// webhook's pod is found when the API server calls from another node, and
// not when the pod runs on the API server's own node (traffic from a pod's
// node is never isolated): the pod cache keeps status.hostIP(s) for that,
// else the watch would report what doctor does not.
func TestNetworkPolicyNodeAddressKept(t *testing.T) {
	for _, tc := range []struct {
		hostIP string
		want   bool
	}{{"192.0.2.10", false}, {"198.51.100.7", true}} {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "svc-n-0", Namespace: testNS, Labels: map[string]string{"app": "svc-n"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "i", Ports: []corev1.ContainerPort{{Name: "https", ContainerPort: 9443}}}}},
			Status: corev1.PodStatus{HostIP: tc.hostIP, HostIPs: []corev1.HostIP{{IP: tc.hostIP}}, PodIP: "10.1.0.5",
				Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, Message: strings.Repeat("m", 1<<10)}}}}
		deny := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default-deny", Namespace: testNS},
			Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}
		sl := slice("svc-n", 9443, "10.1.0.5")
		sl.Endpoints[0].TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: testNS, Name: "svc-n-0"}
		r := startController(t, nil, testService("svc-n", 9443), sl, pod, deny, apiServerSlice("192.0.2.10"),
			validatingConfig("cfg-n", "svc-n", true, nil, "n.example.com"))
		testkit.Eventually(t, 10*time.Second, "first evaluation", r.c.Ready)
		p, err := r.c.cl.wl.Load().pods.Pods(testNS).Get("svc-n-0")
		if err != nil {
			t.Fatal(err)
		}
		if p.Status.HostIP != tc.hostIP || len(p.Status.HostIPs) != 1 || p.Status.PodIP != "" || p.Status.Conditions != nil {
			t.Errorf("pod status as cached: %+v", p.Status)
		}
		kd107 := func() bool {
			for _, f := range r.states()["cfg-n/n.example.com"].findings {
				if f.ID == doctor.IDNetworkPolicyBlocks {
					return true
				}
			}
			return false
		}
		// A warning or error is confirmed by a later evaluation: wait for
		// it, or past several debounces for its absence.
		deadline := time.Now().Add(2 * time.Second)
		for !kd107() && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if got := kd107(); got != tc.want {
			t.Errorf("pod on node %s, API server 192.0.2.10: KD107 %v, want %v (findings %v)", tc.hostIP, got, tc.want, alarms(r.states()["cfg-n/n.example.com"]))
		}
	}
}
