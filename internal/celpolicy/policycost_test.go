package celpolicy

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"

	kadmission "github.com/kadmit/kadmit/internal/admission"
)

// trivialPolicies writes n trivial VAPs with their bindings on pods (the
// issue's "1,000 trivial policies") and returns the file.
func trivialPolicies(tb testing.TB, n int) string {
	tb.Helper()
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, `apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: p%[1]d}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules: [{apiGroups: [""], apiVersions: ["v1"], operations: ["CREATE"], resources: ["pods"]}]
  validations:
  - expression: "object.metadata.name != 'forbidden-%[1]d'"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: p%[1]d}
spec: {policyName: p%[1]d, validationActions: [Deny]}
---
`, i)
	}
	p := filepath.Join(tb.TempDir(), "policies.yaml")
	if err := os.WriteFile(p, []byte(b.String()), 0o600); err != nil {
		tb.Fatal(err)
	}
	return p
}

// BenchmarkPolicyCost: the heap one trivial declared policy keeps once
// loaded and compiled (bytes/policy), and the CPU its load takes
// (ns/op is per set of 100).
func BenchmarkPolicyCost(b *testing.B) {
	path := trivialPolicies(b, 100)
	var perPolicy float64
	for b.Loop() {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		whs, e, err := LoadWebhooks(Options{}, path)
		if err != nil {
			b.Fatal(err)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		perPolicy = float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / 100
		runtime.KeepAlive(whs)
		runtime.KeepAlive(e)
	}
	b.ReportMetric(perPolicy, "heap-bytes/policy")
}

// TestEngineReleased: an engine whose hooks served requests is garbage
// once its hooks are dropped (a reload swaps them), so a reload never
// keeps the old policy set: nothing in the package (the shared CEL
// environment, the type converters, the decoded-object cache) holds it.
func TestEngineReleased(t *testing.T) {
	released := make(chan struct{})
	func() {
		whs, e, err := LoadWebhooks(Options{Budget: NewBudget(0)}, trivialPolicies(t, 3))
		if err != nil {
			t.Fatal(err)
		}
		runtime.SetFinalizer(e, func(*Engine) { close(released) })
		for range 3 {
			ctx, cancel := context.WithCancel(context.Background())
			out, err := whs[0].Review(ctx, blobReqPod())
			cancel()
			if err != nil || !out.Response.Allowed {
				t.Fatalf("review: %v %+v", err, out.Response)
			}
		}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		runtime.GC()
		select {
		case <-released:
			return
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the engine is still reachable after its hooks were dropped")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func blobReqPod() *kadmission.Request {
	gvk := metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}
	gvr := metav1.GroupVersionResource{Version: "v1", Resource: "pods"}
	return &kadmission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: "u", Kind: gvk, Resource: gvr, RequestKind: &gvk, RequestResource: &gvr, Name: "ok", Namespace: "default",
		Operation: admissionv1.Create, Object: kruntime.RawExtension{Raw: []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"ok","namespace":"default"}}`)},
	}}
}
