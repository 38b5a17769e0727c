package colocation

import (
	"encoding/json"
	"fmt"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kadmit/kadmit/internal/jsonedit"
	"github.com/kadmit/kadmit/internal/policy/policytest"
)

// TestUpstreamExtendedResourceSpec carries over TestExtendedResourceSpecMutatingPod
// (pkg/webhook/pod/mutating/extended_resource_spec_test.go:38-139): a pod
// with batch resources (and one other) gets the annotation listing its
// batch requests and limits, canonical quantities ("1000" -> "1k").
func TestUpstreamExtendedResourceSpec(t *testing.T) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "test-pod-1", Labels: map[string]string{
			"koordinator-colocation-pod": "true", LabelPodQoS: "BE", LabelPodPriority: "1111"}},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "test-container-a", Resources: corev1.ResourceRequirements{
				Limits:   rl(string(BatchCPU), q("1000"), string(BatchMemory), q("4Gi"), "unknown-resource", q("1")),
				Requests: rl(string(BatchCPU), q("1000"), string(BatchMemory), q("4Gi"), "unknown-resource", q("1")),
			}}},
			SchedulerName: "koordinator-scheduler", Priority: p32(5999), PriorityClassName: "koordinator-batch",
		},
	}
	const want = `{"containers":{"test-container-a":{"limits":{"kubernetes.io/batch-cpu":"1k","kubernetes.io/batch-memory":"4Gi"},"requests":{"kubernetes.io/batch-cpu":"1k","kubernetes.io/batch-memory":"4Gi"}}}}`
	for _, profiles := range [][]Profile{nil, {{Name: "other", Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"x": "y"}}}}} {
		p, _ := New(Config{Profiles: profiles}, nil)
		raw, _ := json.Marshal(pod)
		ops, v := p.Mutate(t.Context(), podReq("default", admissionv1.Create, raw, nil))
		if !v.Allowed {
			t.Fatalf("denied %+v", v)
		}
		out := policytest.Check(t, raw, ops, func(got *corev1.Pod) {
			got.Annotations = map[string]string{AnnotationExtendedResourceSpec: want}
		})
		// Applied again, nothing changes.
		if ops, _ := p.Mutate(t.Context(), podReq("default", admissionv1.Create, out, nil)); len(ops) != 0 {
			t.Fatalf("second pass: %v", ops)
		}
	}
	p, _ := New(Config{}, nil)
	// A stale annotation on a pod without batch resources becomes "{}".
	stale := []byte(`{"metadata":{"annotations":{"node.koordinator.sh/extended-resource-spec":"{\"containers\":{\"c\":{}}}"}},"spec":{"containers":[{"name":"c"}]}}`)
	ops, _ := p.Mutate(t.Context(), podReq("default", admissionv1.Create, stale, nil))
	policytest.Check(t, stale, ops, func(got *corev1.Pod) { got.Annotations[AnnotationExtendedResourceSpec] = "{}" })
	// A malformed annotation is upstream's 500 (mutating_handler.go:89-91).
	bad := []byte(`{"metadata":{"annotations":{"node.koordinator.sh/extended-resource-spec":"{"}},"spec":{}}`)
	if _, v := p.Mutate(t.Context(), podReq("default", admissionv1.Create, bad, nil)); v.Allowed || v.Code != 500 {
		t.Fatalf("malformed annotation: %+v", v)
	}
	// A pod without batch resources or the annotation is left alone.
	if ops, _ := p.Mutate(t.Context(), podReq("default", admissionv1.Create, []byte(`{"spec":{"containers":[{"name":"c","resources":{"requests":{"cpu":"1"}}}]}}`), nil)); len(ops) != 0 {
		t.Fatalf("plain pod: %v", ops)
	}
}

// extendedSpecAnnotation reads what doc.Decode reads of the annotation,
// with the same error, whether it takes the shortcut or not.
func TestExtendedSpecAnnotationMatchesDecode(t *testing.T) {
	const name = `"node.koordinator.sh/extended-resource-spec"`
	for _, ann := range []string{
		`{}`, `{"a":"b","checksum/config":"4f1c"}`,
		`{` + name + `:"{}"}`, `{"a":"b",` + name + `:"{\"containers\":{}}"}`,
		`{` + name + `:1}`, `{` + name + `:null}`, `{"a":` + name + `}`,
		`{"node.koordinator.sh\/extended-resource-spec":"x"}`, `{"node.koordinator.sh/extended-resource-spe\u0063":"x"}`,
		`{"a":"b\` + name[:len(name)-1] + `\""}`, `{"a":"\\"}`,
		`null`, `"x"`, `[]`, ``,
	} {
		pod := `{"metadata":{"name":"p"}}`
		if ann != "" {
			pod = `{"metadata":{"name":"p","annotations":` + ann + `}}`
		}
		if !jsonedit.Valid([]byte(pod)) {
			t.Fatalf("%s: not JSON", pod)
		}
		cur, has, err := extendedSpecAnnotation(jsonedit.NewDoc([]byte(pod)))
		var wcur string
		whas, werr := jsonedit.NewDoc([]byte(pod)).Decode(&wcur, "metadata", "annotations", AnnotationExtendedResourceSpec)
		if cur != wcur || has != whas || fmt.Sprint(err) != fmt.Sprint(werr) {
			t.Errorf("%s: %q %v %v, Decode %q %v %v", ann, cur, has, err, wcur, whas, werr)
		}
	}
}
