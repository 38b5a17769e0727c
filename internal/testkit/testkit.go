// Package testkit holds what kadmit's unit tests in the main module share:
// admission request builders (Request, PodRequest) and the one poller
// (Eventually). The end-to-end suites have their own (test/poll), in the
// test module.
//
// It imports "testing": only _test.go files may import it.
package testkit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kadmit/kadmit/internal/admission"
)

// Resources the tests review most.
var (
	Pods       = metav1.GroupVersionResource{Version: "v1", Resource: "pods"}
	Nodes      = metav1.GroupVersionResource{Version: "v1", Resource: "nodes"}
	ConfigMaps = metav1.GroupVersionResource{Version: "v1", Resource: "configmaps"}
)

// Option sets a field of the request Request builds.
type Option func(*admissionv1.AdmissionRequest)

// Namespace sets request.namespace.
func Namespace(ns string) Option { return func(r *admissionv1.AdmissionRequest) { r.Namespace = ns } }

// Name sets request.name.
func Name(name string) Option { return func(r *admissionv1.AdmissionRequest) { r.Name = name } }

// SubResource sets request.subResource, e.g. "status".
func SubResource(s string) Option {
	return func(r *admissionv1.AdmissionRequest) { r.SubResource = s }
}

// Kind sets request.kind.
func Kind(gvk metav1.GroupVersionKind) Option {
	return func(r *admissionv1.AdmissionRequest) { r.Kind = gvk }
}

// Requested sets request.requestKind and request.requestResource to
// copies of request.kind and request.resource, as the API server sends
// them when the request needed no conversion. Give it after Kind.
func Requested() Option {
	return func(r *admissionv1.AdmissionRequest) {
		k, res := r.Kind, r.Resource
		r.RequestKind, r.RequestResource = &k, &res
	}
}

// UID sets request.uid (Request's default is "u").
func UID(uid types.UID) Option { return func(r *admissionv1.AdmissionRequest) { r.UID = uid } }

// Request returns the review request of op on resource with obj as
// request.object and old as request.oldObject, each left empty when it is
// empty (a DELETE has no object, a CREATE no old object), uid "u", and
// whatever opts set. obj and old are JSON, as string or []byte; they are
// not copied.
func Request[B ~string | ~[]byte](op admissionv1.Operation, resource metav1.GroupVersionResource, obj, old B, opts ...Option) *admission.Request {
	r := &admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{UID: "u", Operation: op, Resource: resource}}
	if len(obj) > 0 {
		r.Object = runtime.RawExtension{Raw: []byte(obj)}
	}
	if len(old) > 0 {
		r.OldObject = runtime.RawExtension{Raw: []byte(old)}
	}
	for _, o := range opts {
		o(&r.AdmissionRequest)
	}
	return r
}

// PodRequest is Request on pods with request.kind v1 Pod.
func PodRequest[B ~string | ~[]byte](op admissionv1.Operation, obj, old B, opts ...Option) *admission.Request {
	return Request(op, Pods, obj, old, append([]Option{Kind(metav1.GroupVersionKind{Version: "v1", Kind: "Pod"})}, opts...)...)
}

// ReviewBody returns r as the body of an AdmissionReview admission.k8s.io/v1
// request, as the API server POSTs it to a webhook. It panics when r holds
// an object that is not JSON (the test's own mistake).
func ReviewBody(r *admission.Request) []byte {
	b, err := json.Marshal(admission.Review{APIVersion: admission.APIVersionV1, Kind: admission.ReviewKind, Request: &r.AdmissionRequest})
	if err != nil {
		panic(fmt.Sprintf("testkit.ReviewBody: %v", err))
	}
	return b
}

// PollInterval is how often Eventually calls its condition.
const PollInterval = 10 * time.Millisecond

// Eventually calls cond at once and then every PollInterval until it
// returns true, for at most timeout, on apimachinery's
// wait.PollUntilContextTimeout; past timeout (or when the test's context
// ends) it fails t with "timed out after <timeout> waiting for <what>".
// cond runs on the caller's goroutine.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), PollInterval, timeout, true, func(context.Context) (bool, error) {
		return cond(), nil
	})
	switch {
	case err == nil:
	case errors.Is(err, context.DeadlineExceeded):
		t.Fatalf("timed out after %s waiting for %s", timeout, what)
	default:
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

// EventuallyNil is Eventually for a condition that says what is still
// wrong: it calls cond until it returns nil, and past timeout fails t with
// "<what>: not within <timeout>: <cond's last error>".
func EventuallyNil(t testing.TB, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(t.Context(), PollInterval, timeout, true, func(context.Context) (bool, error) {
		last = cond()
		return last == nil, nil
	})
	switch {
	case err == nil:
	case errors.Is(err, context.DeadlineExceeded):
		t.Fatalf("%s: not within %s: %v", what, timeout, last)
	default:
		t.Fatalf("waiting for %s: %v (last: %v)", what, err, last)
	}
}

// NodeJSON is a v1 Node named name, with annotations and alloc as both
// its status.allocatable and status.capacity, encoded as JSON: the object
// of a kubelet's status write, for the node policies' tests.
func NodeJSON(t testing.TB, name string, annotations map[string]string, alloc corev1.ResourceList) string {
	t.Helper()
	n := corev1.Node{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: annotations},
		Status:     corev1.NodeStatus{Allocatable: alloc, Capacity: alloc},
	}
	b, err := json.Marshal(&n)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Decode unmarshals the JSON b (an answer's patched object) into a new T,
// failing the test when it does not decode.
func Decode[T any](t testing.TB, b []byte) *T {
	t.Helper()
	v := new(T)
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("decode %T: %v", v, err)
	}
	return v
}
