package colocation

import (
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kadmit/kadmit/internal/admission"
)

// TestHooks checks the registration against upstream's markers: /mutate-pod
// (pod/mutating/webhooks.go:27; kadmit leaves out the UPDATE rule of line
// 28, whose handler does nothing) and /validate-pod CREATE, UPDATE
// (pod/validating/webhooks.go:28), failurePolicy Fail; disableValidation
// drops the second.
func TestHooks(t *testing.T) {
	p, _ := New(Config{}, nil)
	hooks := p.Hooks()
	if len(hooks) != 2 || hooks[0].Path != Path || hooks[0].Type != admission.Mutating || hooks[1].Path != ValidatePath ||
		hooks[1].Type != admission.Validating {
		t.Fatalf("hooks %+v", hooks)
	}
	pods := metav1.GroupVersionResource{Version: "v1", Resource: "pods"}
	for _, c := range []struct {
		hook int
		op   admissionv1.Operation
		sub  string
		want bool
	}{
		{0, admissionv1.Create, "", true}, {0, admissionv1.Update, "", false},
		{1, admissionv1.Create, "", true}, {1, admissionv1.Update, "", true},
		{1, admissionv1.Delete, "", false}, {1, admissionv1.Update, "status", false},
	} {
		if hooks[c.hook].FailurePolicy != admissionregistrationv1.Fail {
			t.Fatalf("hook %d failurePolicy %s", c.hook, hooks[c.hook].FailurePolicy)
		}
		r := &admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{Resource: pods, Operation: c.op, SubResource: c.sub}}
		if got := hooks[c.hook].Matches(r); got != c.want {
			t.Errorf("hook %d %s /%s: matches %v, want %v", c.hook, c.op, c.sub, got, c.want)
		}
	}
	off, _ := New(Config{DisableValidation: true}, nil)
	if hs := off.Hooks(); len(hs) != 1 || hs[0].Path != Path {
		t.Fatalf("disableValidation: hooks %+v", hs)
	}
}

// TestCaches: namespaces only for a namespaceSelector, PriorityClasses only
// for a priorityClassName; reservations never read namespaces.
func TestCaches(t *testing.T) {
	sel := &metav1.LabelSelector{}
	for _, c := range []struct {
		ps   []Profile
		ns   bool
		want int
	}{
		{nil, true, 0},
		{[]Profile{{Name: "a", NamespaceSelector: sel}}, true, 1},
		{[]Profile{{Name: "a", NamespaceSelector: sel}}, false, 0},
		{[]Profile{{Name: "a", NamespaceSelector: sel, PriorityClassName: "x"}}, true, 2},
		{[]Profile{{Name: "a", PriorityClassName: "x"}}, false, 1},
	} {
		if got := Caches(c.ps, c.ns); len(got) != c.want {
			t.Errorf("Caches(%+v, %v) = %v", c.ps, c.ns, got)
		}
	}
}
