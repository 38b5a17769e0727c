package doctor

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
)

func pdb(name string, sel map[string]string) *policyv1.PodDisruptionBudget {
	one := intstr.FromInt32(1)
	return &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: lwsNS},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: &one, Selector: &metav1.LabelSelector{MatchLabels: sel}}}
}

// Seed 001 on a real cluster: the LWS Service's selector also covers
// Kueue's pods (KD301). KD605's budget must use the selector KD301's fix
// gives the Service, and a budget the Kueue pods can satisfy does not
// protect the LWS pods.
func TestPDBFollowsSelectorCollision(t *testing.T) {
	lws := map[string]string{"control-plane": "controller-manager", "app.kubernetes.io/name": "lws"}
	lwsPod := rsPod("lws-controller-manager", "5b8c9d7f6", lws, "10.0.0.5")
	kueuePod := rsPod("kueue-controller-manager", "7d9f6c4b8", kueueLabels(), "10.0.0.7")
	broad := map[string]string{"control-plane": "controller-manager"}
	objs := func(extra ...runtime.Object) []runtime.Object {
		return append([]runtime.Object{
			&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: lwsNS}},
			deployment("lws-controller-manager", lws), deployment("kueue-controller-manager", kueueLabels()), lwsPod, kueuePod,
			replicaSet("lws-controller-manager", "5b8c9d7f6", lws), replicaSet("kueue-controller-manager", "7d9f6c4b8", kueueLabels()),
			svc("lws-webhook-service", broad), slice("lws-webhook-service", lwsPod, kueuePod),
			mutatingConfig("lws-mutating-webhook-configuration", "mleaderworkerset.kb.io", "lws-webhook-service"),
		}, extra...)
	}
	const want = "kubectl -n lws-system create poddisruptionbudget lws-webhook-service --selector=app.kubernetes.io/name=lws,control-plane=controller-manager --min-available=1"
	for _, c := range []struct {
		name  string
		pdbs  []runtime.Object
		kd605 bool
	}{
		{"no budget", nil, true},
		{"budget on Kueue's pods only", []runtime.Object{pdb("kueue", kueueLabels())}, true},
		{"budget on the colliding selector", []runtime.Object{pdb("broad", broad)}, true},
		{"budget on the narrowed selector", []runtime.Object{pdb("lws", map[string]string{"app.kubernetes.io/name": "lws"})}, false},
	} {
		w := diagnose(t, fake.NewClientset(objs(c.pdbs...)...)).Webhook("lws-mutating-webhook-configuration", "mleaderworkerset.kb.io")
		if w == nil || !w.Has(IDSelectorCollision) {
			t.Fatalf("%s: want KD301: %+v", c.name, w)
		}
		kd301 := w.ByID(IDSelectorCollision)[0]
		if !strings.Contains(kd301.Fix, `{"spec":{"selector":{"app.kubernetes.io/name":"lws"}}}`) {
			t.Fatalf("%s: KD301 fix %q; the test expects the lws label", c.name, kd301.Fix)
		}
		if w.Has(IDNoPodDisruptionBudget) != c.kd605 {
			t.Errorf("%s: KD605 present %v, want %v: %+v", c.name, w.Has(IDNoPodDisruptionBudget), c.kd605, w.ByID(IDNoPodDisruptionBudget))
			continue
		}
		if !c.kd605 {
			continue
		}
		f := w.ByID(IDNoPodDisruptionBudget)[0]
		if !strings.HasPrefix(f.Fix, want) || !strings.Contains(f.Why, "KD301") {
			t.Errorf("%s: KD605 why %q\nfix %q\nwant the fix to start with %q", c.name, f.Why, f.Fix, want)
		}
	}

	// Without a collision the budget is on the Service's selector, as before.
	w := diagnose(t, fake.NewClientset(
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: lwsNS}},
		deployment("lws-controller-manager", lws), lwsPod, replicaSet("lws-controller-manager", "5b8c9d7f6", lws),
		svc("lws-webhook-service", broad), slice("lws-webhook-service", lwsPod),
		mutatingConfig("lws-mutating-webhook-configuration", "mleaderworkerset.kb.io", "lws-webhook-service"),
	)).Webhook("lws-mutating-webhook-configuration", "mleaderworkerset.kb.io")
	if fs := w.ByID(IDNoPodDisruptionBudget); len(fs) != 1 || fs[0].Fix != "kubectl -n lws-system create poddisruptionbudget lws-webhook-service --selector=control-plane=controller-manager --min-available=1" {
		t.Errorf("one workload: KD605 %+v", fs)
	}
}

// A collision without a label only the webhook's pods carry: KD605 says
// to fix KD301 first rather than suggest a budget on the shared selector.
func TestPDBFixKD301First(t *testing.T) {
	c := &Collision{Groups: []WorkloadGroup{{Workload: WorkloadRef{"Deployment", "a"}}, {Workload: WorkloadRef{"Deployment", "b"}}}, Proven: true}
	b := &Backend{Namespace: "ns", Name: "svc", Service: &corev1.Service{Spec: corev1.ServiceSpec{Selector: map[string]string{"x": "y"}}}}
	_, fix := pdbFix(b, c, "")
	if !strings.HasPrefix(fix, "Fix KD301 first") || strings.Contains(fix, "--selector=x=y") {
		t.Errorf("fix %q", fix)
	}
	c.LabelKey, c.LabelValue = "app", "a"
	if _, fix = pdbFix(b, c, ""); fix != "Fix KD301 first; if Deployment/a is the webhook's workload: kubectl -n ns create poddisruptionbudget svc --selector=app=a,x=y --min-available=1" {
		t.Errorf("not intended: fix %q", fix)
	}
}
