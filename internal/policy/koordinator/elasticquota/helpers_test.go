package elasticquota

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/policy/policytest"
	"github.com/kadmit/kadmit/internal/testkit"
)

// fakeCache is a Cache over fixed data; the informer-backed one is exercised
// by TestInformerCache and the e2e tests against a real API server.
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

// add puts quota JSON into the snapshot as the informer would after an
// admitted write, replacing a quota of the same namespace and name.
func (f *fakeCache) add(t *testing.T, raw string) {
	t.Helper()
	q, err := Parse([]byte(raw))
	if err != nil {
		t.Fatal(err)
	}
	var all []*Quota
	for _, x := range f.snap.byKey {
		if x.Namespace != q.Namespace || x.Name != q.Name {
			all = append(all, x)
		}
	}
	f.snap = NewSnapshot(append(all, q))
}

func (f *fakeCache) remove(name string) {
	var all []*Quota
	for _, x := range f.snap.byKey {
		if x.Name != name {
			all = append(all, x)
		}
	}
	f.snap = NewSnapshot(all)
}

// qb builds an ElasticQuota as upstream's MakeQuota test wrapper does
// (koordinator v1.8.0 pkg/webhook/elasticquota/util.go:63-164).
type qb struct {
	name, ns                string
	labels, ann             map[string]string
	min, max, used          string // "cpu=4,memory=8Gi"; "-" is an absent list
	hasMin, hasMax, hasUsed bool
}

func mq(name string) *qb {
	return &qb{name: name, ns: "quotas", labels: map[string]string{}, ann: map[string]string{}}
}

func (q *qb) NS(ns string) *qb { q.ns = ns; return q }
func (q *qb) Min(s string) *qb { q.min, q.hasMin = s, true; return q }
func (q *qb) Max(s string) *qb { q.max, q.hasMax = s, true; return q }
func (q *qb) Used(s string) *qb {
	q.used, q.hasUsed = s, true
	return q
}
func (q *qb) Parent(n string) *qb { q.labels[LabelParent] = n; return q }
func (q *qb) Tree(id string) *qb  { q.labels[LabelTreeID] = id; return q }
func (q *qb) IsParent(b bool) *qb {
	if b {
		q.labels[LabelIsParent] = "true"
	} else {
		q.labels[LabelIsParent] = "false"
	}
	return q
}
func (q *qb) Label(k, v string) *qb { q.labels[k] = v; return q }
func (q *qb) Ann(k, v string) *qb   { q.ann[k] = v; return q }
func (q *qb) SharedWeight(s string) *qb {
	return q.Ann(AnnotationSharedWeight, rlJSON(s))
}
func (q *qb) Namespaces(ns ...string) *qb {
	b, _ := json.Marshal(ns)
	return q.Ann(AnnotationNamespaces, string(b))
}
func (q *qb) copy() *qb {
	c := *q
	c.labels, c.ann = map[string]string{}, map[string]string{}
	for k, v := range q.labels {
		c.labels[k] = v
	}
	for k, v := range q.ann {
		c.ann[k] = v
	}
	return &c
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

func rlJSON(s string) string {
	b, _ := json.Marshal(rl(s))
	return string(b)
}

func (q *qb) JSON() string {
	spec := map[string]any{}
	if q.hasMin {
		spec["min"] = rl(q.min)
	}
	if q.hasMax {
		spec["max"] = rl(q.max)
	}
	obj := map[string]any{
		"apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
		"metadata": map[string]any{"name": q.name, "namespace": q.ns, "labels": q.labels, "annotations": q.ann},
		"spec":     spec,
	}
	if q.hasUsed {
		obj["status"] = map[string]any{"used": rl(q.used)}
	}
	b, _ := json.Marshal(obj)
	return string(b)
}

func (q *qb) quota(t testing.TB) *Quota {
	t.Helper()
	p, err := Parse([]byte(q.JSON()))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// world is a policy over quotas and pods; nil quotas are skipped, as
// upstream's OnQuotaAdd(nil) is a no-op.
func world(t testing.TB, cfg Config, quotas []*qb, pods ...*corev1.Pod) (*Policy, *fakeCache) {
	t.Helper()
	var qs []*Quota
	for _, s := range quotas {
		if s != nil {
			qs = append(qs, s.quota(t))
		}
	}
	fc := &fakeCache{snap: NewSnapshot(qs), pods: pods}
	p, err := New(cfg, fc)
	if err != nil {
		t.Fatal(err)
	}
	return p, fc
}

func qreq(op admissionv1.Operation, obj, old string) *admission.Request {
	return testkit.Request(op, metav1.GroupVersionResource{Group: "scheduling.sigs.k8s.io", Version: "v1alpha1", Resource: "elasticquotas"}, obj, old)
}

func mkPod(ns, name string, labels map[string]string, requests string, phase corev1.PodPhase) *corev1.Pod {
	req := corev1.ResourceList{}
	for k, v := range rl(requests) {
		req[corev1.ResourceName(k)] = resource.MustParse(v)
	}
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec:   corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Requests: req}}}},
		Status: corev1.PodStatus{Phase: phase}}
}

func podReq(op admissionv1.Operation, p, old *corev1.Pod) *admission.Request {
	obj, _ := json.Marshal(p)
	var oldObj []byte
	if old != nil {
		oldObj, _ = json.Marshal(old)
	}
	return testkit.Request(op, testkit.Pods, obj, oldObj, testkit.Namespace(p.Namespace), testkit.Name(p.Name))
}

// verdict asserts v: want "" is allowed, otherwise a 400 whose message is
// want (upstream's error text).
func verdict(t *testing.T, v admission.Verdict, want string) {
	t.Helper()
	if want == "" {
		if !v.Allowed {
			t.Fatalf("denied (%d): %s", v.Code, v.Message)
		}
		return
	}
	if v.Allowed {
		t.Fatalf("allowed, want denial %q", want)
	}
	if v.Code != 400 || v.Message != want {
		t.Fatalf("got %d %q\nwant 400 %q", v.Code, v.Message, want)
	}
}

// wantErr asserts only allowed/denied (upstream tables that test err != nil).
func wantErr(t *testing.T, v admission.Verdict, denied bool) {
	t.Helper()
	if denied == v.Allowed {
		t.Fatalf("allowed=%v, want allowed=%v (%d %s)", v.Allowed, !denied, v.Code, v.Message)
	}
	if denied && v.Code != 400 {
		t.Fatalf("code %d, want 400: %s", v.Code, v.Message)
	}
}

// create runs the mutating then the validating hook on a CREATE, as the API
// server does, and on admission adds the stored object to the cache.
func create(t *testing.T, p *Policy, fc *fakeCache, q *qb) (string, admission.Verdict) {
	t.Helper()
	in := q.JSON()
	out, v := policytest.Mutate(t, p, qreq(admissionv1.Create, in, ""))
	if !v.Allowed {
		return in, v
	}
	if out != nil {
		in = string(out)
	}
	v = p.Validate(context.Background(), qreq(admissionv1.Create, in, ""))
	if v.Allowed && fc != nil {
		fc.add(t, in)
	}
	return in, v
}

// update validates old -> q and on admission stores q.
func update(t *testing.T, p *Policy, fc *fakeCache, old, q string) admission.Verdict {
	t.Helper()
	v := p.Validate(context.Background(), qreq(admissionv1.Update, q, old))
	if v.Allowed && fc != nil {
		fc.add(t, q)
	}
	return v
}

func del(t *testing.T, p *Policy, fc *fakeCache, q string) admission.Verdict {
	t.Helper()
	parsed, err := Parse([]byte(q))
	if err != nil {
		t.Fatal(err)
	}
	r := qreq(admissionv1.Delete, "", q)
	r.Object.Raw = nil
	r.Name = parsed.Name
	v := p.Validate(context.Background(), r)
	if v.Allowed && fc != nil {
		fc.remove(parsed.Name)
	}
	return v
}
