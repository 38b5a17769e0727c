package reservation

import (
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kadmit/kadmit/internal/admission"
)

// TestHooks checks the registration against upstream's markers:
// mreservation-create (reservation/mutating/webhooks.go:27) and vpod
// (pod/validating/webhooks.go:28), both failurePolicy Fail.
func TestHooks(t *testing.T) {
	p, _ := New(Config{}, nil, nil)
	hooks := p.Hooks()
	if len(hooks) != 2 || hooks[0].Path != MutatePath || hooks[0].Type != admission.Mutating || hooks[1].Path != ValidatePath ||
		hooks[1].Type != admission.Validating {
		t.Fatalf("hooks %+v", hooks)
	}
	for _, h := range hooks {
		if h.FailurePolicy != admissionregistrationv1.Fail || h.Policy != Name {
			t.Fatalf("hook %+v", h)
		}
	}
	reservations := metav1.GroupVersionResource{Group: Group, Version: Version, Resource: Resource}
	pods := metav1.GroupVersionResource{Version: "v1", Resource: "pods"}
	for _, c := range []struct {
		hook int
		res  metav1.GroupVersionResource
		op   admissionv1.Operation
		sub  string
		want bool
	}{
		{0, reservations, admissionv1.Create, "", true},
		{0, reservations, admissionv1.Update, "", false},
		{0, reservations, admissionv1.Create, "status", false},
		{0, pods, admissionv1.Create, "", false},
		{1, pods, admissionv1.Create, "", true},
		{1, pods, admissionv1.Update, "", true},
		{1, pods, admissionv1.Delete, "", false},
		{1, pods, admissionv1.Update, "status", false},
	} {
		r := &admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{Resource: c.res, Operation: c.op, SubResource: c.sub,
			Kind: metav1.GroupVersionKind{Group: c.res.Group, Version: c.res.Version}}}
		if got := hooks[c.hook].Matches(r); got != c.want {
			t.Errorf("hook %d %s %s/%s: matches %v, want %v", c.hook, c.op, c.res.Resource, c.sub, got, c.want)
		}
	}
}
