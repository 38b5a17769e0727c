package celpolicy

import (
	"context"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
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
