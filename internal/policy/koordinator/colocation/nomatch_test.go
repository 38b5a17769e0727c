package colocation

import (
	"net/http"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestMutateReadsOnlyWhatMatchingNeeds: a pod no profile matches is read
// for its labels, its annotations and its containers' batch resources only
// (upstream returns before touching it, cluster_colocation_profile.go:86-88),
// so a spec field only a matching profile would decode does not matter;
// the same pod, matched by a profile that writes that field, is refused
// with 400 as before.
func TestMutateReadsOnlyWhatMatchingNeeds(t *testing.T) {
	p, err := New(Config{Profiles: []Profile{{
		Name:         "batch",
		Selector:     &metav1.LabelSelector{MatchLabels: map[string]string{"qos": "be"}},
		NodeSelector: map[string]string{"pool": "mixed"},
	}}}, fakeNS{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, pod string
		code      int32 // 0: allowed
		ops       int
	}{
		{"no match, bad nodeSelector ignored", `{"metadata":{"labels":{"qos":"ls"}},"spec":{"nodeSelector":7,"containers":[{"name":"c"}]}}`, 0, 0},
		{"no match, batch resources annotated", `{"metadata":{"labels":{"qos":"ls"}},"spec":{"nodeSelector":7,"containers":[{"name":"c","resources":{"requests":{"kubernetes.io/batch-cpu":"1k"}}}]}}`, 0, 1},
		{"no match, stale annotation rewritten", `{"metadata":{"annotations":{"node.koordinator.sh/extended-resource-spec":"{}x"}},"spec":{"containers":[{"name":"c"}]}}`, http.StatusInternalServerError, 0},
		{"no match, bad labels", `{"metadata":{"labels":["qos"]},"spec":{}}`, http.StatusBadRequest, 0},
		{"match, bad nodeSelector refused", `{"metadata":{"labels":{"qos":"be"}},"spec":{"nodeSelector":7,"containers":[{"name":"c"}]}}`, http.StatusBadRequest, 0},
		{"match, nodeSelector set", `{"metadata":{"labels":{"qos":"be"}},"spec":{"containers":[{"name":"c"}]}}`, 0, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ops, v := p.Mutate(t.Context(), podReq("ns", admissionv1.Create, []byte(tt.pod), nil))
			if tt.code == 0 {
				if !v.Allowed || len(ops) != tt.ops {
					t.Fatalf("got allowed=%v ops %v (%+v), want allowed with %d ops", v.Allowed, ops, v, tt.ops)
				}
				return
			}
			if v.Allowed || v.Code != tt.code {
				t.Fatalf("got %+v, want a refusal with %d", v, tt.code)
			}
		})
	}
}

// TestSameToleration: sameToleration agrees with equality.Semantic.DeepEqual,
// which it replaces, field by field.
func TestSameToleration(t *testing.T) {
	base := corev1.Toleration{Key: "k", Operator: corev1.TolerationOpEqual, Value: "v", Effect: corev1.TaintEffectNoExecute, TolerationSeconds: new(int64(30))}
	variants := []func(*corev1.Toleration){
		func(*corev1.Toleration) {},
		func(x *corev1.Toleration) { x.Key = "other" },
		func(x *corev1.Toleration) { x.Operator = corev1.TolerationOpExists },
		func(x *corev1.Toleration) { x.Value = "" },
		func(x *corev1.Toleration) { x.Effect = "" },
		func(x *corev1.Toleration) { x.TolerationSeconds = nil },
		func(x *corev1.Toleration) { x.TolerationSeconds = new(int64(31)) },
		func(x *corev1.Toleration) { x.TolerationSeconds = new(int64(30)) },
	}
	for i, vi := range variants {
		for j, vj := range variants {
			a, b := base, base
			vi(&a)
			vj(&b)
			if got, want := sameToleration(a, b), equality.Semantic.DeepEqual(a, b); got != want {
				t.Errorf("variants %d, %d: sameToleration %v, Semantic.DeepEqual %v", i, j, got, want)
			}
		}
	}
}
