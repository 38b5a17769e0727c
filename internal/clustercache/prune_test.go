package clustercache

import (
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"
)

// bigPod is a pod of about size bytes: a large annotation, many env vars
// and volumes, as a user who may create pods can write (the API server
// takes requests up to 1.5 MiB).
func bigPod(name string, size int) *corev1.Pod {
	env := make([]corev1.EnvVar, 0, size/64)
	for i := 0; i < size/2/40; i++ {
		env = append(env, corev1.EnvVar{Name: fmt.Sprintf("VAR_%06d", i), Value: strings.Repeat("v", 20)})
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "team", UID: "u-" + "name", ResourceVersion: "7",
			Labels:        map[string]string{"quota.scheduling.koordinator.sh/name": "q", "app": "x"},
			Annotations:   map[string]string{"junk": strings.Repeat("a", size/2)},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}},
		Spec: corev1.PodSpec{
			NodeName: "n1",
			InitContainers: []corev1.Container{{Name: "init", Image: "busybox", Env: env[:1],
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}}}},
			Containers: []corev1.Container{
				{Name: "a", Image: "nginx", Env: env, Args: []string{"x"},
					Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")}}},
				{Name: "b", Image: "nginx",
					Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")}}},
			},
			Volumes:  []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
			Overhead: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")},
		},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.1", Message: strings.Repeat("m", 100)},
	}
}

var podReads = Pods.Keep(
	P("metadata", "labels", "quota.scheduling.koordinator.sh/name"),
	P("spec", "containers", "resources"),
	P("spec", "initContainers", "resources"),
	P("spec", "overhead"),
	P("status", "phase"),
)

// TestPruneTypedPod: a pruned pod keeps its identity and the declared
// fields, in place (container i stays container i), and loses everything
// else: undeclared labels and annotations, env, images, volumes, other
// status, managedFields.
func TestPruneTypedPod(t *testing.T) {
	in := bigPod("p", 1<<20)
	want := in.DeepCopy()
	out, err := pruner([]Read{podReads}).Transform()(in)
	if err != nil {
		t.Fatal(err)
	}
	p := out.(*corev1.Pod)
	if p.Name != "p" || p.Namespace != "team" || p.UID != want.UID || p.ResourceVersion != "7" {
		t.Errorf("identity lost: %+v", p.ObjectMeta)
	}
	if len(p.Labels) != 1 || p.Labels["quota.scheduling.koordinator.sh/name"] != "q" {
		t.Errorf("labels %v, want only the quota label", p.Labels)
	}
	if p.Annotations != nil || p.ManagedFields != nil || p.Spec.Volumes != nil || p.Spec.NodeName != "" || p.Status.PodIP != "" || p.Status.Message != "" {
		t.Errorf("undeclared fields kept: %d annotations, managedFields %d, %d volumes, nodeName %q, podIP %q", len(p.Annotations), len(p.ManagedFields), len(p.Spec.Volumes), p.Spec.NodeName, p.Status.PodIP)
	}
	if len(p.Spec.Containers) != 2 || len(p.Spec.InitContainers) != 1 {
		t.Fatalf("containers %d, init %d: list lengths changed", len(p.Spec.Containers), len(p.Spec.InitContainers))
	}
	for i, c := range p.Spec.Containers {
		if c.Env != nil || c.Image != "" || c.Name != "" || c.Args != nil {
			t.Errorf("container %d keeps undeclared fields: %d env, image %q, name %q", i, len(c.Env), c.Image, c.Name)
		}
		if !equalJSON(t, c.Resources, want.Spec.Containers[i].Resources) {
			t.Errorf("container %d resources %v, want %v", i, c.Resources, want.Spec.Containers[i].Resources)
		}
	}
	if !equalJSON(t, p.Spec.InitContainers[0].Resources, want.Spec.InitContainers[0].Resources) || !equalJSON(t, p.Spec.Overhead, want.Spec.Overhead) || p.Status.Phase != corev1.PodRunning {
		t.Errorf("declared fields lost: init %v, overhead %v, phase %q", p.Spec.InitContainers[0].Resources, p.Spec.Overhead, p.Status.Phase)
	}
	if n := jsonSize(t, p); n > 1024 {
		t.Errorf("pruned pod is %d bytes of JSON, want < 1 KiB (from %d)", n, jsonSize(t, want))
	}
	// Idempotent, as client-go asks of a transform.
	again, err := pruner([]Read{podReads}).Transform()(p)
	if err != nil || !equalJSON(t, again, p) {
		t.Errorf("second transform changed the pod: %v", err)
	}
}

// TestPruneUnstructured: custom resources prune the same way; a scalar
// where a path goes deeper is dropped; list elements keep their index.
func TestPruneUnstructured(t *testing.T) {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "x/v1", "kind": "Q",
		"metadata": map[string]any{"name": "q", "namespace": "ns", "labels": map[string]any{"a": "1", "b": "2"},
			"annotations": map[string]any{"big": strings.Repeat("z", 1<<16)}, "managedFields": []any{map[string]any{}}},
		"spec": map[string]any{"min": map[string]any{"cpu": "1"}, "free": strings.Repeat("f", 1<<16),
			"items": []any{map[string]any{"keep": 1, "drop": 2}, "scalar", map[string]any{"drop": 3}}},
		"status": "not a map",
	}}
	p := NewPruner(false, P("metadata", "labels", "a"), P("spec", "min"), P("spec", "items", "keep"), P("status", "used"))
	out, err := p.Transform()(u)
	if err != nil {
		t.Fatal(err)
	}
	got := out.(*unstructured.Unstructured).Object
	want := map[string]any{
		"apiVersion": "x/v1", "kind": "Q",
		"metadata": map[string]any{"name": "q", "namespace": "ns", "labels": map[string]any{"a": "1"}},
		"spec":     map[string]any{"min": map[string]any{"cpu": "1"}, "items": []any{map[string]any{"keep": 1}, nil, map[string]any{}}},
	}
	if !equalJSON(t, got, want) {
		g, _ := json.Marshal(got)
		t.Errorf("pruned\n%s\nwant %v", g, want)
	}
	if _, ok := u.Object["status"]; !ok {
		t.Error("the input was modified")
	}
}

// TestPrunerUnion: the reads of one resource merge: a shorter path keeps
// its whole subtree whatever the longer ones say, and one whole read keeps
// whole objects (less managedFields).
func TestPrunerUnion(t *testing.T) {
	p := pruner([]Read{Pods.Keep(P("metadata", "labels", "x")), Pods.Keep(P("metadata", "labels"))})
	pod := bigPod("p", 4096)
	out, _ := p.Transform()(pod.DeepCopy())
	if got := out.(*corev1.Pod).Labels; len(got) != 2 {
		t.Errorf("labels %v, want both (metadata.labels declared whole)", got)
	}
	whole := pruner([]Read{Pods.Keep(P("status", "phase")), Pods.Whole()})
	if !whole.Whole() {
		t.Fatal("a whole read did not make the pruner whole")
	}
	out, _ = whole.Transform()(pod.DeepCopy())
	if o := out.(*corev1.Pod); o.ManagedFields != nil || len(o.Spec.Containers[0].Env) == 0 {
		t.Errorf("whole: managedFields %v, env %d", o.ManagedFields, len(o.Spec.Containers[0].Env))
	}
	if tomb := (cache.DeletedFinalStateUnknown{Key: "a/b", Obj: pod}); func() bool { o, _ := p.Transform()(tomb); _, ok := o.(cache.DeletedFinalStateUnknown); return !ok }() {
		t.Error("a tombstone was transformed")
	}
	// Key tells different fields apart, so a reload that changes what a
	// policy reads restarts the caches.
	if Key([]Read{Pods.Keep(P("status", "phase"))}) == Key([]Read{Pods.Keep(P("spec"))}) || Key([]Read{Pods.Whole()}) == Key([]Read{Pods.Keep()}) {
		t.Error("Key ignores the declared fields")
	}
	if Key([]Read{Pods.Keep(P("a")), LocalQueues.Keep()}) != Key([]Read{LocalQueues.Keep(), Pods.Keep(P("a")), Pods.Keep(P("a"))}) {
		t.Error("Key depends on order or repetition")
	}
}

// TestPrunedPodRetainedBytes fills an informer store through the pod
// transform with pods of 1 MiB each (big annotation and env) and bounds
// the heap the store retains per pod: the figure docs/security.md states.
func TestPrunedPodRetainedBytes(t *testing.T) {
	const n = 40
	tr := pruner([]Read{podReads}).Transform()
	store := cache.NewStore(cache.MetaNamespaceKeyFunc)
	before := heapInUse()
	for i := 0; i < n; i++ {
		obj, err := tr(bigPod(fmt.Sprintf("p%d", i), 1<<20))
		if err != nil {
			t.Fatal(err)
		}
		if err := store.Add(obj); err != nil {
			t.Fatal(err)
		}
	}
	after := heapInUse()
	per := (int64(after) - int64(before)) / n
	t.Logf("retained per 1 MiB pod: %d bytes (heap allocated %d -> %d)", per, before, after)
	if per > 16<<10 {
		t.Errorf("each pruned pod retains %d bytes, want < 16 KiB", per)
	}
	runtime.KeepAlive(store)
}

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

func jsonSize(t *testing.T, v any) int {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return len(b)
}

func equalJSON(t *testing.T, a, b any) bool {
	t.Helper()
	x, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	y, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return string(x) == string(y)
}
