package colocation

import (
	"encoding/json"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The facts of koordinator-sh/koordinator v1.8.0
// pkg/webhook/pod/validating/cluster_colocation_profile_test.go
// (TestClusterColocationProfileValidatingPod, lines 57-525): the same pods,
// operations and reasons; every denial is status 400
// (validating_handler.go:139-145).
func TestUpstreamValidatingTable(t *testing.T) {
	labelled := func(kv ...string) metav1.ObjectMeta {
		m := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return metav1.ObjectMeta{Labels: m}
	}
	batchRes := corev1.ResourceRequirements{
		Limits:   rl(string(BatchCPU), q("1"), string(BatchMemory), q("4Gi")),
		Requests: rl(string(BatchCPU), q("1"), string(BatchMemory), q("4Gi")),
	}
	cpu1 := []corev1.Container{{Resources: corev1.ResourceRequirements{Requests: rl("cpu", q("1"))}}}
	for _, c := range []struct {
		name         string
		op           admissionv1.Operation
		oldPod, pod  *corev1.Pod
		skipPriority bool
		wantReason   string
		wantAllowed  bool
	}{
		{name: "non-colocation empty pod", op: admissionv1.Create, pod: &corev1.Pod{}, wantAllowed: true},
		{name: "validate immutable QoS", op: admissionv1.Update,
			pod: &corev1.Pod{ObjectMeta: labelled(LabelPodQoS, "LS")}, oldPod: &corev1.Pod{ObjectMeta: labelled(LabelPodQoS, "BE")},
			wantReason: `labels.koordinator.sh/qosClass: Invalid value: "LS": field is immutable`},
		{name: "validate remove QoS", op: admissionv1.Update,
			pod: &corev1.Pod{}, oldPod: &corev1.Pod{ObjectMeta: labelled(LabelPodQoS, "BE")},
			wantReason: `labels.koordinator.sh/qosClass: Invalid value: "": field is immutable`},
		{name: "validate defined QoS", op: admissionv1.Create,
			pod: &corev1.Pod{ObjectMeta: labelled(LabelPodQoS, "BE"), Spec: corev1.PodSpec{
				Containers: []corev1.Container{{Name: "test-container-a", Resources: batchRes}}, Priority: p32(5000)}},
			wantAllowed: true},
		{name: "forbidden not defined QoS", op: admissionv1.Create,
			pod: &corev1.Pod{Spec: corev1.PodSpec{
				Containers: []corev1.Container{{Name: "test-container-a", Resources: batchRes}}, Priority: p32(6666)}},
			wantReason: `labels.koordinator.sh/qosClass: Required value: must specify koordinator QoS BE with koordinator colocation resources`},
		{name: "validate immutable priorityClass", op: admissionv1.Update,
			pod: &corev1.Pod{Spec: corev1.PodSpec{Priority: p32(9999)}}, oldPod: &corev1.Pod{Spec: corev1.PodSpec{Priority: p32(5000)}},
			wantReason: `spec.priority: Invalid value: "koord-prod": field is immutable`},
		{name: "validate remove priorityClass", op: admissionv1.Update,
			pod: &corev1.Pod{}, oldPod: &corev1.Pod{Spec: corev1.PodSpec{Priority: p32(5000)}},
			wantReason: `spec.priority: Invalid value: "": field is immutable`},
		{name: "validate koordinator priority with defaultSkipValidatingPriority=false", op: admissionv1.Update,
			pod: &corev1.Pod{ObjectMeta: labelled(LabelPodPriority, "8888")}, oldPod: &corev1.Pod{ObjectMeta: labelled(LabelPodPriority, "9999")},
			wantReason: `labels.koordinator.sh/priority: Invalid value: "8888": field is immutable`},
		{name: "validate koordinator priority with defaultSkipValidatingPriority=true", op: admissionv1.Update,
			pod: &corev1.Pod{ObjectMeta: labelled(LabelPodPriority, "8888")}, oldPod: &corev1.Pod{ObjectMeta: labelled(LabelPodPriority, "9999")},
			skipPriority: true, wantAllowed: true},
		{name: "validate remove koordinator priority", op: admissionv1.Update,
			pod: &corev1.Pod{}, oldPod: &corev1.Pod{ObjectMeta: labelled(LabelPodPriority, "9999")},
			wantReason: `labels.koordinator.sh/priority: Invalid value: "": field is immutable`},
		{name: "allowed QoS and priorityClass combination: BE And NonProd", op: admissionv1.Create,
			pod: &corev1.Pod{ObjectMeta: labelled(LabelPodQoS, "BE"), Spec: corev1.PodSpec{Priority: p32(5000)}}, wantAllowed: true},
		{name: "allowed QoS and priorityClass combination: LSR And Prod", op: admissionv1.Create,
			pod: &corev1.Pod{ObjectMeta: labelled(LabelPodQoS, "LSR"), Spec: corev1.PodSpec{Priority: p32(9999), Containers: cpu1}}, wantAllowed: true},
		{name: "forbidden QoS and priorityClass combination: BE And Prod", op: admissionv1.Create,
			pod:        &corev1.Pod{ObjectMeta: labelled(LabelPodQoS, "BE"), Spec: corev1.PodSpec{Priority: p32(9999)}},
			wantReason: `Pod: Forbidden: koordinator.sh/qosClass=BE and priorityClass=koord-prod cannot be used in combination`},
		{name: "forbidden QoS and priorityClass combination: LSR And Batch", op: admissionv1.Create,
			pod:        &corev1.Pod{ObjectMeta: labelled(LabelPodQoS, "LSR"), Spec: corev1.PodSpec{Priority: p32(5999), Containers: cpu1}},
			wantReason: `Pod: Forbidden: koordinator.sh/qosClass=LSR and priorityClass=koord-batch cannot be used in combination`},
		{name: "forbidden QoS and priorityClass combination: LSR And Mid", op: admissionv1.Create,
			pod:        &corev1.Pod{ObjectMeta: labelled(LabelPodQoS, "LSR"), Spec: corev1.PodSpec{Priority: p32(7999), Containers: cpu1}},
			wantReason: `Pod: Forbidden: koordinator.sh/qosClass=LSR and priorityClass=koord-mid cannot be used in combination`},
		{name: "forbidden QoS and priorityClass combination: LSR And Free", op: admissionv1.Create,
			pod:        &corev1.Pod{ObjectMeta: labelled(LabelPodQoS, "LSR"), Spec: corev1.PodSpec{Priority: p32(3999), Containers: cpu1}},
			wantReason: `Pod: Forbidden: koordinator.sh/qosClass=LSR and priorityClass=koord-free cannot be used in combination`},
		{name: "validate resources - LSR And Prod", op: admissionv1.Create,
			pod: &corev1.Pod{ObjectMeta: labelled(LabelPodQoS, "LS"), Spec: corev1.PodSpec{Priority: p32(9999), Containers: []corev1.Container{{
				Resources: corev1.ResourceRequirements{Limits: rl("cpu", q("1"), "memory", q("4Gi")), Requests: rl("cpu", q("1"), "memory", q("4Gi"))}}}}},
			wantAllowed: true},
		{name: "forbidden resources - LSR And Prod: unset CPUs", op: admissionv1.Create,
			pod: &corev1.Pod{ObjectMeta: labelled(LabelPodQoS, "LSR"), Spec: corev1.PodSpec{Priority: p32(9999), Containers: []corev1.Container{{
				Name: "test-container-skip", Resources: corev1.ResourceRequirements{Limits: rl("memory", q("4Gi")), Requests: rl("memory", q("0Gi"))}}}}},
			wantReason: `pod.spec.containers[*].resources.requests: Required value: LSR Pod must declare the requested CPUs`},
		{name: "forbidden resources - LSR And Prod: non-integer CPUs", op: admissionv1.Create,
			pod: &corev1.Pod{ObjectMeta: labelled(LabelPodQoS, "LSR"), Spec: corev1.PodSpec{Priority: p32(9999), Containers: []corev1.Container{{
				Name: "test-container-skip", Resources: corev1.ResourceRequirements{Limits: rl("cpu", q("100m"), "memory", q("4Gi")), Requests: rl("cpu", q("100m"), "memory", q("0Gi"))}}}}},
			wantReason: `pod.spec.containers[*].resources.requests: Invalid value: "100m": the requested CPUs of LSR Pod must be integer`},

		// kadmit's own cases on the same rules.
		{name: "several errors aggregate", op: admissionv1.Update,
			pod:        &corev1.Pod{ObjectMeta: labelled(LabelPodQoS, "LS"), Spec: corev1.PodSpec{Priority: p32(9999)}},
			oldPod:     &corev1.Pod{ObjectMeta: labelled(LabelPodQoS, "BE"), Spec: corev1.PodSpec{Priority: p32(5000)}},
			wantReason: `[labels.koordinator.sh/qosClass: Invalid value: "LS": field is immutable, spec.priority: Invalid value: "koord-prod": field is immutable]`},
		{name: "BE without a koord priority class", op: admissionv1.Create,
			pod:        &corev1.Pod{ObjectMeta: labelled(LabelPodQoS, "BE")},
			wantReason: `Pod: Forbidden: koordinator.sh/qosClass=BE and priorityClass= cannot be used in combination`},
		{name: "priority-class label wins over spec.priority", op: admissionv1.Create,
			pod: &corev1.Pod{ObjectMeta: labelled(LabelPodQoS, "BE", LabelPodPriorityClass, "koord-batch"), Spec: corev1.PodSpec{Priority: p32(9999)}}, wantAllowed: true},
		{name: "batch resource in an init container", op: admissionv1.Create,
			pod:        &corev1.Pod{Spec: corev1.PodSpec{InitContainers: []corev1.Container{{Resources: corev1.ResourceRequirements{Requests: rl(string(BatchMemory), q("1Gi"))}}}}},
			wantReason: `labels.koordinator.sh/qosClass: Required value: must specify koordinator QoS BE with koordinator colocation resources`},
		{name: "LSE with integer CPUs", op: admissionv1.Create,
			pod: &corev1.Pod{ObjectMeta: labelled(LabelPodQoS, "LSE"), Spec: corev1.PodSpec{Containers: []corev1.Container{{Resources: corev1.ResourceRequirements{Requests: rl("cpu", q("2"))}}}}}, wantAllowed: true},
		{name: "unchanged labels on UPDATE", op: admissionv1.Update,
			pod:    &corev1.Pod{ObjectMeta: labelled(LabelPodQoS, "BE", LabelPodPriority, "1"), Spec: corev1.PodSpec{Priority: p32(5000)}},
			oldPod: &corev1.Pod{ObjectMeta: labelled(LabelPodQoS, "BE", LabelPodPriority, "1"), Spec: corev1.PodSpec{Priority: p32(5000)}}, wantAllowed: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, err := New(Config{SkipValidatingPriority: c.skipPriority}, nil)
			if err != nil {
				t.Fatal(err)
			}
			raw, _ := json.Marshal(c.pod)
			var old []byte
			if c.oldPod != nil {
				old, _ = json.Marshal(c.oldPod)
			}
			v := p.Validate(t.Context(), podReq("default", c.op, raw, old))
			if v.Allowed != c.wantAllowed {
				t.Fatalf("allowed = %v, want %v (%+v)", v.Allowed, c.wantAllowed, v)
			}
			if !c.wantAllowed && (v.Message != c.wantReason || v.Code != 400) {
				t.Fatalf("got %d %q\nwant 400 %q", v.Code, v.Message, c.wantReason)
			}
		})
	}
}

func TestValidateBadInput(t *testing.T) {
	p, _ := New(Config{}, nil)
	for _, raw := range []string{
		`{"metadata":{"labels":{"koordinator.sh/qosClass":"LSR"}},"spec":{"containers":[{"resources":{"requests":{"cpu":"1e9999999"}}}]}}`,
		`{"metadata":{"labels":"x"}}`,
		`{"spec":{"priority":"high"}}`,
		`{"spec":{"containers":[{"resources":{"requests":{"kubernetes.io/batch-cpu":[]}}}]}}`,
	} {
		if v := p.Validate(t.Context(), podReq("default", admissionv1.Create, []byte(raw), nil)); v.Allowed || v.Code != 400 {
			t.Errorf("%s: %+v", raw, v)
		}
	}
	// An escaped batch resource name is still found.
	raw := `{"spec":{"containers":[{"resources":{"requests":{"kubernetes.io/batch\u002dcpu":"1"}}}]}}`
	if v := p.Validate(t.Context(), podReq("default", admissionv1.Create, []byte(raw), nil)); v.Allowed {
		t.Errorf("escaped batch-cpu admitted")
	}
}
