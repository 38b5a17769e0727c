package watch

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kadmit/kadmit/internal/testkit"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/cache"
)

// TestTransformPodsAndWorkloads: a pod a webhook Service selects keeps
// what the checks read (labels, owner references, spec, node addresses);
// any other pod, in any namespace, becomes a stub of its name,
// namespace and resourceVersion; workloads in a namespace holding
// a webhook Service keep their selector and template, elsewhere only
// labels and owner references; never annotations, the rest of the status
// or managedFields.
func TestTransformPodsAndWorkloads(t *testing.T) {
	owner := []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "rs", UID: "u", Controller: new(true)}}
	meta := metav1.ObjectMeta{Name: "p", Namespace: "ns", ResourceVersion: "7", Labels: map[string]string{"app": "hook"}, OwnerReferences: owner,
		Annotations: map[string]string{"big": strings.Repeat("a", 200<<10)}, ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "m"}}}
	spec := corev1.PodSpec{ServiceAccountName: "sa", Containers: []corev1.Container{{Name: "c", Image: "i",
		Ports: []corev1.ContainerPort{{Name: "https", ContainerPort: 8443}}}}}
	pod := &corev1.Pod{ObjectMeta: meta, Spec: spec, Status: corev1.PodStatus{Phase: corev1.PodRunning, Message: strings.Repeat("m", 10<<10),
		HostIP: "192.0.2.1", HostIPs: []corev1.HostIP{{IP: "192.0.2.1"}}, ContainerStatuses: []corev1.ContainerStatus{{Name: "c", Image: "i"}}}}
	sel := podSelection{"ns": {labels.SelectorFromSet(labels.Set{"app": "hook"})}}
	p, ok := prunePod(pod.DeepCopy(), sel).(*corev1.Pod)
	if !ok {
		t.Fatalf("a selected pod became %T", prunePod(pod.DeepCopy(), sel))
	}
	if p.Name != "p" || p.Namespace != "ns" || p.ResourceVersion != "7" || p.Labels["app"] != "hook" || len(p.OwnerReferences) != 1 || p.OwnerReferences[0].Name != "rs" ||
		p.Spec.ServiceAccountName != "sa" || p.Spec.Containers[0].Ports[0].Name != "https" || p.Status.HostIP != "192.0.2.1" || len(p.Status.HostIPs) != 1 {
		t.Errorf("pod lost what the checks read: %+v", p)
	}
	if p.Annotations != nil || p.ManagedFields != nil || p.Status.Phase != "" || p.Status.Message != "" || p.Status.ContainerStatuses != nil {
		t.Errorf("pod keeps unread fields: %d annotations, status %q", len(p.Annotations), p.Status.Phase)
	}
	// Not selected: by labels, or by namespace (the same labels elsewhere).
	for _, o := range []*corev1.Pod{func() *corev1.Pod { q := pod.DeepCopy(); q.Labels = map[string]string{"app": "other"}; return q }(),
		func() *corev1.Pod { q := pod.DeepCopy(); q.Namespace = "elsewhere"; return q }()} {
		s, ok := prunePod(o, sel).(*metav1.PartialObjectMetadata)
		if !ok {
			t.Fatalf("pod %s/%s %v not selected became %T", o.Namespace, o.Name, o.Labels, prunePod(o, sel))
		}
		if s.Name != "p" || s.Namespace != o.Namespace || s.ResourceVersion != "7" || s.Labels != nil ||
			s.OwnerReferences != nil || s.Annotations != nil || s.ManagedFields != nil || s.UID != "" {
			t.Errorf("stub of %s/%s: %+v", o.Namespace, o.Name, s.ObjectMeta)
		}
		// Idempotent: a stub stays itself.
		if again := prunePod(s, sel); again != any(s) {
			t.Errorf("a stub pruned again became %T", again)
		}
	}

	tr := workloadTransform(sel, true)
	d := &appsv1.Deployment{ObjectMeta: meta, Spec: appsv1.DeploymentSpec{Replicas: new(int32(3)),
		Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "hook"}},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "hook"},
			Annotations: map[string]string{"big": strings.Repeat("t", 100<<10)}}, Spec: spec}},
		Status: appsv1.DeploymentStatus{Replicas: 3}}
	out, err := tr(d.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	w := out.(*appsv1.Deployment)
	if w.Labels["app"] != "hook" || len(w.OwnerReferences) != 1 || w.Spec.Selector == nil || w.Spec.Selector.MatchLabels["app"] != "hook" ||
		w.Spec.Template.Labels["app"] != "hook" || w.Spec.Template.Spec.Containers[0].Ports[0].ContainerPort != 8443 {
		t.Errorf("deployment lost what the checks read: %+v", w.Spec)
	}
	if w.Annotations != nil || w.Spec.Template.Annotations != nil || w.Spec.Replicas != nil || w.Status.Replicas != 0 || w.ManagedFields != nil {
		t.Errorf("deployment keeps unread fields")
	}
	// Not selected (another app, or the same labels in another
	// namespace): labels, owner references, selector and template labels.
	for _, o := range []*appsv1.Deployment{func() *appsv1.Deployment {
		x := d.DeepCopy()
		x.Spec.Selector.MatchLabels["app"], x.Spec.Template.Labels["app"] = "other", "other"
		return x
	}(), func() *appsv1.Deployment { x := d.DeepCopy(); x.Namespace = "elsewhere"; return x }()} {
		out, _ = tr(o)
		if w := out.(*appsv1.Deployment); w.Labels["app"] != "hook" || w.Spec.Selector == nil || w.Spec.Template.Labels["app"] != o.Spec.Template.Labels["app"] ||
			w.Spec.Template.Spec.Containers != nil || w.Spec.Template.Annotations != nil {
			t.Errorf("deployment %s/%s whose template no webhook Service selects: %+v", o.Namespace, o.Spec.Template.Labels["app"], w.Spec)
		}
	}
	// A Deployment whose template's labels no longer match (a rollout
	// changed them) while its selector still admits the Service's pods
	// keeps its template: the checks read it for the old pods.
	moved := d.DeepCopy()
	moved.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "web"}}
	moved.Spec.Template.Labels = map[string]string{"tier": "web"}
	if out, _ = tr(moved); out.(*appsv1.Deployment).Spec.Template.Spec.Containers == nil {
		t.Errorf("a deployment that may own selected pods lost its template")
	}

	// A ReplicaSet of a Deployment: no second copy of the template, unless
	// the Service selects by pod-template-hash, or Deployments are not read.
	rs := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "hook-5d8f", Namespace: "ns", OwnerReferences: []metav1.OwnerReference{
		{APIVersion: "apps/v1", Kind: "Deployment", Name: "hook", UID: "d", Controller: new(true)}}},
		Spec: appsv1.ReplicaSetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "hook", "pod-template-hash": "5d8f"}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "hook", "pod-template-hash": "5d8f"}}, Spec: spec}}}
	byHash := podSelection{"ns": {labels.SelectorFromSet(labels.Set{"pod-template-hash": "5d8f"})}}
	for _, c := range []struct {
		sel         podSelection
		deployments bool
		want        bool
	}{{sel, true, false}, {byHash, true, true}, {sel, false, true}, {podSelection{}, true, false}} {
		out, _ = workloadTransform(c.sel, c.deployments)(rs.DeepCopy())
		r := out.(*appsv1.ReplicaSet)
		if got := r.Spec.Template.Spec.Containers != nil; got != c.want || len(r.OwnerReferences) != 1 || r.Spec.Template.Labels["app"] != "hook" {
			t.Errorf("ReplicaSet under selection %v (Deployments read: %v): template kept %v, want %v; %+v", c.sel, c.deployments, got, c.want, r.ObjectMeta)
		}
	}
	// A DaemonSet no Service selects keeps what KD506 reads.
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "cni", Namespace: "kube-system"}, Spec: appsv1.DaemonSetSpec{
		Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"k8s-app": "cni"}},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"k8s-app": "cni"}}, Spec: corev1.PodSpec{
			HostNetwork: true, Containers: spec.Containers,
			Volumes: []corev1.Volume{{Name: "cni", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/etc/cni/net.d"}}}}}}}}
	out, _ = tr(ds)
	if x := out.(*appsv1.DaemonSet); !x.Spec.Template.Spec.HostNetwork || len(x.Spec.Template.Spec.Volumes) != 1 ||
		x.Spec.Template.Spec.Volumes[0].HostPath.Path != "/etc/cni/net.d" || x.Spec.Template.Spec.Containers != nil {
		t.Errorf("DaemonSet no webhook Service selects: %+v", x.Spec.Template.Spec)
	}
	// Other objects only lose managedFields.
	svc := &corev1.Service{ObjectMeta: *meta.DeepCopy()}
	out, _ = transform(svc)
	if s := out.(*corev1.Service); s.ManagedFields != nil || s.Annotations == nil {
		t.Errorf("service: managedFields %v, annotations %d", s.ManagedFields, len(s.Annotations))
	}
}

// TestPodCacheKeepsSelectedPods: pods a webhook Service selects are
// cached whole from the first sync, every other pod (same namespace or
// not) as a stub; workloads likewise with or without their template. A pod cached as a stub is read whole all the same when a
// webhook Service comes to select it (a configuration naming a Service in
// a new namespace) or an EndpointSlice names it: fetched (a List by
// selector until the selector is covered, one GET), kept while the stub is
// unchanged, not listed again (the workload informers are, and the
// Deployment the new Service selects gets its template); once the pod
// changes it is cached whole and the fetched copy is dropped.
func TestPodCacheKeepsSelectedPods(t *testing.T) {
	pod := func(ns, name, app string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": app}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "i", Env: []corev1.EnvVar{{Name: "BIG", Value: strings.Repeat("e", 64<<10)}}}}}}
	}
	// A hand-made EndpointSlice of the webhook's Service names a pod in
	// namespace "target".
	sl := slice("hook", 9443, "10.0.0.9")
	sl.Endpoints[0].TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: "target", Name: "p-target"}
	lateSvc := testService("hook", 9443)
	lateSvc.Namespace = "late"
	lateDeploy := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "hook", Namespace: "late"}, Spec: appsv1.DeploymentSpec{
		Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "hook"}},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "hook"}}, Spec: pod("", "", "").Spec}}}
	var r *running
	template := func() int {
		d, err := r.c.cl.wl.Load().deployments.Deployments("late").Get("hook")
		if err != nil {
			t.Fatalf("get Deployment late/hook: %v", err)
		}
		return len(d.Spec.Template.Spec.Containers)
	}
	r = startController(t, nil, validatingConfig("cfg", "hook", true, nil, "a.example.com"), testService("hook", 9443), lateSvc, sl,
		pod(testNS, "p-hooks", "hook"), pod(testNS, "other", "other"), pod("late", "p-late", "hook"), pod("late", "p-late-other", "other"),
		pod("target", "p-target", "hook"), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "late"}}, lateDeploy)
	testkit.Eventually(t, 5*time.Second, "the first evaluation", r.c.Ready)
	pc := r.c.cl.wl.Load().pc
	stored := func(ns, name string) string {
		o, ok, err := pc.informer.GetIndexer().GetByKey(ns + "/" + name)
		switch {
		case err != nil || !ok:
			return "absent"
		case fmt.Sprintf("%T", o) == "*v1.Pod":
			return "whole"
		case fmt.Sprintf("%T", o) == "*v1.PartialObjectMetadata":
			return "stub"
		}
		return fmt.Sprintf("%T", o)
	}
	for _, c := range []struct{ ns, name, want string }{
		{testNS, "p-hooks", "whole"}, {testNS, "other", "stub"}, {"late", "p-late", "stub"}, {"target", "p-target", "stub"},
	} {
		if got := stored(c.ns, c.name); got != c.want {
			t.Errorf("pod %s/%s cached %s, want %s", c.ns, c.name, got, c.want)
		}
	}
	containers := func(ns, name string) int {
		p, err := r.c.cl.wl.Load().pods.Pods(ns).Get(name)
		if err != nil {
			t.Fatalf("get %s/%s: %v", ns, name, err)
		}
		return len(p.Spec.Containers)
	}
	if n := template(); n != 0 {
		t.Errorf("Deployment late/hook, which no webhook Service selects yet, cached with %d template containers", n)
	}
	// The first evaluation read the EndpointSlice's pod: fetched by GET.
	if n := containers("target", "p-target"); n != 1 || pc.fetches.Load() != 1 {
		t.Fatalf("pod named by the EndpointSlice: %d containers after %d fetches, want 1 and 1", n, pc.fetches.Load())
	}

	late := validatingConfig("late-cfg", "hook", true, nil, "b.example.com")
	late.Webhooks[0].ClientConfig.Service.Namespace = "late"
	if _, err := r.cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(context.Background(), late, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "the late webhook's selector covered", func() bool {
		pc.mu.Lock()
		defer pc.mu.Unlock()
		return pc.covered["late\x00app=hook"]
	})
	if got := stored("late", "p-late"); got != "stub" {
		t.Fatalf("the late webhook's pod cached %s before it changed, want stub (fetched beside the informer)", got)
	}
	// The workload informers were listed again: the Deployment the new
	// webhook Service selects has its template.
	testkit.Eventually(t, 10*time.Second, "the late webhook's Deployment listed with its template", func() bool { return template() == 1 })
	if n := containers("late", "p-late"); n != 1 {
		t.Fatalf("the late webhook's pod: %d containers, want 1", n)
	}
	pods, err := r.c.cl.wl.Load().pods.Pods("late").List(labels.SelectorFromSet(labels.Set{"app": "hook"}))
	if err != nil || len(pods) != 1 || pods[0].Name != "p-late" || len(pods[0].Spec.Containers) != 1 {
		t.Fatalf("the late webhook's pods listed: %v, %v", pods, err)
	}
	// Covered: later evaluations (one a second here) read the fetched copy.
	fetches := pc.fetches.Load()
	time.Sleep(2500 * time.Millisecond)
	if n := pc.fetches.Load(); n != fetches {
		t.Errorf("%d fetches after more evaluations, want still %d", n, fetches)
	}

	// The pod changes: the informer caches it whole (the selection now
	// holds late's Service), and the fetched copy goes.
	p := pod("late", "p-late", "hook")
	p.Labels["v"] = "2"
	if _, err := r.cs.CoreV1().Pods("late").Update(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, "the changed pod cached whole and its fetched copy dropped", func() bool {
		pc.mu.Lock()
		_, kept := pc.fetched["late/p-late"]
		pc.mu.Unlock()
		return stored("late", "p-late") == "whole" && !kept
	})
	for _, k := range []string{testNS + "/other", "late/p-late-other"} {
		ns, name, _ := strings.Cut(k, "/")
		if got := stored(ns, name); got != "stub" {
			t.Errorf("pod %s, which no webhook Service selects, cached %s", k, got)
		}
	}
	// A webhook Service that goes leaves the selection: its selector is no
	// longer covered.
	if err := r.cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(context.Background(), "late-cfg", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "the late selector uncovered", func() bool {
		pc.mu.Lock()
		defer pc.mu.Unlock()
		return !pc.covered["late\x00app=hook"]
	})
}

// TestPodCacheFetchedBound: fetched pods are kept up to maxFetchedPods;
// past it they are returned but not kept.
func TestPodCacheFetchedBound(t *testing.T) {
	pc := &podCache{fetched: map[string]fetchedPod{}}
	for i := range maxFetchedPods + 10 {
		s := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprint(i), ResourceVersion: "1"}}
		if kept := pc.keep(s, &corev1.Pod{ObjectMeta: s.ObjectMeta}); kept != (i < maxFetchedPods) {
			t.Fatalf("pod %d kept %v", i, kept)
		}
	}
	if len(pc.fetched) != maxFetchedPods {
		t.Fatalf("%d fetched pods kept, want %d", len(pc.fetched), maxFetchedPods)
	}
	// A kept one is still replaced (newer stub).
	s := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "0", ResourceVersion: "2"}}
	pc.keep(s, &corev1.Pod{ObjectMeta: s.ObjectMeta})
	if pc.cached(s) == nil {
		t.Errorf("a kept pod's newer copy was not kept at the bound")
	}
}

// TestSelectedPodEvents: only events of pods the checks read (whole, or
// a stub whose pod was fetched) reach the evaluation's handler.
func TestSelectedPodEvents(t *testing.T) {
	pc := &podCache{fetched: map[string]fetchedPod{}}
	pc.setSelection(podSelection{"ns": {labels.SelectorFromSet(labels.Set{"app": "hook"})}})
	var n int
	h := selectedPodEvents{pc: pc, next: cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { n++ }, UpdateFunc: func(_, _ any) { n++ }, DeleteFunc: func(any) { n++ }}}
	stub := func(ns, name string) *metav1.PartialObjectMetadata {
		return &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, ResourceVersion: "1"}}
	}
	whole := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"}}
	h.OnAdd(stub("ns", "other"), false)
	h.OnUpdate(stub("ns", "other"), stub("ns", "other"))
	h.OnDelete(cache.DeletedFinalStateUnknown{Key: "ns/other", Obj: stub("ns", "other")})
	if n != 0 {
		t.Fatalf("%d events of pods the checks do not read passed", n)
	}
	pc.keep(stub("ns", "fetched"), &corev1.Pod{})
	h.OnAdd(whole, false)
	h.OnUpdate(stub("ns", "p"), whole)
	h.OnUpdate(stub("ns", "fetched"), stub("ns", "fetched"))
	h.OnDelete(cache.DeletedFinalStateUnknown{Key: "ns/fetched", Obj: stub("ns", "fetched")})
	h.OnDelete(cache.DeletedFinalStateUnknown{Key: "ns/p", Obj: whole})
	if n != 5 {
		t.Fatalf("%d of 5 events of pods the checks read passed", n)
	}
}
