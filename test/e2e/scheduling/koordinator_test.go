package scheduling

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kadmit/kadmit/test/e2e/e2eenv"
	"github.com/kadmit/kadmit/test/poll"
)

// The Koordinator pod and Reservation rules of the colocation and
// reservation policies (koordinator-sh/koordinator v1.8.0
// pkg/webhook/pod/{mutating,validating}/, pkg/webhook/reservation/) against
// the real API server: /mutate-reservation, the pod UPDATE rules on
// /validate-pod, and the batch resource translation on /mutate-pod.

var reservationGVR = schema.GroupVersionResource{Group: "scheduling.koordinator.sh", Version: "v1alpha1", Resource: "reservations"}

// koordBatchValue is the koord-batch PriorityClass's value, in
// Koordinator's batch range (apis/extension/priority.go:44-45).
const koordBatchValue = 5500

// koordinatorSetup creates the koord-batch PriorityClass the batch profile
// names, before kadmit starts its PriorityClass cache.
func (e *env) koordinatorSetup(ctx context.Context) error {
	pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "koord-batch"}, Value: koordBatchValue}
	if _, err := e.Client.SchedulingV1().PriorityClasses().Create(ctx, pc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create PriorityClass koord-batch: %w", err)
	}
	return nil
}

func newReservation(name string, labels map[string]string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "scheduling.koordinator.sh/v1alpha1",
		"kind":       "Reservation",
		"metadata":   map[string]any{"name": name},
		"spec": map[string]any{
			"template": map[string]any{"spec": map[string]any{
				"containers": []any{map[string]any{"name": "c", "image": "registry.k8s.io/pause:3.10",
					"resources": map[string]any{"requests": map[string]any{"cpu": "500m", "memory": "256Mi"}}}},
			}},
			"owners": []any{map[string]any{"object": map[string]any{"name": "owner", "namespace": "default"}}},
			"ttl":    "1h",
		},
	}}
	u.SetLabels(labels)
	return u
}

func TestKoordinatorReservationMutate(t *testing.T) {
	e := world(t)
	ctx := e2eenv.TestCtx(t, time.Minute)
	res := e.dyn.Resource(reservationGVR)

	got, err := res.Create(ctx, newReservation("batch-"+e.suffix, map[string]string{"qos": "be"}), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = res.Delete(context.Background(), got.GetName(), metav1.DeleteOptions{}) })
	spec, _, _ := unstructured.NestedMap(got.Object, "spec", "template", "spec")
	// The profile's namespaceSelector does not apply to a Reservation
	// (reservation/mutating/cluster_colocation_profile.go:69): it matches by
	// its selector alone.
	if got.GetLabels()["koordinator.sh/qosClass"] != "BE" || got.GetAnnotations()["kadmit.io/colocation-profiles"] != "batch" ||
		spec["schedulerName"] != "koord-scheduler" || spec["priorityClassName"] != "koord-batch" ||
		fmt.Sprint(spec["priority"]) != fmt.Sprint(koordBatchValue) || spec["preemptionPolicy"] != string(corev1.PreemptLowerPriority) {
		t.Fatalf("stored Reservation labels %v annotations %v template spec %v", got.GetLabels(), got.GetAnnotations(), spec)
	}
	// Upstream translates no Reservation resources (line 101).
	cs, _, _ := unstructured.NestedSlice(spec, "containers")
	if req, _, _ := unstructured.NestedStringMap(cs[0].(map[string]any), "resources", "requests"); req["cpu"] != "500m" {
		t.Fatalf("template resources changed: %v", req)
	}

	plain, err := res.Create(ctx, newReservation("plain-"+e.suffix, nil), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = res.Delete(context.Background(), plain.GetName(), metav1.DeleteOptions{}) })
	if len(plain.GetLabels()) != 0 || len(plain.GetAnnotations()) != 0 {
		t.Fatalf("unmatched Reservation changed: labels %v annotations %v", plain.GetLabels(), plain.GetAnnotations())
	}
	// CREATE only (reservation/mutating/webhooks.go:27): a label added by
	// an update does not bring the profile in.
	patched, err := res.Patch(ctx, plain.GetName(), types.MergePatchType, []byte(`{"metadata":{"labels":{"qos":"be"}}}`), metav1.PatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := patched.GetLabels()["koordinator.sh/qosClass"]; ok {
		t.Fatalf("Reservation mutated on UPDATE: %v", patched.GetLabels())
	}
}

func koordPod(name string, labels, annotations map[string]string, class string, req corev1.ResourceList) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Annotations: annotations},
		Spec: corev1.PodSpec{PriorityClassName: class, Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10",
			Resources: corev1.ResourceRequirements{Requests: req, Limits: req}}}},
	}
}

// wantBadRequest fails unless err is a denial with status 400 containing msg
// (upstream's validating handler answers 400, validating_handler.go:142).
func wantBadRequest(t *testing.T, err error, msg string) {
	t.Helper()
	wantDenied(t, err, msg)
	if s, ok := err.(apierrors.APIStatus); !ok || s.Status().Code != http.StatusBadRequest {
		t.Fatalf("error %v: want status 400", err)
	}
}

func TestKoordinatorPodUpdateRules(t *testing.T) {
	e := world(t)
	ctx := e2eenv.TestCtx(t, time.Minute)
	pods := e.Client.CoreV1().Pods(e.plain)
	created, err := pods.Create(ctx, koordPod("be-update", map[string]string{"koordinator.sh/qosClass": "BE"}, nil, "koord-batch", nil), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if created.Spec.Priority == nil || *created.Spec.Priority != koordBatchValue {
		t.Fatalf("priority %v", created.Spec.Priority)
	}
	patch := func(p string) error {
		_, err := pods.Patch(ctx, created.Name, types.MergePatchType, []byte(p), metav1.PatchOptions{})
		return err
	}
	// validateImmutableQoSClass (validating/cluster_colocation_profile.go:90-94).
	wantBadRequest(t, patch(`{"metadata":{"labels":{"koordinator.sh/qosClass":"LS"}}}`),
		`labels.koordinator.sh/qosClass: Invalid value: "LS": field is immutable`)
	wantBadRequest(t, patch(`{"metadata":{"labels":{"koordinator.sh/qosClass":null}}}`),
		`labels.koordinator.sh/qosClass: Invalid value: "": field is immutable`)
	// validateImmutablePriority (lines 102-106).
	wantBadRequest(t, patch(`{"metadata":{"labels":{"koordinator.sh/priority":"5"}}}`),
		`labels.koordinator.sh/priority: Invalid value: "5": field is immutable`)
	// validateImmutablePriorityClass (lines 96-100): the priority-class
	// label overrides the class spec.priority gives.
	wantBadRequest(t, patch(`{"metadata":{"labels":{"koordinator.sh/priority-class":"koord-prod"}}}`),
		`spec.priority: Invalid value: "koord-prod": field is immutable`)
	// The reserve-pod ban holds on UPDATE too (verify_annotations.go:38-49).
	wantBadRequest(t, patch(`{"metadata":{"annotations":{"scheduling.koordinator.sh/reserve-pod":"true"}}}`),
		`annotations.scheduling.koordinator.sh/reserve-pod: Forbidden: cannot set in annotations`)
	if err := patch(`{"metadata":{"labels":{"team":"a"}}}`); err != nil {
		t.Fatalf("an unrelated label change: %v", err)
	}
}

func TestKoordinatorPodCreateRules(t *testing.T) {
	e := world(t)
	ctx := e2eenv.TestCtx(t, time.Minute)
	pods := e.Client.CoreV1().Pods(e.plain)
	for _, c := range []struct {
		pod *corev1.Pod
		msg string
	}{
		{koordPod("reserve", nil, map[string]string{"scheduling.koordinator.sh/reserve-pod": ""}, "", nil),
			`annotations.scheduling.koordinator.sh/reserve-pod: Forbidden: cannot set in annotations`},
		{koordPod("batch-no-be", nil, nil, "", corev1.ResourceList{"kubernetes.io/batch-cpu": resource.MustParse("1000")}),
			`labels.koordinator.sh/qosClass: Required value: must specify koordinator QoS BE with koordinator colocation resources`},
		{koordPod("be-no-class", map[string]string{"koordinator.sh/qosClass": "BE"}, nil, "", nil),
			`Pod: Forbidden: koordinator.sh/qosClass=BE and priorityClass= cannot be used in combination`},
		{koordPod("lsr-fraction", map[string]string{"koordinator.sh/qosClass": "LSR", "koordinator.sh/priority-class": "koord-prod"}, nil, "",
			corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m")}),
			`pod.spec.containers[*].resources.requests: Invalid value: "500m": the requested CPUs of LSR Pod must be integer`},
	} {
		_, err := pods.Create(ctx, c.pod, metav1.CreateOptions{})
		wantBadRequest(t, err, c.msg)
	}
}

func TestKoordinatorBatchResources(t *testing.T) {
	e := world(t)
	ctx := e2eenv.TestCtx(t, time.Minute)
	req := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("256Mi")}
	got, err := e.Client.CoreV1().Pods(e.mixed).Create(ctx, koordPod("batch-res", map[string]string{"qos": "be"}, nil, "", req), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// cpu in milli-cores as an integer, memory unchanged
	// (mutating/cluster_colocation_profile.go:283-312).
	want := corev1.ResourceList{"kubernetes.io/batch-cpu": *resource.NewQuantity(500, resource.DecimalSI), "kubernetes.io/batch-memory": resource.MustParse("256Mi")}
	r := got.Spec.Containers[0].Resources
	for _, l := range []corev1.ResourceList{r.Requests, r.Limits} {
		if len(l) != 2 || l.Name("kubernetes.io/batch-cpu", resource.DecimalSI).Cmp(want["kubernetes.io/batch-cpu"]) != 0 ||
			l.Name("kubernetes.io/batch-memory", resource.BinarySI).Cmp(want["kubernetes.io/batch-memory"]) != 0 {
			t.Fatalf("stored resources %v, want requests and limits %v", r, want)
		}
	}
	if got.Spec.PriorityClassName != "koord-batch" || got.Spec.Priority == nil || *got.Spec.Priority != koordBatchValue {
		t.Fatalf("priority class %q priority %v", got.Spec.PriorityClassName, got.Spec.Priority)
	}
	// extended_resource_spec.go:33-80, after the profiles.
	const spec = `{"containers":{"c":{"limits":{"kubernetes.io/batch-cpu":"500","kubernetes.io/batch-memory":"256Mi"},"requests":{"kubernetes.io/batch-cpu":"500","kubernetes.io/batch-memory":"256Mi"}}}}`
	if a := got.Annotations["node.koordinator.sh/extended-resource-spec"]; a != spec {
		t.Fatalf("extended-resource-spec %q, want %q", a, spec)
	}
}

// TestKoordinatorReservationAllocations is kadmit's opt-in checkAllocations
// (on in this suite's config): a pod naming a Reservation is checked
// against the Reservation's status as kadmit's informer sees it.
func TestKoordinatorReservationAllocations(t *testing.T) {
	e := world(t)
	ctx := e2eenv.TestCtx(t, time.Minute)
	res := e.dyn.Resource(reservationGVR)
	name := "alloc-" + e.suffix
	r, err := res.Create(ctx, newReservation(name, nil), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = res.Delete(context.Background(), name, metav1.DeleteOptions{}) })
	pods := e.Client.CoreV1().Pods(e.plain)
	affinity := map[string]string{"scheduling.koordinator.sh/reservation-affinity": `{"name":"` + name + `"}`}
	cpu := func(q string) corev1.ResourceList {
		return corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(q)}
	}

	// No status yet: the Reservation is not Available.
	if err := poll.Until(ctx, cacheWait, func(ctx context.Context) error {
		_, err := pods.Create(ctx, koordPod("alloc-pending", nil, affinity, "", cpu("1")), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err == nil {
			return fmt.Errorf("admitted before the Reservation is Available")
		}
		if !strings.Contains(err.Error(), `is "", not Available`) {
			return err
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	_ = unstructured.SetNestedField(r.Object, map[string]any{
		"phase": "Available", "allocatable": map[string]any{"cpu": "4"}, "allocated": map[string]any{"cpu": "3"},
	}, "status")
	if _, err := res.UpdateStatus(ctx, r, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Once kadmit's cache has the status: 1 CPU fits, 2 do not.
	if err := poll.Until(ctx, cacheWait, func(ctx context.Context) error {
		_, err := pods.Create(ctx, koordPod("alloc-fits", nil, affinity, "", cpu("1")), metav1.CreateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	_, err = pods.Create(ctx, koordPod("alloc-over", nil, affinity, "", cpu("2")), metav1.CreateOptions{})
	wantDenied(t, err, `pod requests cpu 2, Reservation "`+name+`" has 1 of 4 left`)
	missing := map[string]string{"scheduling.koordinator.sh/reservation-affinity": `{"name":"no-such-reservation"}`}
	_, err = pods.Create(ctx, koordPod("alloc-missing", nil, missing, "", cpu("1")), metav1.CreateOptions{})
	wantDenied(t, err, `Reservation "no-such-reservation" named by scheduling.koordinator.sh/reservation-affinity does not exist`)
}
