package colocation

import (
	"encoding/json"
	"fmt"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/policy/policytest"
	"github.com/kadmit/kadmit/internal/testkit"
)

// The facts of koordinator-sh/koordinator v1.8.0
// pkg/webhook/pod/mutating/cluster_colocation_profile_test.go
// (TestClusterColocationProfileMutatingPod, lines 70-204): the same pods,
// profiles and expected pods. Upstream's profiles also carry a strategic
// merge `patch` adding test-patch-label/test-patch-annotation; kadmit has no
// patch field (docs/policies.md, differences), so those two keys are left
// out of the inputs' profiles and the expected pods alike.

type fakeNS map[string]map[string]string

func (f fakeNS) NamespaceLabels(n string) (map[string]string, bool) { l, ok := f[n]; return l, ok }

type fakeClasses map[string]int32

var fakePreemption = corev1.PreemptionPolicy("fakePreemptionPolicy")

func (f fakeClasses) PriorityClass(name string) (int32, *corev1.PreemptionPolicy, error) {
	v, ok := f[name]
	if !ok {
		return 0, nil, apierrors.NewNotFound(schema.GroupResource{Group: "scheduling.k8s.io", Resource: "priorityclasses"}, name)
	}
	pp := fakePreemption
	return v, &pp, nil
}

// upstreamEnv is upstream's fake client: namespace default labelled
// enable-koordinator-colocation=true, PriorityClass koordinator-batch with
// value PriorityBatchValueMax (5999) and the fake preemption policy.
var (
	upstreamNS      = fakeNS{"default": {"enable-koordinator-colocation": "true"}}
	upstreamClasses = fakeClasses{"koordinator-batch": 5999}
)

func podReq(ns string, op admissionv1.Operation, raw, old []byte) *admission.Request {
	return testkit.Request(op, testkit.Pods, raw, old, testkit.Namespace(ns))
}

func q(s string) resource.Quantity { return resource.MustParse(s) }

func milli(n int64) resource.Quantity { return *resource.NewQuantity(n, resource.DecimalSI) }

func rl(kv ...any) corev1.ResourceList {
	out := corev1.ResourceList{}
	for i := 0; i < len(kv); i += 2 {
		out[corev1.ResourceName(kv[i].(string))] = kv[i+1].(resource.Quantity)
	}
	return out
}

func p32(v int32) *int32 { return &v }

// upstreamPod is the input pod of most upstream cases.
func upstreamPod() *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "test-pod-1",
			Labels: map[string]string{"koordinator-colocation-pod": "true"}},
		Spec: corev1.PodSpec{
			InitContainers: []corev1.Container{{Name: "test-init-container-a", Resources: corev1.ResourceRequirements{
				Limits: rl("cpu", q("500m"), "memory", q("1Gi")), Requests: rl("cpu", q("500m"), "memory", q("1Gi"))}}},
			Containers: []corev1.Container{{Name: "test-container-a", Resources: corev1.ResourceRequirements{
				Limits: rl("cpu", q("1"), "memory", q("4Gi")), Requests: rl("cpu", q("1"), "memory", q("4Gi"))}}},
			Overhead:      rl("cpu", q("1"), "memory", q("2Gi")),
			SchedulerName: "nonExistSchedulerName",
			Priority:      p32(5999),
		},
	}
}

// upstreamProfile is the profile of most upstream cases, without patch.
func upstreamProfile() Profile {
	return Profile{
		Name:                "test-profile",
		NamespaceSelector:   &metav1.LabelSelector{MatchLabels: map[string]string{"enable-koordinator-colocation": "true"}},
		Selector:            &metav1.LabelSelector{MatchLabels: map[string]string{"koordinator-colocation-pod": "true"}},
		Labels:              map[string]string{"testLabelA": "valueA"},
		Annotations:         map[string]string{"testAnnotationA": "valueA"},
		SchedulerName:       "koordinator-scheduler",
		QoSClass:            "BE",
		PriorityClassName:   "koordinator-batch",
		KoordinatorPriority: p32(1111),
	}
}

// translated is upstreamPod's resources as batch resources.
func translated(p *corev1.Pod) {
	p.Spec.InitContainers[0].Resources = corev1.ResourceRequirements{
		Limits: rl(string(BatchCPU), milli(500), string(BatchMemory), q("1Gi")), Requests: rl(string(BatchCPU), milli(500), string(BatchMemory), q("1Gi"))}
	p.Spec.Containers[0].Resources = corev1.ResourceRequirements{
		Limits: rl(string(BatchCPU), milli(1000), string(BatchMemory), q("4Gi")), Requests: rl(string(BatchCPU), milli(1000), string(BatchMemory), q("4Gi"))}
	p.Spec.Overhead = rl(string(BatchCPU), milli(1000), string(BatchMemory), q("2Gi"))
}

// applied is upstreamProfile's metadata and spec changes.
func applied(p *corev1.Pod) {
	p.Labels["testLabelA"] = "valueA"
	p.Labels[LabelPodQoS] = "BE"
	p.Labels[LabelPodPriority] = "1111"
	if p.Annotations == nil {
		p.Annotations = map[string]string{}
	}
	p.Annotations["testAnnotationA"] = "valueA"
	p.Spec.SchedulerName = "koordinator-scheduler"
	p.Spec.Priority = p32(5999)
	p.Spec.PriorityClassName = "koordinator-batch"
	pp := fakePreemption
	p.Spec.PreemptionPolicy = &pp
}

func TestUpstreamMutatingTable(t *testing.T) {
	pct := func(n int) *intstr.IntOrString { v := intstr.FromInt32(int32(n)); return &v }
	type tc struct {
		name    string
		pod     func(*corev1.Pod)
		profile func(*Profile)
		cfg     func(*Config)
		rand    int
		want    func(*corev1.Pod)
	}
	for _, c := range []tc{
		{name: "mutating pod", want: func(p *corev1.Pod) { applied(p); translated(p) }},
		{name: "set default request to the limit",
			pod: func(p *corev1.Pod) {
				p.Spec.InitContainers, p.Spec.Overhead = nil, nil
				p.Spec.Containers[0].Resources.Requests = nil
			},
			want: func(p *corev1.Pod) {
				applied(p)
				l := rl(string(BatchCPU), milli(1000), string(BatchMemory), q("4Gi"))
				p.Spec.Containers[0].Resources = corev1.ResourceRequirements{Limits: l, Requests: l.DeepCopy()}
			}},
		{name: "keep limit unset",
			pod: func(p *corev1.Pod) {
				p.Spec.InitContainers, p.Spec.Overhead = nil, nil
				p.Spec.Containers[0].Resources.Limits = nil
			},
			want: func(p *corev1.Pod) {
				applied(p)
				p.Spec.Containers[0].Resources = corev1.ResourceRequirements{Requests: rl(string(BatchCPU), milli(1000), string(BatchMemory), q("4Gi"))}
			}},
		{name: "mutating pod, percent 100", profile: func(pr *Profile) { pr.Probability = pct(100) },
			want: func(p *corev1.Pod) { applied(p); translated(p) }},
		// A matching profile skipped by its probability still leads to the
		// translation: the pod's priority 5999 is koord-batch.
		{name: "mutating pod, percent 0", profile: func(pr *Profile) { pr.Probability = pct(0) }, want: translated},
		{name: "mutating pod, percent 50, rand=70", profile: func(pr *Profile) { pr.Probability = pct(50) }, rand: 70, want: translated},
		{name: "mutating pod, percent 50, rand=30", profile: func(pr *Profile) { pr.Probability = pct(50) }, rand: 30,
			want: func(p *corev1.Pod) { applied(p); translated(p) }},
		{name: "mutating pod, skip update resource by profile annotation", profile: func(pr *Profile) { pr.SkipUpdateResources = true },
			want: applied},
		{name: "mutating pod, skip update resource by leveraging profile", cfg: func(c *Config) { c.SkipMutatingResources = true },
			want: applied},
		{name: "mutate pod labels according to labels",
			pod:     func(p *corev1.Pod) { p.Labels["label-key-to-load"] = "test-label-value" },
			profile: func(pr *Profile) { pr.LabelKeysMapping = map[string]string{"label-key-to-load": "label-key-to-store"} },
			want: func(p *corev1.Pod) {
				applied(p)
				translated(p)
				p.Labels["label-key-to-store"] = "test-label-value"
			}},
		{name: "mutate pod labels according to labels 1",
			pod: func(p *corev1.Pod) { p.Labels["label-key-to-load"] = "test-label-value" },
			profile: func(pr *Profile) {
				pr.Labels["koordinator.sh/scheduler-name"] = "koordinator-scheduler"
				pr.LabelKeysMapping = map[string]string{"label-key-to-load": "label-key-to-store", "label-key-to-load-not-exist": "label-key-to-store-not-exist"}
			},
			want: func(p *corev1.Pod) {
				applied(p)
				translated(p)
				p.Labels["koordinator.sh/scheduler-name"] = "koordinator-scheduler"
				p.Labels["label-key-to-store"] = "test-label-value"
				p.Labels["label-key-to-store-not-exist"] = ""
			}},
		{name: "mutate pod annotations according to annotations",
			pod: func(p *corev1.Pod) {
				p.Annotations = map[string]string{"annotation-key-to-load": "test-annotation-value"}
			},
			profile: func(pr *Profile) {
				pr.AnnotationKeysMapping = map[string]string{"annotation-key-to-load": "annotation-key-to-store"}
			},
			want: func(p *corev1.Pod) {
				applied(p)
				translated(p)
				p.Annotations["annotation-key-to-store"] = "test-annotation-value"
			}},
		{name: "mutate pod labels with labels and suffixes",
			pod: func(p *corev1.Pod) {
				p.Labels["label-key-to-load"] = "test-label-value"
				p.Labels["label-key-1"] = "label-value-1"
			},
			profile: func(pr *Profile) {
				pr.Labels["koordinator.sh/scheduler-name"] = "koordinator-scheduler"
				pr.LabelKeysMapping = map[string]string{"label-key-to-load": "label-key-to-store", "label-key-to-load-not-exist": "label-key-to-store-not-exist"}
				pr.LabelSuffixes = map[string]string{"label-key-1": "suffix", "label-key-to-store": "suffix-0", "suffix-label-key-1": "suffix-1"}
			},
			want: func(p *corev1.Pod) {
				applied(p)
				translated(p)
				p.Labels["koordinator.sh/scheduler-name"] = "koordinator-scheduler"
				p.Labels["label-key-1"] = "label-value-1suffix"
				p.Labels["label-key-to-store"] = "test-label-valuesuffix-0"
				p.Labels["label-key-to-store-not-exist"] = ""
			}},
	} {
		t.Run(c.name, func(t *testing.T) {
			in := upstreamPod()
			if c.pod != nil {
				c.pod(in)
			}
			pr := upstreamProfile()
			if c.profile != nil {
				c.profile(&pr)
			}
			cfg := Config{Profiles: []Profile{pr}}
			if c.cfg != nil {
				c.cfg(&cfg)
			}
			p, err := New(cfg, upstreamNS, WithPriorityClasses(upstreamClasses))
			if err != nil {
				t.Fatal(err)
			}
			p.profiles.intn = func(int) int { return c.rand }
			raw, _ := json.Marshal(in)
			ops, v := p.Mutate(t.Context(), podReq("default", admissionv1.Create, raw, nil))
			if !v.Allowed {
				t.Fatalf("denied: %+v", v)
			}
			// The full /mutate-pod also writes the extended-resource-spec
			// annotation after the profiles (mutating_handler.go:124-132).
			policytest.Check(t, raw, ops, func(got *corev1.Pod) { c.want(got); typedExtendedResources(got) })
		})
	}
}

func TestMutateErrors(t *testing.T) {
	pr := upstreamProfile()
	pr.PriorityClassName = "missing"
	p, err := New(Config{Profiles: []Profile{pr}}, upstreamNS, WithPriorityClasses(upstreamClasses))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(upstreamPod())
	// A failed PriorityClass Get is upstream's 500 (mutating_handler.go:89-91).
	_, v := p.Mutate(t.Context(), podReq("default", admissionv1.Create, raw, nil))
	if v.Allowed || v.Code != 500 || v.Message != `priorityclasses.scheduling.k8s.io "missing" not found` {
		t.Fatalf("verdict %+v", v)
	}
	// An undecodable pod is upstream's 400 (mutating_handler.go:68-71).
	_, v = p.Mutate(t.Context(), podReq("default", admissionv1.Create, []byte(`{"metadata":{"labels":[]}}`), nil))
	if v.Allowed || v.Code != 400 {
		t.Fatalf("verdict %+v", v)
	}
	bad := fmt.Sprintf(`{"metadata":{"labels":{"koordinator-colocation-pod":"true"}},"spec":{"priority":5000,"containers":[{"resources":{"requests":{"cpu":%q}}}]}}`, "1e9999999")
	p2, _ := New(Config{Profiles: []Profile{{Name: "x"}}}, nil)
	_, v = p2.Mutate(t.Context(), podReq("default", admissionv1.Create, []byte(bad), nil))
	if v.Allowed || v.Code != 400 {
		t.Fatalf("out-of-range quantity: verdict %+v", v)
	}
	// UPDATE and other operations are not mutated.
	if ops, v := p.Mutate(t.Context(), podReq("default", admissionv1.Update, raw, raw)); len(ops) != 0 || !v.Allowed {
		t.Fatalf("update: %v %+v", ops, v)
	}
}
