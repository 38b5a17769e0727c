package admission

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// The AdmissionReview API versions kadmit serves. v1beta1 has the same JSON
// shape as v1; the response must carry the version the request used.
const (
	APIVersionV1      = "admission.k8s.io/v1"
	APIVersionV1beta1 = "admission.k8s.io/v1beta1"
	ReviewKind        = "AdmissionReview"
)

// ErrMalformedReview is wrapped by every DecodeReview error: the body is not an
// AdmissionReview kadmit can answer. Such requests get HTTP 400.
var ErrMalformedReview = errors.New("malformed AdmissionReview")

// Review is an AdmissionReview of either served version, as JSON sees it.
type Review struct {
	APIVersion string                         `json:"apiVersion"`
	Kind       string                         `json:"kind"`
	Request    *admissionv1.AdmissionRequest  `json:"request,omitempty"`
	Response   *admissionv1.AdmissionResponse `json:"response,omitempty"`
}

// DecodeReview parses an AdmissionReview request body (JSON, either version).
// It returns an error wrapping ErrMalformedReview when the JSON is invalid, the
// apiVersion or kind is not an AdmissionReview kadmit serves, or request or
// request.uid is missing.
func DecodeReview(body []byte) (*Review, error) {
	var r Review
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("%w: %s", ErrMalformedReview, oneLine(err.Error()))
	}
	if r.APIVersion != APIVersionV1 && r.APIVersion != APIVersionV1beta1 {
		return nil, fmt.Errorf("%w: apiVersion %q is not %s or %s", ErrMalformedReview, r.APIVersion, APIVersionV1, APIVersionV1beta1)
	}
	if r.Kind != ReviewKind {
		return nil, fmt.Errorf("%w: kind %q is not %s", ErrMalformedReview, r.Kind, ReviewKind)
	}
	if r.Request == nil {
		return nil, fmt.Errorf("%w: request is missing", ErrMalformedReview)
	}
	if r.Request.UID == "" {
		return nil, fmt.Errorf("%w: request.uid is missing", ErrMalformedReview)
	}
	return &r, nil
}

// EncodeResponse renders the AdmissionReview answering a request of the given
// apiVersion. The API server rejects a response whose apiVersion/kind differs
// from the request's, whose uid differs, or whose patch is set without
// patchType (or on a validating webhook); callers pass a response that obeys
// these rules and EncodeResponse keeps the envelope right.
func EncodeResponse(apiVersion string, resp *admissionv1.AdmissionResponse) ([]byte, error) {
	if apiVersion == "" {
		apiVersion = APIVersionV1
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(Review{APIVersion: apiVersion, Kind: ReviewKind, Response: resp}); err != nil {
		return nil, fmt.Errorf("encode AdmissionReview response %s: %w", resp.UID, err)
	}
	return buf.Bytes(), nil
}

// sanitizeWarnings drops empty warnings and truncates long ones: the API
// server and kubectl expect short single-line text.
func sanitizeWarnings(in []string) []string {
	if len(in) == 0 {
		return nil
	}
	out := make([]string, 0, len(in))
	for _, w := range in {
		w = oneLine(w)
		if w == "" {
			continue
		}
		if r := []rune(w); len(r) > MaxWarningLength {
			w = string(r[:MaxWarningLength-3]) + "..."
		}
		out = append(out, w)
	}
	return out
}

// validAuditKey reports whether the API server accepts key as an audit
// annotation key: it must be a valid qualified name once prefixed with the
// webhook name, so we require the unprefixed part to be one.
func validAuditKey(key string) bool {
	return len(validation.IsQualifiedName(key)) == 0
}

func oneLine(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c == '\n' || c == '\r' || c == '\t' {
			b[i] = ' '
		}
	}
	return string(bytes.TrimSpace(b))
}
