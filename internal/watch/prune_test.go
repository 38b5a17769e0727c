package watch

import (
	"context"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestTransformPodsAndWorkloads: in a namespace holding a webhook Service
// the watch's pods and workloads keep what the checks read (labels, owner
// references, pod spec, workload selector and template); elsewhere only
// labels and owner references; never annotations, status or managedFields.
func TestTransformPodsAndWorkloads(t *testing.T) {
	owner := []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "rs", UID: "u", Controller: new(true)}}
	meta := metav1.ObjectMeta{Name: "p", Namespace: "ns", Labels: map[string]string{"app": "hook"}, OwnerReferences: owner,
		Annotations: map[string]string{"big": strings.Repeat("a", 200<<10)}, ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "m"}}}
	spec := corev1.PodSpec{ServiceAccountName: "sa", Containers: []corev1.Container{{Name: "c", Image: "i",
		Ports: []corev1.ContainerPort{{Name: "https", ContainerPort: 8443}}}}}
	pod := &corev1.Pod{ObjectMeta: meta, Spec: spec, Status: corev1.PodStatus{Phase: corev1.PodRunning, Message: strings.Repeat("m", 10<<10),
		ContainerStatuses: []corev1.ContainerStatus{{Name: "c", Image: "i"}}}}
	tr := workloadTransform(map[string]bool{"ns": true})
	out, err := tr(pod.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	p := out.(*corev1.Pod)
	if p.Name != "p" || p.Namespace != "ns" || p.Labels["app"] != "hook" || len(p.OwnerReferences) != 1 || p.OwnerReferences[0].Name != "rs" ||
		p.Spec.ServiceAccountName != "sa" || p.Spec.Containers[0].Ports[0].Name != "https" {
		t.Errorf("pod lost what the checks read: %+v", p.ObjectMeta)
	}
	if p.Annotations != nil || p.ManagedFields != nil || p.Status.Phase != "" || p.Status.Message != "" || p.Status.ContainerStatuses != nil {
		t.Errorf("pod keeps unread fields: %d annotations, status %q", len(p.Annotations), p.Status.Phase)
	}

	d := &appsv1.Deployment{ObjectMeta: meta, Spec: appsv1.DeploymentSpec{Replicas: new(int32(3)),
		Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "hook"}},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "hook"},
			Annotations: map[string]string{"big": strings.Repeat("t", 100<<10)}}, Spec: spec}},
		Status: appsv1.DeploymentStatus{Replicas: 3}}
	out, err = tr(d.DeepCopy())
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
	// Elsewhere: labels and owner references.
	out, _ = workloadTransform(map[string]bool{"hooks": true})(pod.DeepCopy())
	if p := out.(*corev1.Pod); p.Labels["app"] != "hook" || len(p.OwnerReferences) != 1 || p.Spec.Containers != nil || p.Annotations != nil {
		t.Errorf("pod outside the webhook namespaces keeps %d containers, %d annotations; labels %v", len(p.Spec.Containers), len(p.Annotations), p.Labels)
	}
	out, _ = workloadTransform(map[string]bool{"hooks": true})(d.DeepCopy())
	if w := out.(*appsv1.Deployment); w.Labels["app"] != "hook" || w.Spec.Selector != nil || w.Spec.Template.Spec.Containers != nil {
		t.Errorf("deployment outside the webhook namespaces keeps its spec")
	}
	// Other objects only lose managedFields.
	svc := &corev1.Service{ObjectMeta: *meta.DeepCopy()}
	out, _ = transform(svc)
	if s := out.(*corev1.Service); s.ManagedFields != nil || s.Annotations == nil {
		t.Errorf("service: managedFields %v, annotations %d", s.ManagedFields, len(s.Annotations))
	}
}

// TestWorkloadsKeepSpecsInWebhookNamespaces: pods in the namespace of a
// webhook Service are cached with their spec from the first sync, pods
// elsewhere without; when a webhook configuration names a Service in a new
// namespace, the workload informers are listed again and that namespace's
// pods get their spec, as do pods a webhook's EndpointSlice names in
// another namespace.
func TestWorkloadsKeepSpecsInWebhookNamespaces(t *testing.T) {
	pod := func(ns string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p-" + ns, Namespace: ns, Labels: map[string]string{"app": "hook"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "i", Env: []corev1.EnvVar{{Name: "BIG", Value: strings.Repeat("e", 64<<10)}}}}}}
	}
	// A hand-made EndpointSlice of the webhook's Service names a pod in
	// namespace "target": its spec is read too.
	sl := slice("hook", 9443, "10.0.0.9")
	sl.Endpoints[0].TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: "target", Name: "p-target"}
	r := startController(t, nil, validatingConfig("cfg", "hook", true, nil, "a.example.com"), testService("hook", 9443), sl,
		pod(testNS), pod("late"), pod("target"))
	spec := func(ns string) int {
		w := r.c.cl.wl.Load()
		if w == nil || !w.hasSynced() {
			return -1
		}
		p, err := w.pods.Pods(ns).Get("p-" + ns)
		if err != nil {
			return -1
		}
		return len(p.Spec.Containers)
	}
	waitFor(t, 5*time.Second, "the first sync", func() bool { return spec(testNS) >= 0 })
	if got, late := spec(testNS), spec("late"); got != 1 || late != 0 {
		t.Fatalf("containers kept: %d in the webhook's namespace (want 1), %d elsewhere (want 0)", got, late)
	}
	late := validatingConfig("late-cfg", "hook", true, nil, "b.example.com")
	late.Webhooks[0].ClientConfig.Service.Namespace = "late"
	if _, err := r.cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(context.Background(), late, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the pods of the new webhook namespace listed with their spec", func() bool { return spec("late") == 1 })
	if spec("target") != 1 {
		t.Errorf("the pod a webhook's EndpointSlice names in another namespace has no spec")
	}
}
