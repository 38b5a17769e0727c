package celpolicy

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
)

func deployment(replicas int) []byte {
	return []byte(`{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"web","namespace":"default"},"spec":{"replicas":` +
		strings.TrimSpace(string(rune('0'+replicas))) + `,"selector":{"matchLabels":{"app":"web"}},"template":{"metadata":{"labels":{"app":"web"}},"spec":{"containers":[{"name":"c","image":"nginx"}]}}}}`)
}

func deployReq(replicas int) *Request {
	return &Request{
		Kind:      schema.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"},
		Resource:  schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"},
		Name:      "web",
		Namespace: "default",
		Operation: admission.Create,
		Object:    deployment(replicas),
	}
}

func mustEngine(t *testing.T, path string) *Engine {
	t.Helper()
	set, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(set, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestValidateDocsExample(t *testing.T) {
	e := mustEngine(t, "testdata/basic.yaml")
	ctx := context.Background()
	d, err := e.Validate(ctx, deployReq(6))
	if err != nil {
		t.Fatal(err)
	}
	if d.Allowed {
		t.Fatal("6 replicas allowed")
	}
	want := `deployments.apps "web" is forbidden: ValidatingAdmissionPolicy 'demo-policy.example.com' with binding 'demo-binding-test.example.com' denied request: failed expression: object.spec.replicas <= 5`
	if d.Status.Message != want || d.Status.Code != 422 {
		t.Errorf("status = %d %q, want 422 %q", d.Status.Code, d.Status.Message, want)
	}
	if len(d.Warnings) != 1 || !strings.Contains(d.Warnings[0], "object.spec.replicas must be no greater than 3") {
		t.Errorf("warnings = %q", d.Warnings)
	}
	if d.AuditAnnotations["demo-policy.example.com/high-replica-count"] != "Deployment spec.replicas set to 6" {
		t.Errorf("audit = %v", d.AuditAnnotations)
	}
	if _, ok := d.AuditAnnotations["validation.policy.admission.k8s.io/validation_failure"]; !ok {
		t.Errorf("audit = %v", d.AuditAnnotations)
	}
	d, err = e.Validate(ctx, deployReq(2))
	if err != nil {
		t.Fatal(err)
	}
	if !d.Allowed || len(d.Warnings) != 0 {
		t.Errorf("2 replicas: %+v", d)
	}
}

func TestMutateApplyConfiguration(t *testing.T) {
	e := mustEngine(t, "testdata/basic.yaml")
	pod := []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"default"},"spec":{"initContainers":[{"name":"init","image":"busybox"}],"containers":[{"name":"c","image":"nginx"}]}}`)
	req := &Request{
		Kind: schema.GroupVersionKind{Version: "v1", Kind: "Pod"}, Resource: schema.GroupVersionResource{Version: "v1", Resource: "pods"},
		Name: "p", Namespace: "default", Operation: admission.Create, Object: pod,
	}
	d, err := e.Mutate(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if !d.Allowed || !d.Changed {
		t.Fatalf("%+v %s", d, d.Status)
	}
	var out struct {
		Spec struct {
			InitContainers []map[string]any `json:"initContainers"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(d.Object, &out); err != nil {
		t.Fatal(err)
	}
	if len(out.Spec.InitContainers) != 2 || out.Spec.InitContainers[1]["name"] != "mesh-proxy" {
		t.Fatalf("object = %s", d.Object)
	}
	ops, err := Ops(pod, d.Object)
	if err != nil {
		t.Fatal(err)
	}
	if len(ops) != 1 || ops[0].Path != "/spec/initContainers" {
		t.Errorf("ops = %v", ops)
	}
	// Idempotent: the matchCondition skips an already mutated pod.
	req.Object = d.Object
	d, err = e.Mutate(context.Background(), req)
	if err != nil || d.Changed {
		t.Errorf("second run changed: %v %+v", err, d)
	}
}

// The runtime CEL cost budget is the API server's: an expression whose
// cost grows with the object stops at the budget and, under failurePolicy
// Fail, denies, in bounded time.
func TestRuntimeCostBudget(t *testing.T) {
	e := mustEngine(t, "testdata/costly.yaml")
	pod := []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"d","annotations":{"x":"` + strings.Repeat("a", 3000) + `"}},"spec":{}}`)
	d, err := e.Validate(context.Background(), &Request{
		Kind: schema.GroupVersionKind{Version: "v1", Kind: "Pod"}, Resource: schema.GroupVersionResource{Version: "v1", Resource: "pods"},
		Name: "p", Namespace: "d", Operation: admission.Create, Object: pod,
	})
	if err != nil {
		t.Fatal(err)
	}
	if d.Allowed || !strings.Contains(d.Status.Message, "operation cancelled: actual cost limit exceeded") {
		t.Fatalf("decision: %+v %v", d, d.Status)
	}
}

// One engine serves concurrent requests (the server calls it from every
// connection's goroutine).
func TestConcurrentUse(t *testing.T) {
	e := mustEngine(t, "testdata/basic.yaml")
	pod := []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"default"},"spec":{"initContainers":[{"name":"init","image":"busybox"}],"containers":[{"name":"c","image":"nginx"}]}}`)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 10; i++ {
				d, err := e.Validate(context.Background(), deployReq(6))
				if err != nil || d.Allowed {
					errs <- fmt.Errorf("validate: %v %+v", err, d)
					return
				}
				m, err := e.Mutate(context.Background(), &Request{
					Kind: schema.GroupVersionKind{Version: "v1", Kind: "Pod"}, Resource: schema.GroupVersionResource{Version: "v1", Resource: "pods"},
					Name: "p", Namespace: "default", Operation: admission.Create, Object: pod,
				})
				if err != nil || !m.Changed {
					errs <- fmt.Errorf("mutate: %v %+v", err, m)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
