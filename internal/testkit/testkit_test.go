package testkit

import (
	"fmt"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kadmit/kadmit/internal/admission"
)

func TestRequest(t *testing.T) {
	r := Request(admissionv1.Update, Nodes, `{"a":1}`, `{"a":0}`, Name("n1"), SubResource("status"), Namespace("ns"), UID("x"))
	if r.Operation != admissionv1.Update || r.Resource != Nodes || r.Name != "n1" || r.SubResource != "status" ||
		r.Namespace != "ns" || r.UID != "x" || string(r.Object.Raw) != `{"a":1}` || string(r.OldObject.Raw) != `{"a":0}` {
		t.Fatalf("Request = %+v", r.AdmissionRequest)
	}
	d := Request[[]byte](admissionv1.Delete, ConfigMaps, nil, []byte(`{}`))
	if d.UID != "u" || d.Object.Raw != nil || string(d.OldObject.Raw) != `{}` {
		t.Fatalf("DELETE: %+v, want no object, the old one and uid u", d.AdmissionRequest)
	}
	p := PodRequest(admissionv1.Create, `{}`, "", Requested())
	if *p.RequestKind != p.Kind || *p.RequestResource != p.Resource || p.RequestKind == &p.Kind {
		t.Fatalf("Requested: %v %v, want copies of kind and resource", p.RequestKind, p.RequestResource)
	}
	if p.Kind != (metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}) || p.Resource != Pods || p.OldObject.Raw != nil {
		t.Fatalf("PodRequest = %+v", p.AdmissionRequest)
	}
}

// recorder is a testing.TB whose Fatalf records instead of ending the test.
type recorder struct {
	*testing.T
	failed string
}

func (r *recorder) Fatalf(format string, args ...any) { r.failed = fmt.Sprintf(format, args...) }

func TestEventually(t *testing.T) {
	n := 0
	Eventually(t, time.Second, "third call", func() bool { n++; return n == 3 })
	if n != 3 {
		t.Fatalf("cond called %d times, want 3", n)
	}

	rec := &recorder{T: t}
	start := time.Now()
	Eventually(rec, 50*time.Millisecond, "never", func() bool { return false })
	if !strings.Contains(rec.failed, "timed out after 50ms waiting for never") {
		t.Fatalf("failure = %q", rec.failed)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("a 50ms wait took %s", d)
	}
}

func TestEventuallyNil(t *testing.T) {
	n := 0
	EventuallyNil(t, time.Second, "second call", func() error {
		if n++; n < 2 {
			return fmt.Errorf("call %d", n)
		}
		return nil
	})
	rec := &recorder{T: t}
	EventuallyNil(rec, 30*time.Millisecond, "budget drained", func() error { return fmt.Errorf("used %d, want 0", 7) })
	if rec.failed != "budget drained: not within 30ms: used 7, want 0" {
		t.Fatalf("failure = %q", rec.failed)
	}
}

func TestReviewBody(t *testing.T) {
	b := ReviewBody(PodRequest(admissionv1.Create, `{"kind":"Pod"}`, "", UID("uid-9"), Name("p")))
	r, err := admission.DecodeReview(b)
	if err != nil {
		t.Fatal(err)
	}
	if r.APIVersion != admission.APIVersionV1 || r.Kind != admission.ReviewKind || r.Request.UID != "uid-9" ||
		r.Request.Name != "p" || r.Request.Kind.Kind != "Pod" || string(r.Request.Object.Raw) != `{"kind":"Pod"}` {
		t.Fatalf("decoded %s as %+v", b, r.Request)
	}
}
