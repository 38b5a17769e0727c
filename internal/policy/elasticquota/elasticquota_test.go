package elasticquota

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/policy/policytest"
)

// fakeCache is a Cache over fixed data; the informer-backed one is exercised
// by the e2e tests against a real API server.
type fakeCache struct {
	snap *Snapshot
	pods []*corev1.Pod
}

func (f *fakeCache) Snapshot() *Snapshot { return f.snap }
func (f *fakeCache) PodsWithQuotaLabel(n string) []*corev1.Pod {
	var out []*corev1.Pod
	for _, p := range f.pods {
		if p.Labels[LabelQuotaName] == n {
			out = append(out, p)
		}
	}
	return out
}
func (f *fakeCache) PodsInNamespace(ns string) []*corev1.Pod {
	var out []*corev1.Pod
	for _, p := range f.pods {
		if p.Namespace == ns {
			out = append(out, p)
		}
	}
	return out
}

type qspec struct {
	name, ns, parent, tree string
	isParent               *bool
	min, max               string // "cpu=4,memory=8Gi"
	namespaces             []string
}

func rl(s string) map[string]string {
	out := map[string]string{}
	if s == "" {
		return out
	}
	for _, kv := range strings.Split(s, ",") {
		k, v, _ := strings.Cut(kv, "=")
		out[k] = v
	}
	return out
}

func (q qspec) json() string {
	labels := map[string]string{}
	if q.parent != "" {
		labels[LabelParent] = q.parent
	}
	if q.tree != "" {
		labels[LabelTreeID] = q.tree
	}
	if q.isParent != nil {
		labels[LabelIsParent] = fmt.Sprint(*q.isParent)
	}
	ann := map[string]string{}
	if q.namespaces != nil {
		b, _ := json.Marshal(q.namespaces)
		ann[AnnotationNamespaces] = string(b)
	}
	ns := q.ns
	if ns == "" {
		ns = "quotas"
	}
	obj := map[string]any{
		"apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
		"metadata": map[string]any{"name": q.name, "namespace": ns, "labels": labels, "annotations": ann},
		"spec":     map[string]any{"min": rl(q.min), "max": rl(q.max)},
	}
	b, _ := json.Marshal(obj)
	return string(b)
}

func (q qspec) quota(t *testing.T) *Quota {
	t.Helper()
	p, err := Parse([]byte(q.json()))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

var yes, no = ptr(true), ptr(false)

func ptr[T any](v T) *T { return &v }

// tree: root <- org (parent, min cpu 10) <- team-a (min 4), team-b (min 4)
func tree(t *testing.T) []qspec {
	return []qspec{
		{name: "org", parent: DefaultRootQuota, tree: "t1", isParent: yes, min: "cpu=10,memory=20Gi", max: "cpu=20,memory=40Gi"},
		{name: "team-a", parent: "org", tree: "t1", isParent: no, min: "cpu=4", max: "cpu=8,memory=16Gi", namespaces: []string{"a1", "a2"}},
		{name: "team-b", parent: "org", tree: "t1", isParent: no, min: "cpu=4", max: "cpu=8,memory=16Gi"},
		{name: "leaf", parent: DefaultRootQuota, isParent: no, max: "cpu=2"},
	}
}

func newPolicy(t *testing.T, specs []qspec, pods ...*corev1.Pod) (*Policy, *fakeCache) {
	t.Helper()
	var qs []*Quota
	for _, s := range specs {
		qs = append(qs, s.quota(t))
	}
	fc := &fakeCache{snap: NewSnapshot(qs), pods: pods}
	p, err := New(DefaultConfig(), fc)
	if err != nil {
		t.Fatal(err)
	}
	return p, fc
}

func qreq(op admissionv1.Operation, obj, old string) *admission.Request {
	r := &admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{UID: "u", Operation: op,
		Resource: metav1.GroupVersionResource{Group: "scheduling.sigs.k8s.io", Version: "v1alpha1", Resource: "elasticquotas"}}}
	r.Object = runtime.RawExtension{Raw: []byte(obj)}
	if old != "" {
		r.OldObject = runtime.RawExtension{Raw: []byte(old)}
	}
	return r
}

func TestValidateTopology(t *testing.T) {
	base := tree(t)
	for _, tc := range []struct {
		name string
		op   admissionv1.Operation
		q    qspec
		old  *qspec
		code int32
		msg  string
	}{
		{"new child fits", admissionv1.Create, qspec{name: "team-c", parent: "org", tree: "t1", min: "cpu=2", max: "cpu=8,memory=1Gi"}, nil, 0, ""},
		{"negative max", admissionv1.Create, qspec{name: "x", max: "cpu=-1"}, nil, 400, "spec.max.cpu must be >= 0"},
		{"min not in max", admissionv1.Create, qspec{name: "x", min: "cpu=1", max: "memory=1Gi"}, nil, 403, "spec.min.cpu has no matching spec.max.cpu"},
		{"min over max", admissionv1.Create, qspec{name: "x", min: "cpu=3", max: "cpu=2"}, nil, 403, "spec.min.cpu 3 is more than spec.max.cpu 2"},
		{"parent missing", admissionv1.Create, qspec{name: "x", parent: "nope", max: "cpu=1"}, nil, 403, `parent ElasticQuota "nope" does not exist`},
		{"parent not a parent", admissionv1.Create, qspec{name: "x", parent: "team-a", tree: "t1", max: "cpu=1,memory=1Gi"}, nil, 403, "parent team-a is not a parent quota"},
		{"max keys differ", admissionv1.Create, qspec{name: "x", parent: "org", tree: "t1", max: "cpu=1"}, nil, 403, "spec.max resources [cpu] must equal its parent org's [cpu memory]"},
		{"min key in parent", admissionv1.Create, qspec{name: "x", parent: "org", tree: "t1", min: "memory=1Gi", max: "cpu=1,memory=2Gi"}, nil, 0, ""},
		{"min key not in parent", admissionv1.Create, qspec{name: "x", parent: "org", tree: "t1", min: "pods=1", max: "cpu=1,memory=2Gi,pods=2"}, nil, 403, "spec.max resources [cpu memory pods] must equal"},
		{"siblings over parent min", admissionv1.Create, qspec{name: "x", parent: "org", tree: "t1", min: "cpu=3", max: "cpu=8,memory=1Gi"}, nil, 403,
			"the min cpu of org's children would sum to 11, more than its min 10"},
		{"update raises own min over parent", admissionv1.Update, qspec{name: "team-a", parent: "org", tree: "t1", isParent: no, min: "cpu=7", max: "cpu=8,memory=16Gi", namespaces: []string{"a1", "a2"}},
			&base[1], 403, "would sum to 11"},
		{"tree id differs from parent", admissionv1.Create, qspec{name: "x", parent: "org", tree: "t2", max: "cpu=1,memory=1Gi"}, nil, 403, `label quota.scheduling.koordinator.sh/tree-id "t2" must equal its parent org's "t1"`},
		{"tree id immutable", admissionv1.Update, qspec{name: "leaf", parent: DefaultRootQuota, tree: "new", isParent: no, max: "cpu=2"}, &base[3], 403, "tree-id is immutable"},
		{"is-parent false with children", admissionv1.Update, qspec{name: "org", parent: DefaultRootQuota, tree: "t1", isParent: no, min: "cpu=10,memory=20Gi", max: "cpu=20,memory=40Gi"},
			&base[0], 403, "cannot be false while it has children (team-a, team-b)"},
		{"children over own min", admissionv1.Update, qspec{name: "org", parent: DefaultRootQuota, tree: "t1", isParent: yes, min: "cpu=7,memory=20Gi", max: "cpu=20,memory=40Gi"},
			&base[0], 403, "its children's min cpu sum to 8, more than its min 7"},
		{"namespace claimed", admissionv1.Create, qspec{name: "x", max: "cpu=1", namespaces: []string{"a2"}}, nil, 403, `namespace "a2" is already claimed by ElasticQuota team-a`},
		{"own claim kept on update", admissionv1.Update, base[1], &base[1], 0, ""},
		{"own parent", admissionv1.Create, qspec{name: "x", parent: "x", max: "cpu=1"}, nil, 403, "cannot be its own parent"},
		{"cycle", admissionv1.Update, qspec{name: "org", parent: "team-a", tree: "t1", isParent: yes, min: "cpu=10,memory=20Gi", max: "cpu=20,memory=40Gi"}, &base[0], 403, "is its own descendant"},
		{"root unchanged update", admissionv1.Update, qspec{name: DefaultRootQuota, max: "cpu=100"}, &qspec{name: DefaultRootQuota, max: "cpu=100"}, 0, ""},
		{"root changed", admissionv1.Update, qspec{name: DefaultRootQuota, max: "cpu=200"}, &qspec{name: DefaultRootQuota, max: "cpu=100"}, 403, "is built in and cannot be changed"},
		{"system changed", admissionv1.Update, qspec{name: DefaultSystemQuota, max: "cpu=1", tree: "x"}, &qspec{name: DefaultSystemQuota, max: "cpu=1"}, 403, "is built in"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, fc := newPolicy(t, base)
			before := fc.snap
			beforeAll := fmt.Sprint(before.All())
			old := ""
			if tc.old != nil {
				old = tc.old.json()
			}
			v := p.Validate(context.Background(), qreq(tc.op, tc.q.json(), old))
			if tc.code == 0 && !v.Allowed {
				t.Fatalf("denied: %+v", v)
			}
			if tc.code != 0 && (v.Allowed || v.Code != tc.code || !strings.Contains(v.Message, tc.msg)) {
				t.Fatalf("verdict %+v, want %d %q", v, tc.code, tc.msg)
			}
			// Validation never changes the cached tree, allowed or not.
			if fc.snap != before || fmt.Sprint(fc.snap.All()) != beforeAll {
				t.Fatal("validation changed the cached snapshot")
			}
		})
	}
}

func pod(ns, name string, labels map[string]string, cpu string, phase corev1.PodPhase) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu)}}}}},
		Status: corev1.PodStatus{Phase: phase},
	}
}

func TestDelete(t *testing.T) {
	del := func(p *Policy, name string) admission.Verdict {
		r := qreq(admissionv1.Delete, "", (qspec{name: name}).json())
		r.Name = name
		return p.Validate(context.Background(), r)
	}
	p, _ := newPolicy(t, tree(t),
		pod("a1", "p1", nil, "1", corev1.PodRunning),
		pod("x", "p2", map[string]string{LabelQuotaName: "team-a"}, "1", corev1.PodPending),
		pod("x", "p3", map[string]string{LabelQuotaName: "team-a"}, "1", corev1.PodRunning),
		pod("x", "done", map[string]string{LabelQuotaName: "team-b"}, "1", corev1.PodSucceeded),
	)
	if v := del(p, "org"); v.Allowed || !strings.Contains(v.Message, "has 2 child quota(s) (team-a, team-b)") {
		t.Fatalf("org: %+v", v)
	}
	if v := del(p, "team-a"); v.Allowed || !strings.Contains(v.Message, "has 3 bound pod(s) (a1/p1, x/p2)") {
		t.Fatalf("team-a: %+v", v)
	}
	if v := del(p, "team-b"); !v.Allowed {
		t.Fatalf("team-b with only finished pods: %+v", v)
	}
	if v := del(p, DefaultRootQuota); v.Allowed || !strings.Contains(v.Message, "cannot be deleted") {
		t.Fatalf("root: %+v", v)
	}
	if v := del(p, DefaultSystemQuota); v.Allowed {
		t.Fatalf("system: %+v", v)
	}
}

func podReq(ns string, p *corev1.Pod) *admission.Request {
	raw, _ := json.Marshal(p)
	return &admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{UID: "u", Namespace: ns, Operation: admissionv1.Create,
		Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"}, Object: runtime.RawExtension{Raw: raw}}}
}

func TestValidatePod(t *testing.T) {
	specs := append(tree(t), qspec{name: "home", ns: "h", max: "cpu=1"})
	p, _ := newPolicy(t, specs,
		pod("a1", "p1", nil, "3", corev1.PodRunning),
		pod("x", "p2", map[string]string{LabelQuotaName: "team-a"}, "2", corev1.PodPending),
		pod("a2", "gone", nil, "5", corev1.PodFailed),
	)
	ctx := context.Background()
	for _, tc := range []struct {
		name, ns string
		pod      *corev1.Pod
		msg      string
	}{
		{"fits by namespace claim", "a2", pod("a2", "n", nil, "3", ""), ""},
		{"over by namespace claim", "a2", pod("a2", "n", nil, "3500m", ""), "pod requests cpu 3500m but ElasticQuota team-a has 5 of max 8 in use"},
		{"over by label", "other", pod("other", "n", map[string]string{LabelQuotaName: "team-a"}, "4", ""), "ElasticQuota team-a has 5 of max 8"},
		{"label wins over namespace", "a1", pod("a1", "n", map[string]string{LabelQuotaName: "team-b"}, "8", ""), ""},
		{"quota living in the namespace", "h", pod("h", "n", nil, "2", ""), "ElasticQuota home has 0 of max 1"},
		{"unbound pod", "free", pod("free", "n", nil, "100", ""), ""},
		{"unknown quota", "free", pod("free", "n", map[string]string{LabelQuotaName: "nope"}, "100", ""), ""},
		{"resource not in max", "h", &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "m"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c",
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Ti")}}}}}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := p.ValidatePod(ctx, podReq(tc.ns, tc.pod))
			if tc.msg == "" && !v.Allowed || tc.msg != "" && (v.Allowed || v.Code != 403 || !strings.Contains(v.Message, tc.msg)) {
				t.Fatalf("verdict %+v, want %q", v, tc.msg)
			}
		})
	}
}

// mutate runs p.Mutate and returns the patched quota, nil when unchanged.
func mutate(t *testing.T, p *Policy, r *admission.Request) ([]byte, admission.Verdict) {
	t.Helper()
	return policytest.Mutate(t, p, r)
}

func TestMutate(t *testing.T) {
	p, _ := newPolicy(t, tree(t))
	out, v := mutate(t, p, qreq(admissionv1.Create, (qspec{name: "new", parent: "org", max: "cpu=3"}).json(), ""))
	if !v.Allowed || out == nil {
		t.Fatalf("verdict %+v out %s", v, out)
	}
	q, err := Parse(out)
	if err != nil {
		t.Fatal(err)
	}
	if q.TreeID != "t1" || q.SharedWeight.Cpu().String() != "3" {
		t.Fatalf("quota %+v", q)
	}
	if again, _ := mutate(t, p, qreq(admissionv1.Create, string(out), "")); again != nil {
		t.Fatalf("not idempotent: %s", again)
	}
	out, _ = mutate(t, p, qreq(admissionv1.Create, (qspec{name: "top", max: "cpu=3"}).json(), ""))
	if q, _ := Parse(out); q.Parent != DefaultRootQuota || q.TreeID != "" {
		t.Fatalf("top-level quota %+v", q)
	}
	if out, _ := mutate(t, p, qreq(admissionv1.Create, (qspec{name: DefaultRootQuota}).json(), "")); out != nil {
		t.Fatalf("root mutated: %s", out)
	}
	if _, v := mutate(t, p, qreq(admissionv1.Create, `{"metadata":{"name":"x","labels":{"`+LabelIsParent+`":"maybe"}}}`, "")); v.Code != 400 {
		t.Fatalf("bad is-parent: %+v", v)
	}
}

// typedQuota is an ElasticQuota as its Go type would decode it, for the
// differential test's typed round trip.
type typedQuota struct {
	APIVersion        string `json:"apiVersion,omitempty"`
	Kind              string `json:"kind,omitempty"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              struct {
		Min corev1.ResourceList `json:"min,omitempty"`
		Max corev1.ResourceList `json:"max,omitempty"`
	} `json:"spec"`
}

// TestMutateDifferential: the patch applied by the API server's library
// gives what defaulting the typed quota gives, and changes nothing else.
func TestMutateDifferential(t *testing.T) {
	p, _ := newPolicy(t, tree(t))
	corpus := map[string]string{
		"child of org": (qspec{name: "new", parent: "org", max: "cpu=3"}).json(),
		"top level":    (qspec{name: "top", max: "cpu=3,memory=9007199254740993"}).json(),
		"no metadata labels": `{"apiVersion":"scheduling.sigs.k8s.io/v1alpha1","kind":"ElasticQuota","metadata":{"name":"n","annotations":{"h":"<&>"}},` +
			`"spec":{"max":{"cpu":"2"}},"status":{"n":12345678901234567890}}`,
		"labels null":  `{"metadata":{"name":"n","labels":null,"annotations":null,"generation":9007199254740993},"spec":null}`,
		"weight given": `{"metadata":{"name":"n","labels":{"` + LabelParent + `":"org","a/b~c":"ü"},"annotations":{"` + AnnotationSharedWeight + `":"{}"}},"spec":{}}`,
	}
	for name, in := range corpus {
		t.Run(name, func(t *testing.T) {
			ops, v := p.Mutate(context.Background(), qreq(admissionv1.Create, in, ""))
			if !v.Allowed {
				t.Fatalf("denied: %+v", v)
			}
			policytest.Check(t, []byte(in), ops, func(q *typedQuota) {
				if q.Labels == nil {
					q.Labels = map[string]string{}
				}
				if q.Labels[LabelParent] == "" {
					q.Labels[LabelParent] = DefaultRootQuota
				}
				if q.Labels[LabelParent] == "org" && q.Labels[LabelTreeID] == "" {
					q.Labels[LabelTreeID] = "t1"
				}
				if _, ok := q.Annotations[AnnotationSharedWeight]; !ok {
					if q.Annotations == nil {
						q.Annotations = map[string]string{}
					}
					max := q.Spec.Max
					if max == nil {
						max = corev1.ResourceList{}
					}
					q.Annotations[AnnotationSharedWeight] = string(policytest.Marshal(t, max))
				}
			})
		})
	}
}

func TestOffline(t *testing.T) {
	p, err := New(DefaultConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	v := p.Validate(context.Background(), qreq(admissionv1.Create, (qspec{name: "x", parent: "missing", max: "cpu=1"}).json(), ""))
	if !v.Allowed || len(v.Warnings) != 1 {
		t.Fatalf("offline: %+v", v)
	}
	v = p.Validate(context.Background(), qreq(admissionv1.Create, (qspec{name: "x", min: "cpu=2", max: "cpu=1"}).json(), ""))
	if v.Allowed {
		t.Fatal("per-object check skipped offline")
	}
	if len(p.Hooks()) != 3 {
		t.Fatalf("hooks: %d", len(p.Hooks()))
	}
	off := false
	p2, _ := New(Config{RootQuota: "r", SystemQuota: "s", PodCheck: &off}, nil)
	if len(p2.Hooks()) != 2 {
		t.Fatal("podCheck false still adds the pod hook")
	}
	if err := (Config{RootQuota: "r", SystemQuota: "r"}).Validate(); err == nil {
		t.Fatal("same root and system accepted")
	}
}

// TestValidatePodStopsWhenCancelled: the sum over a quota's pods ends once
// the handler has given up on the review, and says so (500), instead of
// finishing work nobody waits for.
func TestValidatePodStopsWhenCancelled(t *testing.T) {
	var pods []*corev1.Pod
	for i := range 1000 {
		pods = append(pods, pod("a1", fmt.Sprintf("p%d", i), nil, "1m", corev1.PodRunning))
	}
	p, _ := newPolicy(t, tree(t), pods...)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	v := p.ValidatePod(ctx, podReq("a1", pod("a1", "n", nil, "1", "")))
	if v.Allowed || v.Code != 500 || !strings.Contains(v.Message, "context canceled") {
		t.Fatalf("verdict %+v, want a 500 naming the cancellation", v)
	}
	if v := p.ValidatePod(context.Background(), podReq("a1", pod("a1", "n", nil, "1", ""))); !v.Allowed {
		t.Fatalf("uncancelled: %+v", v)
	}
}

// TestValidatePodOutOfRange: an out-of-range request is a 400 naming the
// field, before the quota is looked at.
func TestValidatePodOutOfRange(t *testing.T) {
	p, _ := newPolicy(t, tree(t))
	raw := `{"metadata":{"name":"n","namespace":"a1"},"spec":{"initContainers":[{"name":"i","resources":{"limits":{"memory":"1e9999999"}}}]}}`
	r := podReq("a1", pod("a1", "n", nil, "1", ""))
	r.Object.Raw = []byte(raw)
	v := p.ValidatePod(context.Background(), r)
	if v.Allowed || v.Code != 400 || !strings.Contains(v.Message, "spec.initContainers[0].resources.limits.memory: quantity 1e9999999 is out of range") {
		t.Fatalf("verdict %+v", v)
	}
}
