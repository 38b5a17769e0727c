package nodeamplification

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/policy/policytest"
	"github.com/kadmit/kadmit/internal/testkit"
)

func nodeJSON(t testing.TB, annotations map[string]string, alloc corev1.ResourceList) string {
	t.Helper()
	return testkit.NodeJSON(t, "test-node", annotations, alloc)
}

func statusReq(op admissionv1.Operation, obj, old string) *admission.Request {
	return testkit.Request(op, testkit.Nodes, obj, old, testkit.Name("test-node"), testkit.SubResource("status"))
}

func milliCPU(m int64) corev1.ResourceList {
	return corev1.ResourceList{corev1.ResourceCPU: *resource.NewMilliQuantity(m, resource.DecimalSI)}
}

// TestHandleUpdateUpstreamTable ports
// TestNodeResourceAmplificationPlugin_handleNormalization
// (resource_amplification_test.go:32-147, v1.8.0). Upstream calls
// handleUpdate with no old node (no change detected); here the old node
// carries the same allocatable, which is the same case.
func TestHandleUpdateUpstreamTable(t *testing.T) {
	p, _ := New(Config{})
	for _, tc := range []struct {
		name         string
		annotations  map[string]string
		resource     corev1.ResourceName
		alloc        int64
		wantAlloc    int64
		wantOriginal int64 // milli cpu in raw-allocatable; -1: annotation absent
	}{
		{"normal", map[string]string{AnnotationRatio: `{"cpu": 1.5}`}, corev1.ResourceCPU, 1000, 1500, 1000},
		{"disable1", map[string]string{AnnotationRatio: `{"cpu": 0.5}`}, corev1.ResourceCPU, 1000, 1000, 1000},
		{"disable2", map[string]string{AnnotationRatio: `{"cpu": 1}`}, corev1.ResourceCPU, 1000, 1000, 1000},
		{"disable amplification will remove original allocatable", map[string]string{AnnotationRawAllocatable: "{}"}, corev1.ResourceCPU, 1000, 1000, -1},
		{"unsupported ratio will be ignored", map[string]string{AnnotationRatio: `{"eni": 2}`}, "eni", 1000, 1000, 1000},
		{"get original resource from annotation and amplify", map[string]string{AnnotationRatio: `{"cpu": 2}`, AnnotationRawAllocatable: `{"cpu":"1"}`}, corev1.ResourceCPU, 1000, 2000, 1000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := nodeJSON(t, tc.annotations, milliCPU(tc.alloc))
			out, v := policytest.Mutate(t, p, statusReq(admissionv1.Update, in, in))
			if !v.Allowed {
				t.Fatalf("denied: %+v", v)
			}
			if out == nil {
				out = []byte(in)
			}
			n := testkit.Decode[corev1.Node](t, out)
			if got := n.Status.Allocatable.Cpu().MilliValue(); got != tc.wantAlloc {
				t.Fatalf("allocatable cpu %dm, want %dm", got, tc.wantAlloc)
			}
			raw, ok := n.Annotations[AnnotationRawAllocatable]
			if tc.wantOriginal < 0 {
				if ok {
					t.Fatalf("raw allocatable %q left", raw)
				}
				return
			}
			var rl corev1.ResourceList
			if err := json.Unmarshal([]byte(raw), &rl); err != nil {
				t.Fatalf("raw allocatable %q: %v", raw, err)
			}
			if got := rl.Cpu().MilliValue(); got != tc.wantOriginal {
				t.Fatalf("raw cpu %dm, want %dm", got, tc.wantOriginal)
			}
		})
	}
}

// TestAdmitUpstreamTable ports TestNodeResourceAmplificationPlugin_Admit
// and _Validate (:149-210): empty nodes on CREATE and UPDATE are admitted
// unchanged.
func TestAdmitUpstreamTable(t *testing.T) {
	p, _ := New(Config{})
	for _, op := range []admissionv1.Operation{admissionv1.Create, admissionv1.Update} {
		ops, v := p.Mutate(context.Background(), statusReq(op, `{}`, `{}`))
		if !v.Allowed || len(ops) != 0 {
			t.Fatalf("%s: %+v %v", op, v, ops)
		}
	}
	// CREATE never amplifies (:65-66), nor does a plain nodes request
	// (mutating_handler.go:85-88 ignores all but nodes/status).
	in := nodeJSON(t, map[string]string{AnnotationRatio: `{"cpu":2}`}, milliCPU(1000))
	if ops, _ := p.Mutate(context.Background(), statusReq(admissionv1.Create, in, "")); len(ops) != 0 {
		t.Fatalf("CREATE changed the node: %v", ops)
	}
	r := statusReq(admissionv1.Update, in, in)
	r.SubResource = ""
	if ops, _ := p.Mutate(context.Background(), r); len(ops) != 0 {
		t.Fatalf("nodes (no subresource) changed: %v", ops)
	}
}

// TestResourceChangedUpstreamTable ports
// TestNodeResourceAmplificationPlugin_isSupportedResourceChanged
// (:212-349). The nil-node cases have no counterpart: an UPDATE always
// carries both objects.
func TestResourceChangedUpstreamTable(t *testing.T) {
	rl := func(kv ...string) map[corev1.ResourceName]resource.Quantity {
		out := map[corev1.ResourceName]resource.Quantity{}
		for i := 0; i < len(kv); i += 2 {
			out[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
		}
		return out
	}
	for _, tc := range []struct {
		name     string
		old, cur map[corev1.ResourceName]resource.Quantity
		want     bool
	}{
		{"resource is unchanged", rl("cpu", "4", "memory", "8Gi"), rl("cpu", "4", "memory", "8Gi"), false},
		{"add resource", rl("cpu", "4"), rl("cpu", "4", "memory", "8Gi"), true},
		{"remove resource", rl("cpu", "4", "memory", "8Gi"), rl("cpu", "4"), true},
		{"resource updated", rl("cpu", "4", "memory", "8Gi"), rl("cpu", "5", "memory", "8Gi"), true},
		{"unsupported resource changed", rl("cpu", "4", "ephemeral-storage", "80"), rl("cpu", "4", "ephemeral-storage", "100"), false},
		{"same value, other spelling", rl("cpu", "4"), rl("cpu", "4000m"), false},
	} {
		if got := resourcesChanged(supported, tc.old, tc.cur); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// upstreamHandleUpdate is upstream's handleUpdate
// (resource_amplification.go:93-165) on a typed node: the reference the
// differential test compares kadmit's JSONPatch with.
func upstreamHandleUpdate(oldNode, node *corev1.Node) {
	if node.Annotations[AnnotationRatio] == "" {
		delete(node.Annotations, AnnotationRawAllocatable)
		return
	}
	if node.Status.Allocatable == nil {
		return
	}
	changed := false
	for _, r := range supported {
		a, okA := oldNode.Status.Allocatable[r]
		b, okB := node.Status.Allocatable[r]
		if okA != okB || (okA && a.Cmp(b) != 0) {
			changed = true
		}
	}
	original := corev1.ResourceList{}
	if _, ok := node.Annotations[AnnotationRawAllocatable]; !ok || changed {
		for _, r := range supported {
			if q, ok := node.Status.Allocatable[r]; ok {
				original[r] = q
			}
		}
		if len(original) > 0 {
			b, _ := json.Marshal(original)
			node.Annotations[AnnotationRawAllocatable] = string(b)
		}
	} else {
		if err := json.Unmarshal([]byte(node.Annotations[AnnotationRawAllocatable]), &original); err != nil || original == nil {
			return
		}
	}
	var ratios map[corev1.ResourceName]float64
	if err := json.Unmarshal([]byte(node.Annotations[AnnotationRatio]), &ratios); err != nil {
		return
	}
	for _, r := range supported {
		ratio, ok := ratios[r]
		if !ok || ratio <= 1 {
			continue
		}
		q, ok := original[r]
		if !ok {
			continue
		}
		node.Status.Allocatable[r] = *resource.NewMilliQuantity(int64(float64(q.MilliValue())*ratio), q.Format)
	}
}

// TestMutateDifferential: on every node of the corpus (old node = the
// kubelet's previous post), the JSONPatch applied by the API server's
// library gives what upstream's typed handleUpdate gives, and touches
// nothing else.
func TestMutateDifferential(t *testing.T) {
	p, _ := New(Config{})
	q := func(kv ...string) corev1.ResourceList {
		out := corev1.ResourceList{}
		for i := 0; i < len(kv); i += 2 {
			out[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
		}
		return out
	}
	type tc struct{ in, old string }
	ratio := map[string]string{AnnotationRatio: `{"cpu":1.5,"memory":2.25}`}
	withRaw := func(raw string) map[string]string {
		return map[string]string{AnnotationRatio: `{"cpu":1.5,"memory":2.25}`, AnnotationRawAllocatable: raw}
	}
	corpus := map[string]tc{
		"first amplification":   {nodeJSON(t, ratio, q("cpu", "4", "memory", "8Gi", "pods", "110")), nodeJSON(t, ratio, q("cpu", "4", "memory", "8Gi", "pods", "110"))},
		"already amplified":     {nodeJSON(t, withRaw(`{"cpu":"4","memory":"8Gi"}`), q("cpu", "6", "memory", "18Gi")), nodeJSON(t, withRaw(`{"cpu":"4","memory":"8Gi"}`), q("cpu", "6", "memory", "18Gi"))},
		"kubelet posts new raw": {nodeJSON(t, withRaw(`{"cpu":"4","memory":"8Gi"}`), q("cpu", "3500m", "memory", "8Gi")), nodeJSON(t, withRaw(`{"cpu":"4","memory":"8Gi"}`), q("cpu", "6", "memory", "18Gi"))},
		"raw missing memory":    {nodeJSON(t, withRaw(`{"cpu":"4"}`), q("cpu", "6", "memory", "8Gi")), nodeJSON(t, withRaw(`{"cpu":"4"}`), q("cpu", "6", "memory", "8Gi"))},
		"ratio removed":         {nodeJSON(t, map[string]string{AnnotationRawAllocatable: `{"cpu":"4"}`, "other": "x"}, q("cpu", "4")), nodeJSON(t, nil, q("cpu", "4"))},
		"ratio empty string":    {nodeJSON(t, map[string]string{AnnotationRatio: "", AnnotationRawAllocatable: `{"cpu":"4"}`}, q("cpu", "4")), nodeJSON(t, nil, q("cpu", "4"))},
		"no annotations":        {nodeJSON(t, nil, q("cpu", "4")), nodeJSON(t, nil, q("cpu", "4"))},
		"no allocatable":        {`{"metadata":{"name":"n","annotations":{"node.koordinator.sh/resource-amplification-ratio":"{\"cpu\":2}"}},"status":{}}`, `{}`},
		"raw null":              {nodeJSON(t, withRaw(`null`), q("cpu", "6")), nodeJSON(t, withRaw(`null`), q("cpu", "6"))},
		"odd spellings":         {`{"metadata":{"name":"n","annotations":{"node.koordinator.sh/resource-amplification-ratio":"{\"cpu\":3}"}},"status":{"allocatable":{"cpu":"1500m","memory":"1e3"}},"spec":{"x":12345678901234567890}}`, `{}`},
		"escaped keys":          {`{"met\u0061data":{"annotations":{"node.koordinator.sh/resource-amplification-ratio":"{\"cpu\":2}"}},"status":{"allocatable":{"cpu":"1"}}}`, `{"status":{"allocatable":{"cpu":"1"}}}`},
	}
	for name, c := range corpus {
		t.Run(name, func(t *testing.T) {
			ops, v := p.Mutate(context.Background(), statusReq(admissionv1.Update, c.in, c.old))
			if !v.Allowed {
				t.Fatalf("denied: %+v", v)
			}
			out := policytest.Check(t, []byte(c.in), ops, func(n *corev1.Node) {
				var old corev1.Node
				_ = json.Unmarshal([]byte(c.old), &old)
				upstreamHandleUpdate(&old, n)
			})
			// Idempotent: a second call on the output (the API server may
			// reinvoke) changes nothing.
			if ops2, _ := p.Mutate(context.Background(), statusReq(admissionv1.Update, string(out), string(out))); len(ops2) != 0 {
				t.Fatalf("second call: %v", ops2)
			}
		})
	}
}

// TestErrors: unreadable annotations are 500 as upstream (the mutating
// handler answers Errored(500), mutating_handler.go:123-128); a node
// status kadmit cannot read is 400; a product out of range is left as is.
func TestErrors(t *testing.T) {
	p, _ := New(Config{})
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		ann  map[string]string
		code int32
		msg  string
	}{
		{"ratio not JSON", map[string]string{AnnotationRatio: `x`}, 500, "failed to unmarshal node resource amplification ratio"},
		{"ratio a string", map[string]string{AnnotationRatio: `{"cpu":"2"}`}, 500, "failed to unmarshal node resource amplification ratio"},
		{"raw not JSON", map[string]string{AnnotationRatio: `{"cpu":2}`, AnnotationRawAllocatable: `{`}, 500, "failed to unmarshal node raw allocatable"},
		{"raw out of range", map[string]string{AnnotationRatio: `{"cpu":2}`, AnnotationRawAllocatable: `{"cpu":"1e9999999"}`}, 500, "out of range"},
	} {
		in := nodeJSON(t, tc.ann, milliCPU(1000))
		_, v := p.Mutate(ctx, statusReq(admissionv1.Update, in, in))
		if v.Allowed || v.Code != tc.code || !strings.Contains(v.Message, tc.msg) {
			t.Errorf("%s: %+v", tc.name, v)
		}
	}
	bad := `{"metadata":{"annotations":{"node.koordinator.sh/resource-amplification-ratio":"{\"cpu\":2}"}},"status":{"allocatable":{"cpu":"1e9999999"}}}`
	if _, v := p.Mutate(ctx, statusReq(admissionv1.Update, bad, bad)); v.Allowed || v.Code != 400 || !strings.Contains(v.Message, "status.allocatable.cpu") {
		t.Errorf("out-of-range allocatable: %+v", v)
	}
	huge := nodeJSON(t, map[string]string{AnnotationRatio: `{"cpu":1e300}`}, milliCPU(1000))
	ops, v := p.Mutate(ctx, statusReq(admissionv1.Update, huge, huge))
	if !v.Allowed || len(v.Warnings) != 1 || !strings.Contains(v.Warnings[0], "out of range") {
		t.Fatalf("huge ratio: %+v", v)
	}
	for _, op := range ops {
		if strings.HasPrefix(op.Path, "/status") {
			t.Fatalf("huge ratio changed allocatable: %v", ops)
		}
	}
	if _, ok := multiplyMilli(resource.MustParse("1"), math.Inf(1)); ok {
		t.Fatal("infinite product accepted")
	}
}

// TestHooks: upstream's registration (pkg/webhook/node/mutating/
// webhooks.go:27): nodes/status CREATE and UPDATE, failurePolicy Ignore.
func TestHooks(t *testing.T) {
	p, _ := New(Config{})
	hs := p.Hooks()
	if len(hs) != 1 || hs[0].Path != "/mutate-node-status" || hs[0].Type != admission.Mutating ||
		string(hs[0].FailurePolicy) != "Ignore" || hs[0].Rules[0].Resources[0] != "nodes/status" || len(hs[0].Rules[0].Operations) != 2 {
		t.Fatalf("%+v", hs)
	}
}

// BenchmarkMutate: a kubelet status write on the benchmark node
// (internal/admission/testdata/node.json, with images and conditions) that
// carries the ratio annotation, already amplified (the steady state) and
// with new raw values (the kubelet's post).
//
//	go test ./internal/policy/koordinator/nodeamplification/ -run '^$' -bench Mutate
func BenchmarkMutate(b *testing.B) {
	base, err := os.ReadFile("../../../admission/testdata/node.json")
	if err != nil {
		b.Fatal(err)
	}
	var obj map[string]any
	if err := json.Unmarshal(base, &obj); err != nil {
		b.Fatal(err)
	}
	md := obj["metadata"].(map[string]any)
	ann, _ := md["annotations"].(map[string]any)
	if ann == nil {
		ann = map[string]any{}
		md["annotations"] = ann
	}
	ann[AnnotationRatio] = `{"cpu":1.5,"memory":1.5}`
	raw, _ := json.Marshal(obj)
	p, _ := New(Config{})
	first, v := policytest.Mutate(b, p, statusReq(admissionv1.Update, string(raw), string(raw)))
	if !v.Allowed || first == nil {
		b.Fatalf("%+v", v)
	}
	for _, c := range []struct{ name, in, old string }{
		{"steady", string(first), string(first)},
		{"kubelet-post", string(raw), string(first)},
	} {
		b.Run(c.name, func(b *testing.B) {
			req := statusReq(admissionv1.Update, c.in, c.old)
			b.SetBytes(int64(len(c.in)))
			b.ReportAllocs()
			for b.Loop() {
				if _, v := p.Mutate(context.Background(), req); !v.Allowed {
					b.Fatal(v.Message)
				}
			}
		})
	}
}

// FuzzMutate: whatever the annotations and allocatable hold, Mutate
// answers without panicking, and its operations apply to the node.
func FuzzMutate(f *testing.F) {
	f.Add(`{"cpu":1.5}`, `{"cpu":"1"}`, "4", "8Gi")
	f.Add(`{"memory":1e300}`, `null`, "1e3", "1Ei")
	f.Add(``, `{}`, "0", "0")
	p, _ := New(Config{})
	f.Fuzz(func(t *testing.T, ratio, raw, cpu, mem string) {
		ann := map[string]any{AnnotationRatio: ratio, AnnotationRawAllocatable: raw}
		obj, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": ann},
			"status": map[string]any{"allocatable": map[string]any{"cpu": cpu, "memory": mem}}})
		policytest.Mutate(t, p, statusReq(admissionv1.Update, string(obj), string(obj)))
	})
}
