package admission

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/kadmit/kadmit/internal/jsonedit"
)

func FuzzDecodeReview(f *testing.F) {
	f.Add(reviewBody(APIVersionV1, "u", podJSON))
	f.Add(reviewBody(APIVersionV1beta1, "u", `null`))
	f.Add([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":""}}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		rev, err := DecodeReview(body)
		if err != nil {
			return
		}
		if rev.Request == nil || rev.Request.UID == "" {
			t.Fatalf("accepted a review without request uid: %q", body)
		}
		if _, err := EncodeResponse(rev.APIVersion, nil); err != nil {
			t.Fatal(err)
		}
	})
}

// FuzzServeHTTP checks the handler never panics and always answers with a
// status code, and a 200 always carries the request's uid.
func FuzzServeHTTP(f *testing.F) {
	f.Add(reviewBody(APIVersionV1, "u", podJSON))
	f.Add(reviewBody(APIVersionV1beta1, "x", `{"metadata":{"name":"p"}}`))
	f.Add([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","object":[1,2]}}`))
	wh := mutating(func(_ context.Context, req *Request) ([]jsonedit.Op, Verdict) {
		d := jsonedit.NewDoc(req.Object.Raw)
		if err := d.Set(1, "x"); err != nil {
			return nil, Invalid("object: %v", err)
		}
		return d.Ops(), Allow()
	})
	h := NewHandler(wh, HandlerOptions{MaxRequestBytes: 1 << 16})
	f.Fuzz(func(t *testing.T, body []byte) {
		r := httptest.NewRequest(http.MethodPost, "/mutate", bytes.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusOK {
			return
		}
		var rev Review
		if err := json.Unmarshal(w.Body.Bytes(), &rev); err != nil || rev.Response == nil || rev.Response.UID == "" {
			t.Fatalf("200 without a valid review: %s", w.Body.String())
		}
	})
}
