package doctor

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kadmit/kadmit/pkg/webhookcerts"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// cluster objects for the LeaderWorkerSet/Kueue namespace of issue 15.
const lwsNS = "lws-system"

func ctrl(kind, name string) []metav1.OwnerReference {
	yes := true
	return []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: kind, Name: name, UID: types.UID("uid-" + name), Controller: &yes}}
}

func deployment(name string, lbls map[string]string) *appsv1.Deployment {
	return &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: lwsNS, Labels: lbls},
		Spec: appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: lbls},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: lbls}, Spec: podSpec()}}}
}

func podSpec() corev1.PodSpec {
	return corev1.PodSpec{Containers: []corev1.Container{{Name: "manager", Image: "x", Ports: []corev1.ContainerPort{{Name: "https", ContainerPort: 9443}}}}}
}

func replicaSet(deploy, hash string, lbls map[string]string) *appsv1.ReplicaSet {
	l := withHash(lbls, hash)
	return &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: deploy + "-" + hash, Namespace: lwsNS, Labels: l, OwnerReferences: ctrl("Deployment", deploy)},
		Spec: appsv1.ReplicaSetSpec{Selector: &metav1.LabelSelector{MatchLabels: l}, Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: l}, Spec: podSpec()}}}
}

func withHash(lbls map[string]string, hash string) map[string]string {
	l := map[string]string{appsv1.DefaultDeploymentUniqueLabelKey: hash}
	for k, v := range lbls {
		l[k] = v
	}
	return l
}

func rsPod(deploy, hash string, lbls map[string]string, ip string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: deploy + "-" + hash + "-x1", Namespace: lwsNS, Labels: withHash(lbls, hash),
		OwnerReferences: ctrl("ReplicaSet", deploy+"-"+hash)}, Spec: podSpec(), Status: corev1.PodStatus{PodIP: ip}}
}

func svc(name string, sel map[string]string) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: lwsNS}, Spec: corev1.ServiceSpec{Selector: sel,
		Ports: []corev1.ServicePort{{Name: "https", Port: 443, TargetPort: intstr.FromInt32(9443)}}}}
}

func slice(service string, pods ...*corev1.Pod) *discoveryv1.EndpointSlice {
	ready := true
	s := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: service + "-1", Namespace: lwsNS, Labels: map[string]string{discoveryv1.LabelServiceName: service}},
		AddressType: discoveryv1.AddressTypeIPv4, Ports: []discoveryv1.EndpointPort{{Name: ptrTo("https"), Port: ptrTo(int32(9443))}}}
	for _, p := range pods {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{p.Status.PodIP}, Conditions: discoveryv1.EndpointConditions{Ready: &ready},
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: lwsNS, Name: p.Name}})
	}
	return s
}

// testBundle is a valid CA, so that no caBundle finding mixes in.
var testBundle = func() []byte {
	ca, _, err := webhookcerts.NewCA(time.Now(), 24*time.Hour, webhookcerts.ECDSAP256)
	if err != nil {
		panic(err)
	}
	return webhookcerts.EncodeCertificates(ca)
}()

func ptrTo[T any](v T) *T { return &v }

func mutatingConfig(name, hook, service string, conds ...admissionregistrationv1.MatchCondition) *admissionregistrationv1.MutatingWebhookConfiguration {
	fail, none := admissionregistrationv1.Fail, admissionregistrationv1.SideEffectClassNone
	return &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: name}, Webhooks: []admissionregistrationv1.MutatingWebhook{{
		Name: hook, ClientConfig: admissionregistrationv1.WebhookClientConfig{CABundle: testBundle, Service: &admissionregistrationv1.ServiceReference{Namespace: lwsNS, Name: service, Path: ptrTo("/mutate"), Port: ptrTo(int32(443))}},
		Rules: []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{"CREATE"},
			Rule: admissionregistrationv1.Rule{APIGroups: []string{"batch"}, APIVersions: []string{"v1"}, Resources: []string{"jobs"}}}},
		FailurePolicy: &fail, SideEffects: &none, AdmissionReviewVersions: []string{"v1"}, MatchConditions: conds,
		NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpNotIn, Values: []string{lwsNS, "kube-system"}}}},
	}}}
}

// forbid makes the fake API server refuse verb on resource, as RBAC does.
func forbid(cs *fake.Clientset, verb, group, resource string) {
	cs.PrependReactor(verb, resource, func(a k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: group, Resource: resource}, "", errForbidden)
	})
}

var errForbidden = apierrors.NewBadRequest(`User "system:serviceaccount:doctor:reader" cannot list resource`)

func diagnose(t *testing.T, cs *fake.Clientset) *Report {
	t.Helper()
	ctx := context.Background()
	snap, err := LoadSnapshot(ctx, cs)
	if err != nil {
		t.Fatalf("LoadSnapshot: %v", err)
	}
	rep, err := Diagnose(ctx, cs, snap, Options{Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
		return nil, ErrDialNotAllowed
	}})
	if err != nil {
		t.Fatalf("Diagnose: %v", err)
	}
	return rep
}

func kueueLabels() map[string]string {
	return map[string]string{"control-plane": "controller-manager", "app.kubernetes.io/name": "kueue"}
}

// The bug of issue 15: the healthy mjob.kb.io webhook's Service selects one
// Deployment's pods, but the ReplicaSet between them is absent or
// forbidden: no KD301 at all.
func TestCollisionOneDeploymentReplicaSetsUnreadable(t *testing.T) {
	for _, mode := range []string{"absent", "forbidden"} {
		t.Run(mode, func(t *testing.T) {
			pod := rsPod("kueue-controller-manager", "7d9f6c4b8", kueueLabels(), "10.0.0.7")
			objs := []runtime.Object{
				&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: lwsNS}},
				deployment("kueue-controller-manager", kueueLabels()), pod,
				svc("kueue-webhook-service", kueueLabels()), slice("kueue-webhook-service", pod),
				mutatingConfig("kueue-mutating-webhook-configuration", "mjob.kb.io", "kueue-webhook-service"),
			}
			if mode == "forbidden" {
				objs = append(objs, replicaSet("kueue-controller-manager", "7d9f6c4b8", kueueLabels()))
			}
			cs := fake.NewClientset(objs...)
			if mode == "forbidden" {
				forbid(cs, "list", "apps", "replicasets")
			}
			rep := diagnose(t, cs)
			w := rep.Webhook("kueue-mutating-webhook-configuration", "mjob.kb.io")
			if w.Has(IDSelectorCollision) {
				t.Fatalf("KD301 for one Deployment: %+v", w.ByID(IDSelectorCollision))
			}
			if w.Count(SeverityError) != 0 {
				t.Errorf("errors on a healthy webhook: %+v", w.Findings)
			}
			gaps := w.ByID(IDAccessGap)
			if mode == "forbidden" {
				if len(gaps) != 1 || !strings.Contains(gaps[0].What, "list replicasets.apps in namespace lws-system") || !strings.Contains(gaps[0].Why, "pod-template-hash") {
					t.Errorf("want one KD001 naming list replicasets.apps and the inference; got %+v", gaps)
				}
			} else if len(gaps) != 0 {
				t.Errorf("absent ReplicaSets are no access gap: %+v", gaps)
			}
		})
	}
}

// The real collision is still found without ReplicaSets: each pod's
// Deployment is inferred and confirmed by the Deployment's selector.
func TestCollisionTwoDeploymentsReplicaSetsForbidden(t *testing.T) {
	lws := map[string]string{"control-plane": "controller-manager", "app.kubernetes.io/name": "lws"}
	lwsPod := rsPod("lws-controller-manager", "5b8c9d7f6", lws, "10.0.0.5")
	kueuePod := rsPod("kueue-controller-manager", "7d9f6c4b8", kueueLabels(), "10.0.0.7")
	base := []runtime.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: lwsNS}},
		deployment("lws-controller-manager", lws), deployment("kueue-controller-manager", kueueLabels()), lwsPod, kueuePod,
		svc("lws-webhook-service", map[string]string{"control-plane": "controller-manager"}), slice("lws-webhook-service", lwsPod, kueuePod),
		mutatingConfig("lws-mutating-webhook-configuration", "mleaderworkerset.kb.io", "lws-webhook-service"),
	}
	t.Run("deployments readable: error", func(t *testing.T) {
		cs := fake.NewClientset(base...)
		forbid(cs, "list", "apps", "replicasets")
		w := diagnose(t, cs).Webhook("lws-mutating-webhook-configuration", "mleaderworkerset.kb.io")
		f := w.ByID(IDSelectorCollision)
		if len(f) != 1 || f[0].Severity != SeverityError {
			t.Fatalf("want one KD301 error; got %+v", w.Findings)
		}
		for _, s := range []string{"Deployment/lws-controller-manager", "Deployment/kueue-controller-manager", "app.kubernetes.io/name"} {
			if !strings.Contains(f[0].What+f[0].Fix, s) {
				t.Errorf("KD301 lacks %q: %+v", s, f[0])
			}
		}
	})
	t.Run("deployments forbidden too: warning", func(t *testing.T) {
		cs := fake.NewClientset(base...)
		forbid(cs, "list", "apps", "replicasets")
		forbid(cs, "list", "apps", "deployments")
		w := diagnose(t, cs).Webhook("lws-mutating-webhook-configuration", "mleaderworkerset.kb.io")
		f := w.ByID(IDSelectorCollision)
		if len(f) != 1 || f[0].Severity != SeverityWarning || !strings.Contains(f[0].What, "cannot tell for sure") {
			t.Fatalf("want one KD301 warning that says it cannot tell; got %+v", w.Findings)
		}
		if w.Count(SeverityError) != 0 {
			t.Errorf("error-severity finding resting on unread objects: %+v", w.Findings)
		}
		// Deployments are listed cluster-wide (dependency workloads, KD506)
		// and in the Service's namespace: two gaps.
		if len(w.ByID(IDAccessGap)) != 3 {
			t.Errorf("want KD001 for replicasets, and deployments cluster-wide and in the namespace; got %+v", w.ByID(IDAccessGap))
		}
	})
}

// Every refused read is a gap, never a doctor failure, and no check that
// needed it raises an error or warning.
func TestEveryReadForbidden(t *testing.T) {
	pod := rsPod("kueue-controller-manager", "7d9f6c4b8", kueueLabels(), "10.0.0.7")
	objs := []runtime.Object{&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: lwsNS}}, deployment("kueue-controller-manager", kueueLabels()), pod,
		svc("kueue-webhook-service", kueueLabels()), slice("kueue-webhook-service", pod),
		mutatingConfig("kueue-mutating-webhook-configuration", "mjob.kb.io", "kueue-webhook-service")}
	// Namespaces and Services are read by name only when they cannot be
	// listed (listed, doctor knows them without a get): those two cases
	// refuse the list too, which for namespaces is a gap of its own.
	cases := []struct {
		verb, group, resource string
		lost                  []string // IDs whose findings must not appear
		alsoListRefused       bool
		// extraGaps counts the other reads of that resource: DaemonSets
		// and Deployments are also listed cluster-wide (KD506's dependency
		// workloads), EndpointSlices also in default (the API server's
		// addresses, KD107).
		extraGaps int
	}{
		{"list", "", "namespaces", nil, false, 0},
		{"get", "", "namespaces", []string{IDOrphan}, true, 0},
		{"get", "", "services", []string{IDServiceMissing, IDNoReadyEndpoints}, true, 0},
		{"list", "discovery.k8s.io", "endpointslices", []string{IDNoReadyEndpoints, IDNetworkPolicyBlocks}, false, 1},
		{"list", "", "pods", []string{IDSelectorCollision}, false, 0},
		{"list", "apps", "statefulsets", nil, false, 0},
		{"list", "apps", "daemonsets", []string{IDDependencyDeadlock}, false, 1},
		{"list", "apps", "deployments", []string{IDDependencyDeadlock}, false, 1},
		{"list", "networking.k8s.io", "networkpolicies", []string{IDNetworkPolicyBlocks}, false, 0},
		{"list", "policy", "poddisruptionbudgets", []string{IDNoPodDisruptionBudget}, false, 0},
	}
	for _, c := range cases {
		t.Run(c.verb+" "+c.resource, func(t *testing.T) {
			cs := fake.NewClientset(objs...)
			forbid(cs, c.verb, c.group, c.resource)
			wantGaps := 1 + c.extraGaps
			if c.alsoListRefused {
				forbid(cs, "list", c.group, c.resource)
				if c.resource == "namespaces" {
					wantGaps = 2
				}
			}
			rep := diagnose(t, cs)
			w := rep.Webhook("kueue-mutating-webhook-configuration", "mjob.kb.io")
			gaps := w.ByID(IDAccessGap)
			res := c.resource
			if c.group != "" {
				res += "." + c.group
			}
			if len(gaps) != wantGaps || !strings.HasPrefix(gaps[len(gaps)-1].What, "Doctor could not "+c.verb+" "+res) || gaps[0].Severity != SeverityInfo || gaps[0].Why == "" {
				t.Fatalf("want %d KD001 info, the last for %s %s; got %+v", wantGaps, c.verb, res, w.Findings)
			}
			gaps = gaps[len(gaps)-1:]
			if !strings.Contains(gaps[0].Fix, "kubectl auth can-i "+c.verb+" "+res) {
				t.Errorf("KD001 fix = %q", gaps[0].Fix)
			}
			for _, id := range c.lost {
				if w.Has(id) {
					t.Errorf("%s reported although its input could not be read: %+v", id, w.ByID(id))
				}
			}
			if len(rep.Gaps) != wantGaps {
				t.Errorf("report gaps = %+v", rep.Gaps)
			}
		})
	}
}

// A probe the authorizer refuses is a gap (KD001), not an inconclusive or
// failed probe.
func TestProbeForbidden(t *testing.T) {
	pod := rsPod("kueue-controller-manager", "7d9f6c4b8", kueueLabels(), "10.0.0.7")
	cs := fake.NewClientset(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: lwsNS}}, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "default"}},
		deployment("kueue-controller-manager", kueueLabels()), pod, svc("kueue-webhook-service", kueueLabels()), slice("kueue-webhook-service", pod),
		mutatingConfig("kueue-mutating-webhook-configuration", "mjob.kb.io", "kueue-webhook-service"))
	cs.PrependReactor("create", "jobs", func(a k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "batch", Resource: "jobs"}, "x",
			errors.New(`User "bob" cannot create resource "jobs" in API group "batch" in the namespace "default"`))
	})
	snap, err := LoadSnapshot(context.Background(), cs)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Diagnose(context.Background(), cs, snap, Options{Probe: true, ProbeCount: 3, Dial: func(context.Context, string, string) (net.Conn, error) { return nil, ErrDialNotAllowed }})
	if err != nil {
		t.Fatal(err)
	}
	w := rep.Webhook("kueue-mutating-webhook-configuration", "mjob.kb.io")
	gaps := w.ByID(IDAccessGap)
	if len(gaps) != 1 || !strings.Contains(gaps[0].What, "could not create jobs.batch in namespace default") || !strings.Contains(gaps[0].Why, "no probe was made") {
		t.Fatalf("want KD001 for the refused probe; got %+v", w.Findings)
	}
	for _, f := range w.Findings {
		if strings.HasPrefix(f.ID, "KD7") {
			t.Errorf("probe finding despite the refusal: %+v", f)
		}
	}
}

// A controller that keeps objects from informers builds the Snapshot
// itself: fill a Backend's objects and access flags, Resolve, Diagnose.
func TestSnapshotBuiltByHand(t *testing.T) {
	pod := rsPod("kueue-controller-manager", "7d9f6c4b8", kueueLabels(), "10.0.0.7")
	d := deployment("kueue-controller-manager", kueueLabels())
	b := &Backend{Namespace: lwsNS, Name: "kueue-webhook-service", NamespaceExists: true, NamespaceLabelsKnown: true,
		Service: svc("kueue-webhook-service", kueueLabels()), Slices: []discoveryv1.EndpointSlice{*slice("kueue-webhook-service", pod)},
		Pods: []*corev1.Pod{pod}, Deployments: map[string]*appsv1.Deployment{d.Name: d}, ReplicaSetsUnknown: true,
		Gaps: []AccessGap{{Verb: "list", Resource: "replicasets.apps", Namespace: lwsNS, Reason: "forbidden", Lost: "owners"}}}
	b.Resolve()
	if b.Workload[pod.Name] != (WorkloadRef{Kind: "Deployment", Name: d.Name}) || !b.Inferred[pod.Name].Confirmed || len(b.Templates) != 0 {
		t.Fatalf("Resolve: workload %v, inferred %+v, templates %d", b.Workload[pod.Name], b.Inferred[pod.Name], len(b.Templates))
	}
	snap := &Snapshot{Webhooks: FromMutating(mutatingConfig("kueue-mutating-webhook-configuration", "mjob.kb.io", "kueue-webhook-service")),
		Namespaces: map[string]map[string]string{lwsNS: nil}, NamespacesKnown: true, Backends: map[string]*Backend{lwsNS + "/kueue-webhook-service": b}}
	rep, err := Diagnose(context.Background(), nil, snap, Options{Dial: func(context.Context, string, string) (net.Conn, error) { return nil, ErrDialNotAllowed }})
	if err != nil {
		t.Fatal(err)
	}
	w := rep.Webhooks[0]
	if w.Has(IDSelectorCollision) || w.Count(SeverityError) != 0 || len(w.ByID(IDAccessGap)) != 1 {
		t.Errorf("findings: %+v", w.Findings)
	}
}
