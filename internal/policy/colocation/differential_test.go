package colocation

import (
	"context"
	"fmt"
	"reflect"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/policy/lifespan"
	"github.com/kadmit/kadmit/internal/policy/policytest"
)

// profiles are the differential tests' profiles: batch (for qos: be pods in
// namespaces with colocation: on), one that overwrites, one with an empty
// selector that matches every pod, and 10 more that match by namespace
// name, each with its own label and annotation.
func profiles() []Profile {
	out := []Profile{batch,
		{Name: "overwrite", Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"qos": "be"}}, Overwrite: true,
			Labels: map[string]string{"koordinator.sh/qosClass": "BE"}, PriorityClassName: "koord-batch-2",
			Annotations: map[string]string{"note": "over", "h": "<&>"}},
		{Name: "everyone", Labels: map[string]string{"a.example/b-c": "set"}, NodeSelector: map[string]string{"zone": "z1"},
			Tolerations: []corev1.Toleration{{Key: "t", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: new(int64(9007199254740993))}}},
	}
	for i := range 10 {
		out = append(out, Profile{Name: fmt.Sprintf("p%d", i),
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: "mixed"}},
			Labels:            map[string]string{fmt.Sprintf("colocation.example.com/p%d", i): "on"},
			Annotations:       map[string]string{fmt.Sprintf("colocation.example.com/p%d", i): "applied"}})
	}
	return out
}

// slow applies the profiles to a typed pod the way the policy did before it
// spoke JSONPatch: on a corev1.Pod, field by field.
func slow(p *Policy, ns string) func(*corev1.Pod) {
	return func(pod *corev1.Pod) {
		nsLabels, _ := p.namespaceLabels(ns)
		podLabels := map[string]string{}
		for k, v := range pod.Labels {
			podLabels[k] = v
		}
		var applied string
		for i := range p.profiles {
			pr := &p.profiles[i]
			if !pr.ns.Matches(labels.Set(nsLabels)) || !pr.pod.Matches(labels.Set(podLabels)) {
				continue
			}
			if applied != "" {
				applied += ","
			}
			applied += pr.Name
			setMap(&pod.Labels, pr.Labels, pr.Overwrite)
			setMap(&pod.Annotations, pr.Annotations, pr.Overwrite)
			setMap(&pod.Spec.NodeSelector, pr.NodeSelector, pr.Overwrite)
			if cur := pod.Spec.SchedulerName; pr.SchedulerName != "" && cur != pr.SchedulerName && (cur == "" || cur == corev1.DefaultSchedulerName || pr.Overwrite) {
				pod.Spec.SchedulerName = pr.SchedulerName
			}
			if pr.PriorityClassName != "" && pod.Spec.PriorityClassName != pr.PriorityClassName && (pod.Spec.PriorityClassName == "" || pr.Overwrite) {
				pod.Spec.PriorityClassName, pod.Spec.Priority = pr.PriorityClassName, nil
			}
			for _, t := range pr.Tolerations {
				if !hasToleration(pod.Spec.Tolerations, t) {
					pod.Spec.Tolerations = append(pod.Spec.Tolerations, t)
				}
			}
		}
		if applied != "" {
			setMap(&pod.Annotations, map[string]string{ProfilesAnnotation: applied}, true)
		}
	}
}

func request(ns, raw string) *admission.Request {
	return &admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{UID: "u", Namespace: ns, Operation: admissionv1.Create,
		Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}, Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
		Object: runtime.RawExtension{Raw: []byte(raw)}}}
}

// TestMutateDifferential: on every pod of the corpus, in two namespaces,
// the patch applied by the API server's library gives what applying the
// profiles to a typed corev1.Pod gives, and changes nothing else.
func TestMutateDifferential(t *testing.T) {
	p, err := New(Config{Profiles: profiles()}, fakeNS{"mixed": {"colocation": "on", corev1.LabelMetadataName: "mixed"}, "plain": {}})
	if err != nil {
		t.Fatal(err)
	}
	for name, pod := range policytest.Pods(t) {
		for _, ns := range []string{"mixed", "plain"} {
			t.Run(name+"/"+ns, func(t *testing.T) {
				ops, v := p.Mutate(context.Background(), request(ns, pod))
				if !v.Allowed {
					t.Fatalf("denied: %+v", v)
				}
				policytest.Check(t, []byte(pod), ops, slow(p, ns))
			})
		}
	}
}

// TestChainDifferential is the differential test of a chain: lifespan then
// colocation on /mutate-pod, as kadmit registers them. The response patch
// (both policies' operations, colocation's made against lifespan's output)
// applied to the pod as sent gives the typed round trip of both changes.
func TestChainDifferential(t *testing.T) {
	ls, err := lifespan.New(lifespan.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	co, err := New(Config{Profiles: profiles()}, fakeNS{"mixed": {"colocation": "on", corev1.LabelMetadataName: "mixed"}})
	if err != nil {
		t.Fatal(err)
	}
	whs, err := admission.NewWebhooks(append(ls.Hooks(), co.Hooks()...))
	if err != nil || len(whs) != 1 {
		t.Fatalf("webhooks %v: %v", whs, err)
	}
	for name, pod := range policytest.Pods(t) {
		t.Run(name, func(t *testing.T) {
			out, err := whs[0].Review(context.Background(), request("mixed", pod))
			if err != nil {
				t.Fatal(err)
			}
			if !out.Response.Allowed || out.Matched != 2 {
				t.Fatalf("response %+v, %d matched", out.Response, out.Matched)
			}
			got := policytest.Check(t, []byte(pod), out.Patch, func(pod *corev1.Pod) {
				lifespanSlow(t, pod)
				slow(co, "mixed")(pod)
			})
			if !jsonEqual(t, got, out.Object) {
				t.Fatalf("Outcome.Object %s\ndiffers from the patched pod %s", out.Object, got)
			}
		})
	}
}

func jsonEqual(t *testing.T, a, b []byte) bool {
	return reflect.DeepEqual(policytest.Exact(t, a), policytest.Exact(t, b))
}

// lifespanSlow is lifespan's change on a typed pod: the tolerations
// lifespan.Tolerations wants that the pod lacks (compared on key, operator,
// with "" as Equal, value and effect), appended.
func lifespanSlow(t *testing.T, pod *corev1.Pod) {
	var requested *string
	if v, ok := pod.Labels[lifespan.LabelRequested]; ok {
		requested = &v
	}
	want, err := lifespan.Tolerations(requested, lifespan.DefaultConfig().Max)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range want {
		found := false
		for _, h := range pod.Spec.Tolerations {
			op := h.Operator
			if op == "" {
				op = corev1.TolerationOpEqual
			}
			found = found || h.Key == w.Key && op == w.Operator && h.Value == w.Value && h.Effect == w.Effect
		}
		if !found {
			pod.Spec.Tolerations = append(pod.Spec.Tolerations, w)
		}
	}
}
