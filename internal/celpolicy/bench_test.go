package celpolicy

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"

	kadmission "github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/fixture"
)

func benchEngine(b *testing.B, dir string) *Engine {
	set, err := Load("../../examples/cel/" + dir + "/policy.yaml")
	if err != nil {
		b.Fatal(err)
	}
	e, err := New(set, Options{})
	if err != nil {
		b.Fatal(err)
	}
	return e
}

var benchPod = []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"web-1","namespace":"shop","labels":{"app":"web"}},"spec":{"containers":[{"name":"c","image":"nginx","resources":{"requests":{"cpu":"100m"}}}]}}`)

func benchReq() *Request {
	return &Request{Kind: schema.GroupVersionKind{Version: "v1", Kind: "Pod"}, Resource: schema.GroupVersionResource{Version: "v1", Resource: "pods"},
		Name: "web-1", Namespace: "shop", Operation: admission.Create, Object: benchPod}
}

// BenchmarkValidatePodName: one pod through examples/cel/pod-name.
func BenchmarkValidatePodName(b *testing.B) {
	e := benchEngine(b, "pod-name")
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		d, err := e.Validate(ctx, benchReq())
		if err != nil || !d.Allowed {
			b.Fatal(err, d)
		}
	}
}

// BenchmarkMutateLifespan: one pod through examples/cel/lifespan's MAP.
func BenchmarkMutateLifespan(b *testing.B) {
	e := benchEngine(b, "lifespan")
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		d, err := e.Mutate(ctx, benchReq())
		if err != nil || !d.Allowed || !d.Changed {
			b.Fatal(err, d)
		}
	}
}

// realisticPod is `make bench`'s pod (fixture.DeploymentPodJSON, about
// 4.6 KB as JSON).
func realisticPod(*testing.B) []byte { return fixture.DeploymentPodJSON() }

// benchHooks serves review through the webhook of path built from the
// policies of dirs (examples/cel), as `kadmit serve --policies` does: one
// hook per policy, each evaluating its own.
func benchHooks(b *testing.B, path string, dirs ...string) {
	var files []string
	for _, d := range dirs {
		files = append(files, "../../examples/cel/"+d+"/policy.yaml")
	}
	whs, _, err := LoadWebhooks(Options{}, files...)
	if err != nil {
		b.Fatal(err)
	}
	var wh *kadmission.Webhook
	for _, w := range whs {
		if w.Path == path {
			wh = w
		}
	}
	if wh == nil {
		b.Fatalf("no webhook on %s", path)
	}
	gvk := metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}
	gvr := metav1.GroupVersionResource{Version: "v1", Resource: "pods"}
	req := &kadmission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: "u", Kind: gvk, Resource: gvr, RequestKind: &gvk, RequestResource: &gvr,
		Namespace: "shop", Operation: admissionv1.Create,
		Object: runtime.RawExtension{Raw: realisticPod(b)},
	}}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		out, err := wh.Review(ctx, req)
		if err != nil || !out.Response.Allowed {
			b.Fatal(err, out.Response)
		}
	}
}

// BenchmarkValidatePodNameRealistic: the realistic pod through the
// pod-name VAP's hook, as `make bench`'s "kadmit declared VAP" server.
func BenchmarkValidatePodNameRealistic(b *testing.B) {
	benchHooks(b, ValidatePath, "pod-name")
}

// BenchmarkValidateThreePolicies: the realistic pod through three VAPs'
// hooks on one path.
func BenchmarkValidateThreePolicies(b *testing.B) {
	benchHooks(b, ValidatePath, "pod-name", "docs-deny-privileged", "gatekeeper-requiredlabels")
}

// fiveMAPs are five trivial MutatingAdmissionPolicies on pods, each
// setting one label: issue 20's "five trivial MAPs".
func fiveMAPs(tb testing.TB) string {
	var docs strings.Builder
	for i := 1; i <= 5; i++ {
		fmt.Fprintf(&docs, `---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicy
metadata: {name: label-%[1]d}
spec:
  reinvocationPolicy: Never
  failurePolicy: Fail
  matchConstraints:
    resourceRules: [{apiGroups: [""], apiVersions: ["v1"], operations: ["CREATE"], resources: ["pods"]}]
  mutations:
  - patchType: ApplyConfiguration
    applyConfiguration:
      expression: "Object{metadata: Object.metadata{labels: {'m%[1]d': 'x'}}}"
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicyBinding
metadata: {name: label-%[1]d}
spec: {policyName: label-%[1]d}
`, i)
	}
	f := filepath.Join(tb.TempDir(), "maps.yaml")
	if err := os.WriteFile(f, []byte(docs.String()), 0o600); err != nil {
		tb.Fatal(err)
	}
	return f
}

// envPod is a pod of about n bytes of JSON: one container with many
// environment variables of 100-byte values (an estimated 4.5 times its
// JSON decoded, so a 1 MB one fits the default decode budget).
func envPod(n int) []byte {
	value := strings.Repeat("v", 100)
	var b strings.Builder
	b.WriteString(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"x","namespace":"shop"},"spec":{"containers":[{"name":"c","image":"nginx","env":[`)
	for i := 0; b.Len() < n; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"name":"E%d","value":%q}`, i, value)
	}
	b.WriteString("]}]}}")
	return []byte(b.String())
}

// benchFiveMAPs serves pod through the webhook of fiveMAPs, as `kadmit
// serve --policies` does, with a request context that ends after each
// review as the HTTP handler's does; each review must patch.
func benchFiveMAPs(b *testing.B, pod []byte) {
	whs, _, err := LoadWebhooks(Options{Budget: NewBudget(0)}, fiveMAPs(b))
	if err != nil {
		b.Fatal(err)
	}
	gvk := metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}
	gvr := metav1.GroupVersionResource{Version: "v1", Resource: "pods"}
	req := &kadmission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: "u", Kind: gvk, Resource: gvr, RequestKind: &gvk, RequestResource: &gvr,
		Namespace: "shop", Operation: admissionv1.Create,
		Object: runtime.RawExtension{Raw: pod},
	}}
	b.SetBytes(int64(len(pod)))
	b.ReportAllocs()
	for b.Loop() {
		ctx, cancel := context.WithCancel(context.Background())
		out, err := whs[0].Review(ctx, req)
		cancel()
		if err != nil || !out.Response.Allowed || len(out.Patch) == 0 {
			b.Fatal(err, out.Response)
		}
	}
}

// BenchmarkFiveMAPsRealistic: the realistic pod (4.6 KB) through five
// trivial MAPs.
func BenchmarkFiveMAPsRealistic(b *testing.B) { benchFiveMAPs(b, realisticPod(b)) }

// BenchmarkFiveMAPs1MB: a 1 MB pod (env vars) through five trivial MAPs.
func BenchmarkFiveMAPs1MB(b *testing.B) { benchFiveMAPs(b, envPod(1_000_000)) }
