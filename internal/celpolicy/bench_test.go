package celpolicy

import (
	"context"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
	"sigs.k8s.io/yaml"

	kadmission "github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/bench"
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

// realisticPod is `make bench`'s pod (internal/bench DefaultPod, about
// 4.6 KB as JSON).
func realisticPod(b *testing.B) []byte {
	pod, err := yaml.YAMLToJSON(bench.DefaultPod())
	if err != nil {
		b.Fatal(err)
	}
	return pod
}

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
