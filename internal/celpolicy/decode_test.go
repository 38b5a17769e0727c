package celpolicy

import (
	"bytes"
	"context"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/kadmit/kadmit/internal/testkit"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	kadmission "github.com/kadmit/kadmit/internal/admission"
)

// TestExprFields: the members an expression reads, or nil (the whole
// object) for any other use of object or oldObject.
func TestExprFields(t *testing.T) {
	base := []string{"apiVersion", "kind", "metadata"}
	for _, tt := range []struct {
		exprs []string
		want  []string // nil: whole object
	}{
		{[]string{"object.metadata.name != ''"}, base},
		{[]string{"object.spec.replicas <= 5"}, append(slices.Clone(base), "spec")},
		{[]string{"has(object.spec) && oldObject.status.phase == 'x'"}, append(slices.Clone(base), "spec", "status")},
		{[]string{"object.?data.orValue({}).size() > 0", `object["binaryData"] != null`, `object[?"stringData"].hasValue()`}, append(slices.Clone(base), "binaryData", "data", "stringData")},
		{[]string{"object.spec.containers.all(c, c.image != '')", "request.operation == 'CREATE'", "params.x == 1", "variables.v"}, append(slices.Clone(base), "spec")},
		{[]string{"object == oldObject"}, nil},
		{[]string{"object.metadata.name != ''", "size(object) > 1"}, nil},
		{[]string{"object.all(k, k != 'spec')"}, nil},
		{[]string{"[object].size() == 1"}, nil},
		{[]string{`object[variables.key] == 1`}, nil},
		{[]string{"object.metadata.name ==="}, nil}, // does not parse
	} {
		got := exprFields(tt.exprs)
		if tt.want == nil {
			if got != nil {
				t.Errorf("%q: got %v, want the whole object", tt.exprs, got.names())
			}
			continue
		}
		if got == nil || !slices.Equal(got.names(), slices.Sorted(slices.Values(tt.want))) {
			t.Errorf("%q: got %v, want %v", tt.exprs, got, tt.want)
		}
	}
}

// TestDecodeFields: decodeFields is decodeObject with only the chosen
// members kept, on objects with nulls, duplicate and escaped members,
// numbers, and on input the decoder refuses (same error).
func TestDecodeFields(t *testing.T) {
	gvk := schema.GroupVersionKind{Version: "v1", Kind: "Pod"}
	objects := []string{
		`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a","labels":{"x":"y"}},"spec":{"containers":[{"name":"c","ports":[{"containerPort":80}]}],"n":1.5,"big":9007199254740993},"status":null}`,
		`{"kind":"Pod","metadata":null,"spec":{"a":1},"spec":{"b":2},"\u0073tatus":{"phase":"Running"}}`,
		` {"kind":"Pod", "apiVersion":"v1" , "data":{"k":"\u00e9"}} `,
		`{"metadata":{"name":"no kind"}}`,
		`{"kind":7,"metadata":{}}`,
		`["kind","Pod"]`,
		`null`,
		`{"kind":"Pod",}`,
	}
	sets := []fieldSet{nil, exprFields(nil), exprFields([]string{"object.spec.a"}), exprFields([]string{"object.status", "object.data", "object.nothing"})}
	for i, raw := range objects {
		for j, fs := range sets {
			t.Run(fmt.Sprintf("object%d/set%d", i, j), func(t *testing.T) {
				got, gotErr := decodeFields([]byte(raw), gvk, "object", fs, nil)
				want, wantErr := decodeObject([]byte(raw), gvk, "object", nil)
				if (gotErr == nil) != (wantErr == nil) || (gotErr != nil && gotErr.Error() != wantErr.Error()) {
					t.Fatalf("error %v, want %v", gotErr, wantErr)
				}
				if wantErr != nil {
					return
				}
				w := want.(*unstructured.Unstructured).Object
				if fs != nil {
					for k := range w {
						if !fs[k] {
							delete(w, k)
						}
					}
				}
				if g := got.(*unstructured.Unstructured).Object; !reflect.DeepEqual(g, w) {
					t.Fatalf("got %#v\nwant %#v", g, w)
				}
			})
		}
	}
}

// TestRequestCache: every hook of one request gets the same decoded
// objects; another request, or the same request with other object bytes,
// gets its own; at most requestCacheSize requests are kept.
func TestRequestCache(t *testing.T) {
	var c requestCache
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mk := func() *kadmission.Request {
		return &kadmission.Request{AdmissionRequest: admissionv1.AdmissionRequest{Object: runtime.RawExtension{Raw: []byte(`{"kind":"Pod"}`)}}}
	}
	a := mk()
	da := c.get(ctx, a)
	if c.get(ctx, a) != da {
		t.Fatal("same request: another entry")
	}
	if c.get(ctx, mk()) == da {
		t.Fatal("another request: the same entry")
	}
	a2 := *a
	a2.Object.Raw = []byte(`{"kind":"Pod"}`)
	if c.get(ctx, &a2) == da {
		t.Fatal("other object bytes: the same entry")
	}
	for range requestCacheSize {
		c.get(ctx, mk())
	}
	if c.get(ctx, a) == da {
		t.Fatal("entry not evicted after requestCacheSize others")
	}
	if len(c.entries) != requestCacheSize {
		t.Fatalf("%d entries, want %d", len(c.entries), requestCacheSize)
	}

	// The byte bound: entries of a quarter of it each leave at most four.
	big := func(n int) *kadmission.Request {
		r := mk()
		r.Object.Raw = bytes.Repeat([]byte{' '}, n)
		return r
	}
	for range 10 {
		c.get(ctx, big(requestCacheBytes/4))
	}
	if len(c.entries) > 4 || c.bytes > requestCacheBytes {
		t.Fatalf("%d entries of %d bytes in all, bound %d bytes", len(c.entries), c.bytes, requestCacheBytes)
	}
	huge := big(requestCacheBytes + 1)
	if d := c.get(ctx, huge); d == c.get(ctx, huge) {
		t.Fatal("a request above the byte bound was kept")
	}
	sum := 0
	for _, e := range c.entries {
		sum += e.n + e.oldN
	}
	if sum != c.bytes {
		t.Fatalf("byte count %d, entries hold %d", c.bytes, sum)
	}
	// A request whose context never ends is never kept; the entries of
	// one whose context ended are dropped.
	bg := mk()
	first, second := c.get(context.Background(), bg), c.get(context.Background(), bg)
	if first == second {
		t.Fatal("a request whose context never ends was kept")
	}
	cancel()
	testkit.EventuallyNil(t, 5*time.Second, "decode cache emptied", func() error {
		c.mu.Lock()
		n, b := len(c.entries), c.bytes
		c.mu.Unlock()
		if n != 0 || b != 0 {
			return fmt.Errorf("%d entries (%d bytes) left after their requests ended", n, b)
		}
		return nil
	})
}

// TestHooksShareDecodedObject: on a path with several validating policies,
// the served hooks decode a request's object once, with the members any of
// them reads, and decide as the engine's own Validate does.
func TestHooksShareDecodedObject(t *testing.T) {
	whs, e, err := LoadWebhooks(Options{}, "../../examples/cel/pod-name/policy.yaml", "../../examples/cel/docs-deny-privileged/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if got := e.validatingUnion.names(); !slices.Equal(got, []string{"apiVersion", "kind", "metadata", "spec"}) {
		t.Fatalf("union %v", got)
	}
	var wh *kadmission.Webhook
	for _, w := range whs {
		if w.Path == ValidatePath {
			wh = w
		}
	}
	gvk := metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}
	gvr := metav1.GroupVersionResource{Version: "v1", Resource: "pods"}
	for _, tt := range []struct {
		pod   string
		allow bool
	}{
		{`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"ok","namespace":"shop"},"spec":{"containers":[{"name":"c"}]},"status":{}}`, true},
		{`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"offensive","namespace":"shop"},"spec":{"containers":[{"name":"c"}]}}`, false},
		{`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"priv","namespace":"shop"},"spec":{"containers":[{"name":"c","securityContext":{"privileged":true}}]}}`, false},
	} {
		req := &kadmission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
			UID: "u", Kind: gvk, Resource: gvr, RequestKind: &gvk, RequestResource: &gvr,
			Namespace: "shop", Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: []byte(tt.pod)},
		}}
		ctx, cancel := context.WithCancel(context.Background())
		out, err := wh.Review(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		d := e.decoded.get(ctx, req)
		cancel()
		u, ok := d.obj.(*unstructured.Unstructured)
		if !ok {
			t.Fatalf("%s: no shared decoded object for the request", tt.pod)
		}
		if _, has := u.Object["status"]; has {
			t.Errorf("%s: status decoded, no policy reads it", tt.pod)
		}
		whole, err := e.Validate(context.Background(), FromAdmission(req))
		if err != nil {
			t.Fatal(err)
		}
		if out.Response.Allowed != tt.allow || whole.Allowed != tt.allow {
			t.Errorf("%s: served allowed=%v, Validate allowed=%v, want %v", tt.pod, out.Response.Allowed, whole.Allowed, tt.allow)
		}
	}
}
