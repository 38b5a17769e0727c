package clustercache

import (
	"reflect"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// TestPruneMetaOnlyMatchesFullConversion: a pruner keeping only metadata
// converts only a typed object's ObjectMeta, and its result is the one the
// whole object's round trip through its unstructured form gives.
func TestPruneMetaOnlyMatchesFullConversion(t *testing.T) {
	ctrl := true
	om := metav1.ObjectMeta{Name: "a", Namespace: "n", UID: "u", ResourceVersion: "3",
		Labels: map[string]string{"x": "y", "z": "w"}, Annotations: map[string]string{"a": "b"},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "r", UID: "q", Controller: &ctrl}},
		ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "m"}}, Finalizers: []string{"f"}, CreationTimestamp: metav1.Now()}
	pod := &corev1.Pod{TypeMeta: metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"}, ObjectMeta: om,
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{"cpu": resource.MustParse("1")}}}}}}
	full := func(p *Pruner, o runtime.Object) runtime.Object {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(o)
		if err != nil {
			t.Fatal(err)
		}
		out := reflect.New(reflect.TypeOf(o).Elem()).Interface().(runtime.Object)
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(pruneMap(m, p.root), out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	for _, p := range []*Pruner{
		NewPruner(false, P("metadata", "labels"), P("metadata", "ownerReferences")),
		NewPruner(false, P("metadata", "labels", "x")),
		NewPruner(false),
		NewPruner(false, P("metadata")),
		NewPruner(false, P("metadata", "creationTimestamp"), P("metadata", "finalizers")),
	} {
		for _, o := range []runtime.Object{pod, &appsv1.ReplicaSet{ObjectMeta: om}, &corev1.Namespace{ObjectMeta: om}} {
			got, ok, err := p.pruneMetaOnly(o)
			if !ok || err != nil {
				t.Fatalf("%s %T: meta-only prune not taken (%v) or failed: %v", p, o, ok, err)
			}
			if want := full(p, o); !reflect.DeepEqual(got, want) {
				t.Fatalf("%s %T:\n got %#v\nwant %#v", p, o, got, want)
			}
		}
	}
	if _, ok, _ := NewPruner(false, P("spec")).pruneMetaOnly(pod); ok {
		t.Fatal("a pruner keeping spec took the meta-only prune")
	}
}
