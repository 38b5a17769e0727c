package colocation

import (
	"encoding/json"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/policy/policytest"
)

type fakeNS map[string]map[string]string

func (f fakeNS) NamespaceLabels(n string) (map[string]string, bool) { l, ok := f[n]; return l, ok }

func podReq(ns, raw string) *admission.Request {
	return &admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: "u", Namespace: ns, Operation: admissionv1.Create,
		Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
		Object:   runtime.RawExtension{Raw: []byte(raw)},
	}}
}

func pod(t *testing.T, raw []byte) *corev1.Pod {
	t.Helper()
	var p corev1.Pod
	if err := json.Unmarshal(raw, &p); err != nil {
		t.Fatal(err)
	}
	return &p
}

var batch = Profile{
	Name:              "batch",
	NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"colocation": "on"}},
	Selector:          &metav1.LabelSelector{MatchLabels: map[string]string{"qos": "be"}},
	Labels:            map[string]string{"koordinator.sh/qosClass": "BE"},
	Annotations:       map[string]string{"note": "batch"},
	SchedulerName:     "koord-scheduler",
	PriorityClassName: "koord-batch",
	Tolerations:       []corev1.Toleration{{Key: "colocation", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
	NodeSelector:      map[string]string{"node-pool": "mixed"},
}

// mutate runs p.Mutate and returns the patched pod, nil when unchanged.
func mutate(t *testing.T, p *Policy, r *admission.Request) ([]byte, admission.Verdict) {
	t.Helper()
	return policytest.Mutate(t, p, r)
}

func TestMutate(t *testing.T) {
	second := Profile{Name: "second", Labels: map[string]string{"koordinator.sh/qosClass": "LS", "extra": "x"}, SchedulerName: "other"}
	p, err := New(Config{Profiles: []Profile{batch, second}}, fakeNS{"mixed": {"colocation": "on"}, "plain": {}})
	if err != nil {
		t.Fatal(err)
	}
	raw := `{"metadata":{"name":"p","labels":{"qos":"be"}},"spec":{"schedulerName":"default-scheduler","containers":[{"name":"c","image":"x"}]}}`
	out, v := mutate(t, p, podReq("mixed", raw))
	if !v.Allowed || out == nil {
		t.Fatalf("verdict %+v out %s", v, out)
	}
	got := pod(t, out)
	// batch comes first and wins qosClass and schedulerName; second only
	// adds its new label.
	if got.Labels["koordinator.sh/qosClass"] != "BE" || got.Labels["extra"] != "x" || got.Spec.SchedulerName != "koord-scheduler" ||
		got.Spec.PriorityClassName != "koord-batch" || got.Spec.NodeSelector["node-pool"] != "mixed" ||
		len(got.Spec.Tolerations) != 1 || got.Annotations["note"] != "batch" || got.Annotations[ProfilesAnnotation] != "batch,second" {
		t.Fatalf("pod %+v", got)
	}
	if again, _ := mutate(t, p, podReq("mixed", string(out))); again != nil {
		t.Fatalf("not idempotent: %s", again)
	}
	// Other namespace: only the selector-less profile applies.
	out, _ = mutate(t, p, podReq("plain", raw))
	got = pod(t, out)
	if got.Labels["koordinator.sh/qosClass"] != "LS" || got.Spec.SchedulerName != "other" || got.Annotations[ProfilesAnnotation] != "second" {
		t.Fatalf("pod in plain: %+v", got)
	}
}

func TestNoOverwriteUnlessAsked(t *testing.T) {
	prof := Profile{Name: "p", Labels: map[string]string{"tier": "batch"}, SchedulerName: "koord", PriorityClassName: "low", NodeSelector: map[string]string{"pool": "a"}}
	raw := `{"metadata":{"name":"p","labels":{"tier":"web"}},"spec":{"schedulerName":"mine","priorityClassName":"high","priority":1000,"nodeSelector":{"pool":"b"},"containers":[{"name":"c","image":"x"}]}}`
	p, _ := New(Config{Profiles: []Profile{prof}}, nil)
	out, _ := mutate(t, p, podReq("ns", raw))
	got := pod(t, out)
	if got.Labels["tier"] != "web" || got.Spec.SchedulerName != "mine" || got.Spec.PriorityClassName != "high" || got.Spec.NodeSelector["pool"] != "b" {
		t.Fatalf("pod overwritten: %+v", got)
	}
	prof.Overwrite = true
	p, _ = New(Config{Profiles: []Profile{prof}}, nil)
	out, _ = mutate(t, p, podReq("ns", raw))
	got = pod(t, out)
	if got.Labels["tier"] != "batch" || got.Spec.SchedulerName != "koord" || got.Spec.PriorityClassName != "low" || got.Spec.Priority != nil || got.Spec.NodeSelector["pool"] != "a" {
		t.Fatalf("pod not overwritten: %+v", got)
	}
}

func TestOfflineNamespaceSelector(t *testing.T) {
	p, _ := New(Config{Profiles: []Profile{batch}}, nil)
	out, v := mutate(t, p, podReq("mixed", `{"metadata":{"name":"p","labels":{"qos":"be"}},"spec":{"containers":[{"name":"c","image":"x"}]}}`))
	if out != nil || !v.Allowed || len(v.Warnings) != 1 || !strings.Contains(v.Warnings[0], "offline") {
		t.Fatalf("out %s verdict %+v", out, v)
	}
	// A selector on the name label works offline.
	byName := Profile{Name: "n", NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: "mixed"}}, Labels: map[string]string{"a": "b"}}
	p, _ = New(Config{Profiles: []Profile{byName}}, nil)
	out, _ = mutate(t, p, podReq("mixed", `{"metadata":{"name":"p"},"spec":{}}`))
	if got := pod(t, out); got.Labels["a"] != "b" {
		t.Fatalf("name selector did not match: %s", out)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"ok", Config{Profiles: []Profile{batch}}, ""},
		{"bad name", Config{Profiles: []Profile{{Name: "Bad"}}}, "profiles[0].name:"},
		{"dup", Config{Profiles: []Profile{{Name: "a"}, {Name: "a"}}}, `profiles[1].name: duplicate profile "a"`},
		{"bad selector", Config{Profiles: []Profile{{Name: "a", Selector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "k", Operator: "Near"}}}}}}, "profiles[0].selector:"},
		{"bad label value", Config{Profiles: []Profile{{Name: "a", Labels: map[string]string{"k": "-"}}}}, "profiles[0].labels[k]: value"},
		{"bad annotation key", Config{Profiles: []Profile{{Name: "a", Annotations: map[string]string{"a b": "x y"}}}}, `profiles[0].annotations: key "a b"`},
		{"bad toleration", Config{Profiles: []Profile{{Name: "a", Tolerations: []corev1.Toleration{{Operator: "Equal"}}}}}, "profiles[0].tolerations[0].operator"},
		{"bad scheduler", Config{Profiles: []Profile{{Name: "a", SchedulerName: "A B"}}}, "profiles[0].schedulerName"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.want)) {
				t.Fatalf("Validate() = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestHooks(t *testing.T) {
	p, _ := New(DefaultConfig(), nil)
	hs := p.Hooks()
	if len(hs) != 1 || hs[0].Path != "/mutate-pod" || hs[0].FailurePolicy != "Ignore" || hs[0].Type != admission.Mutating {
		t.Fatalf("hooks %+v", hs)
	}
}
