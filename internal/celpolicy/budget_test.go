package celpolicy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kadmit/kadmit/internal/testkit"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	kadmission "github.com/kadmit/kadmit/internal/admission"
)

// One VAP reading object.spec of a free-form custom resource (the issue's
// reproduction) and two MAPs on the same resource.
const budgetPolicies = `apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: reads-spec}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules: [{apiGroups: ["example.com"], apiVersions: ["v1"], operations: ["CREATE", "UPDATE"], resources: ["blobs"]}]
  validations:
  - expression: "has(object.spec)"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: reads-spec}
spec: {policyName: reads-spec, validationActions: [Deny]}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: reads-name}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules: [{apiGroups: ["example.com"], apiVersions: ["v1"], operations: ["CREATE", "UPDATE"], resources: ["blobs"]}]
  validations:
  - expression: "object.metadata.name != 'forbidden'"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: reads-name}
spec: {policyName: reads-name, validationActions: [Deny]}
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicy
metadata: {name: label}
spec:
  reinvocationPolicy: Never
  failurePolicy: Fail
  matchConstraints:
    resourceRules: [{apiGroups: ["example.com"], apiVersions: ["v1"], operations: ["CREATE"], resources: ["blobs"]}]
  mutations:
  - patchType: JSONPatch
    jsonPatch:
      expression: "[JSONPatch{op: 'add', path: '/metadata/labels', value: {'a': 'b'}}]"
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicyBinding
metadata: {name: label}
spec: {policyName: label}
`

func writePolicies(t *testing.T, docs string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "policies.yaml")
	if err := os.WriteFile(p, []byte(docs), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func budgetWebhooks(t *testing.T, opts Options) (validate, mutate *kadmission.Webhook) {
	t.Helper()
	whs, _, err := LoadWebhooks(opts, writePolicies(t, budgetPolicies))
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range whs {
		switch w.Path {
		case ValidatePath:
			validate = w
		case MutatePath:
			mutate = w
		}
	}
	return validate, mutate
}

// blob is a free-form custom resource whose spec is n bytes of the
// costliest shape to decode measured ({"a":1} objects, see budget.go).
func blob(n int) []byte {
	var b strings.Builder
	b.WriteString(`{"apiVersion":"example.com/v1","kind":"Blob","metadata":{"name":"b","namespace":"default"},"spec":{"items":[`)
	for i := 0; b.Len() < n; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"a":1}`)
	}
	b.WriteString("]}}")
	return []byte(b.String())
}

func blobReq(obj []byte) *kadmission.Request {
	return testkit.Request(admissionv1.Create, metav1.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "blobs"}, obj, nil,
		testkit.Kind(metav1.GroupVersionKind{Group: "example.com", Version: "v1", Kind: "Blob"}), testkit.Requested(),
		testkit.Name("b"), testkit.Namespace("default"))
}

func statusCode(t *testing.T, err error) int {
	t.Helper()
	var se *kadmission.StatusError
	if !errors.As(err, &se) {
		t.Fatalf("review error %v is not a *admission.StatusError", err)
	}
	return se.Code
}

// TestEstimateBoundsDecodedSize: estimate is at least the heap the decoded
// object holds, for the shapes measured and a realistic object.
func TestEstimateBoundsDecodedSize(t *testing.T) {
	shapes := map[string]string{"onekey": `{"a":1}`, "ints": "1", "strs": `"a"`, "emptyobj": "{}", "emptyarr": "[]", "nested": `[[1]]`, "nulls": "null"}
	for name, el := range shapes {
		var b strings.Builder
		b.WriteString(`{"apiVersion":"v1","kind":"X","spec":[`)
		for i := 0; b.Len() < 256<<10; i++ {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(el)
		}
		b.WriteString("]}")
		raw := []byte(b.String())
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		o, err := decodeObject(raw, schema.GroupVersionKind{Version: "v1", Kind: "X"}, "object", nil)
		if err != nil {
			t.Fatal(err)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		held := int64(after.HeapAlloc) - int64(before.HeapAlloc)
		runtime.KeepAlive(o)
		if est := estimate(raw); est < held {
			t.Errorf("%s: estimate %d bytes < %d held decoded (%.1fx of %d JSON bytes)", name, est, held, float64(held)/float64(len(raw)), len(raw))
		}
	}
}

// TestBudgetExhaustedAnswers503: a request the budget cannot hold while
// others hold it gets HTTP 503 with the reason; once they return, it is
// served; an object estimated beyond the whole budget, or beyond the size
// bound, gets 413.
func TestBudgetExhaustedAnswers503(t *testing.T) {
	b := NewBudget(4 << 20)
	validate, _ := budgetWebhooks(t, Options{Budget: b})
	obj := blob(40 << 10) // ~2.8 MB estimated, of the spec member
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// Another request holds most of the budget.
	if err := b.take(3 << 20); err != nil {
		t.Fatal(err)
	}
	_, err := validate.Review(ctx, blobReq(obj))
	if code := statusCode(t, err); code != http.StatusServiceUnavailable || !errors.Is(err, ErrDecodeBudget) || !errors.Is(err, kadmission.ErrBusy) {
		t.Fatalf("budget spent: code %d, err %v", code, err)
	}
	if !strings.Contains(err.Error(), "ValidatingAdmissionPolicy 'reads-spec' not evaluated") || !strings.Contains(err.Error(), "objects decoded for declared policies") {
		t.Errorf("reason %q", err)
	}
	if b.Used() != 3<<20 {
		t.Fatalf("a refused request holds budget: %d used", b.Used())
	}
	b.give(3 << 20)

	out, err := validate.Review(ctx, blobReq(obj))
	if err != nil || !out.Response.Allowed {
		t.Fatalf("budget free: %v %+v", err, out.Response)
	}
	// The validating hooks share the request's decoded objects until the
	// request ends.
	if b.Used() == 0 {
		t.Fatal("shared decoded objects not charged while the request runs")
	}
	cancel()
	waitUsed(t, b, 0)

	// Beyond the whole budget: 413, whatever the load.
	_, err = validate.Review(context.Background(), blobReq(blob(200<<10)))
	if code := statusCode(t, err); code != http.StatusRequestEntityTooLarge || !errors.Is(err, ErrObjectTooLarge) {
		t.Fatalf("object beyond the budget: code %d, err %v", code, err)
	}

	// Beyond MaxObjectBytes: 413 naming the flag, nothing decoded.
	small, mutate := budgetWebhooks(t, Options{Budget: b, MaxObjectBytes: 10 << 10})
	for _, wh := range []*kadmission.Webhook{small, mutate} {
		_, err = wh.Review(context.Background(), blobReq(obj))
		if code := statusCode(t, err); code != http.StatusRequestEntityTooLarge || !strings.Contains(err.Error(), "--policy-max-object-bytes") {
			t.Fatalf("%s: object beyond the size bound: code %d, err %v", wh.Path, code, err)
		}
	}
	if b.Used() != 0 || b.Refused() != 1 {
		t.Fatalf("used %d refused %d, want 0 and 1", b.Used(), b.Refused())
	}
}

func waitUsed(t *testing.T, b *Budget, want int64) {
	t.Helper()
	testkit.EventuallyNil(t, 5*time.Second, "budget settled", func() error {
		if used := b.Used(); used != want {
			return fmt.Errorf("budget used %d, want %d", used, want)
		}
		return nil
	})
}

// TestBudgetBoundsConcurrentRequests: many requests at once never hold
// more than the budget; each is served or refused 503, and everything is
// given back once they return.
func TestBudgetBoundsConcurrentRequests(t *testing.T) {
	b := NewBudget(8 << 20)
	validate, mutate := budgetWebhooks(t, Options{Budget: b})
	obj := blob(40 << 10)
	var peak, served, refused, mu = int64(0), 0, 0, sync.Mutex{}
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			default:
			}
			u := b.Used()
			mu.Lock()
			peak = max(peak, u)
			mu.Unlock()
			runtime.Gosched()
		}
	}()
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			wh := validate
			if i%2 == 1 {
				wh = mutate
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			for range 4 {
				out, err := wh.Review(ctx, blobReq(obj))
				mu.Lock()
				switch {
				case err == nil && out.Response.Allowed:
					served++
				case err != nil && errors.Is(err, ErrDecodeBudget):
					refused++
				default:
					t.Errorf("review: %v %+v", err, out.Response)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(stop)
	<-sampled
	waitUsed(t, b, 0)
	if peak > b.Max() || peak == 0 {
		t.Fatalf("peak budget use %d, bound %d", peak, b.Max())
	}
	if served == 0 || served+refused != 64 {
		t.Fatalf("served %d, refused %d of 64", served, refused)
	}
	t.Logf("served %d, refused %d, peak %d of %d bytes", served, refused, peak, b.Max())
}

// TestMutateReleasesBudget: a mutating request's charge is given back when
// it ends, and its patch is the same with or without a budget.
func TestMutateReleasesBudget(t *testing.T) {
	b := NewBudget(0)
	_, withBudget := budgetWebhooks(t, Options{Budget: b})
	_, without := budgetWebhooks(t, Options{})
	obj := blob(4 << 10)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got, err := withBudget.Review(ctx, blobReq(obj))
	if err != nil {
		t.Fatal(err)
	}
	// The request's mutating hooks share one charge, held until the
	// request ends: four estimates of the object.
	if want := mutateFactor * estimate(obj); b.Used() != want {
		t.Fatalf("%d bytes held during the request, want %d", b.Used(), want)
	}
	cancel()
	waitUsed(t, b, 0)
	want, err := without.Review(context.Background(), blobReq(obj))
	if err != nil {
		t.Fatal(err)
	}
	if string(got.Response.Patch) != string(want.Response.Patch) || len(got.Response.Patch) == 0 {
		t.Fatalf("patch %s, want %s", got.Response.Patch, want.Response.Patch)
	}
}

// TestEvaluationStopsOnCancel: an abandoned evaluation stops soon after
// its context ends, for a comprehension (all) and for the quadratic list
// functions cel-go runs in one call (distinct), over a list large enough
// to run for minutes.
func TestEvaluationStopsOnCancel(t *testing.T) {
	for name, expr := range map[string]string{
		"all":      "object.spec.items.all(x, object.spec.items.all(y, x.a >= 0 && y.a >= 0))",
		"distinct": "object.spec.items.distinct().size() > 0",
	} {
		t.Run(name, func(t *testing.T) {
			policy := fmt.Sprintf(`apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: slow}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules: [{apiGroups: ["example.com"], apiVersions: ["v1"], operations: ["CREATE"], resources: ["blobs"]}]
  validations:
  - expression: %q
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: slow}
spec: {policyName: slow, validationActions: [Deny]}
`, expr)
			whs, _, err := LoadWebhooks(Options{}, writePolicies(t, policy))
			if err != nil {
				t.Fatal(err)
			}
			var b strings.Builder
			b.WriteString(`{"apiVersion":"example.com/v1","kind":"Blob","metadata":{"name":"b"},"spec":{"items":[`)
			for i := range 40000 {
				if i > 0 {
					b.WriteByte(',')
				}
				fmt.Fprintf(&b, `{"a":%d}`, i)
			}
			b.WriteString("]}}")
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			start := time.Now()
			type result struct {
				out kadmission.Outcome
				err error
			}
			done := make(chan result, 1)
			go func() {
				out, err := whs[0].Review(ctx, blobReq([]byte(b.String())))
				done <- result{out, err}
			}()
			var res result
			select {
			case res = <-done:
			case <-time.After(20 * time.Second):
				t.Fatalf("evaluation still running 20s after a 200ms deadline")
			}
			out, err, took := res.out, res.err, time.Since(start)
			if took > 3*time.Second {
				t.Fatalf("evaluation ran %v after a 200ms deadline", took)
			}
			if err == nil && out.Response.Allowed {
				t.Fatalf("an interrupted evaluation allowed the request: %+v", out.Response)
			}
			t.Logf("stopped after %v: %v %v", took, err, out.Response.Result)
		})
	}
}

// TestAbandonedReviewKeepsChargeUntilReturn: a request's shared charge
// outlives its context while a hook still runs on it (an abandoned review
// still decoding holds that memory), is given back when the hook returns,
// and nothing can be charged to it after its context ended.
func TestAbandonedReviewKeepsChargeUntilReturn(t *testing.T) {
	b := NewBudget(1 << 20)
	var r requestMeters
	ctx, cancel := context.WithCancel(context.Background())
	m, own := r.get(ctx, b)
	if own {
		t.Fatal("a cancellable request's meter is not shared")
	}
	if err := m.ensure(1000); err != nil {
		t.Fatal(err)
	}
	if m2, _ := r.get(ctx, b); m2 != m {
		t.Fatal("two meters for one request")
	} else {
		m2.leave()
	}
	cancel()
	time.Sleep(50 * time.Millisecond) // let AfterFunc run
	if b.Used() != 1000 {
		t.Fatalf("used %d while a hook still runs, want 1000", b.Used())
	}
	if err := m.ensure(2000); !errors.Is(err, errReviewEnded) {
		t.Fatalf("charge after the review ended: %v", err)
	}
	m.leave()
	waitUsed(t, b, 0)
	r.mu.Lock()
	n := len(r.m)
	r.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d meters kept after their requests ended", n)
	}
}
