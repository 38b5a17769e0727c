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

	"github.com/kadmit/kadmit/internal/testkit"

	admissionv1 "k8s.io/api/admission/v1"

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
	testkit.Eventually(t, 10*time.Second, "the engine to be collected after its hooks were dropped", func() bool {
		runtime.GC()
		select {
		case <-released:
			return true
		default:
			return false
		}
	})
}

func blobReqPod() *kadmission.Request {
	return testkit.PodRequest(admissionv1.Create, `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"ok","namespace":"default"}}`, "",
		testkit.Requested(), testkit.Name("ok"), testkit.Namespace("default"))
}
