package admission

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/kadmit/kadmit/internal/jsonedit"
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
// request.uid is missing. The result is the API server's decoder's into
// Review (jsonedit.Unmarshal: sigs.k8s.io/json, member names matched
// case-sensitively); the fields the API server sends are read without
// reflection (envelope.go), request.object and oldObject are checked and
// copied but not parsed.
func DecodeReview(body []byte) (*Review, error) {
	r, _, err := decodeRequest(body)
	return r, err
}

// decodeRequest is DecodeReview that also returns the review's request as
// a Request, whose ObjectDoc reuses the scan of request.object.
func decodeRequest(body []byte) (*Review, *Request, error) {
	var r *Review
	var req *Request
	if blk, ok := decodeEnvelope(body); ok {
		r = &blk.review
		req = &blk.req
	} else {
		r = &Review{}
		if err := jsonedit.Unmarshal(body, r); err != nil {
			return nil, nil, fmt.Errorf("%w: %s", ErrMalformedReview, oneLine(err.Error()))
		}
	}
	if r.APIVersion != APIVersionV1 && r.APIVersion != APIVersionV1beta1 {
		return nil, nil, fmt.Errorf("%w: apiVersion %q is not %s or %s", ErrMalformedReview, r.APIVersion, APIVersionV1, APIVersionV1beta1)
	}
	if r.Kind != ReviewKind {
		return nil, nil, fmt.Errorf("%w: kind %q is not %s", ErrMalformedReview, r.Kind, ReviewKind)
	}
	if r.Request == nil {
		return nil, nil, fmt.Errorf("%w: request is missing", ErrMalformedReview)
	}
	if r.Request.UID == "" {
		return nil, nil, fmt.Errorf("%w: request.uid is missing", ErrMalformedReview)
	}
	if req == nil {
		req = &Request{AdmissionRequest: *r.Request}
	}
	return r, req, nil
}

// EncodeResponse renders the AdmissionReview answering a request of the given
// apiVersion. The API server rejects a response whose apiVersion/kind differs
// from the request's, whose uid differs, or whose patch is set without
// patchType (or on a validating webhook); callers pass a response that obeys
// these rules and EncodeResponse keeps the envelope right.
func EncodeResponse(apiVersion string, resp *admissionv1.AdmissionResponse) ([]byte, error) {
	return appendEncodedResponse(nil, apiVersion, resp)
}

// appendEncodedResponse is EncodeResponse appending to b (which the fast
// path reuses; nil allocates).
func appendEncodedResponse(b []byte, apiVersion string, resp *admissionv1.AdmissionResponse) ([]byte, error) {
	if apiVersion == "" {
		apiVersion = APIVersionV1
	}
	if b, ok := appendResponse(b, apiVersion, resp); ok {
		return b, nil
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

// appendResponse appends the AdmissionReview EncodeResponse writes, as
// encoding/json with SetEscapeHTML(false) writes it (field order, omitempty,
// sorted audit annotation keys, base64 patch, trailing newline), without
// reflection, for a response without a Status: every allowed answer. ok is
// false for no response or a denial (metav1.Status has many fields; encoding/json writes
// it). Strings are escaped by jsonedit.AppendString, which writes \b and \f
// as \u0008 and \u000c where encoding/json writes \b and \f: the same
// JSON string.
func appendResponse(b []byte, apiVersion string, resp *admissionv1.AdmissionResponse) ([]byte, bool) {
	if resp == nil || resp.Result != nil {
		return nil, false
	}
	b = slices.Grow(b[:0], 256+len(resp.Patch)*4/3)
	b = append(b, `{"apiVersion":`...)
	b = jsonedit.AppendString(b, apiVersion)
	b = append(b, `,"kind":"`+ReviewKind+`","response":{"uid":`...)
	b = jsonedit.AppendString(b, string(resp.UID))
	if resp.Allowed {
		b = append(b, `,"allowed":true`...)
	} else {
		b = append(b, `,"allowed":false`...)
	}
	if len(resp.Patch) > 0 {
		b = append(b, `,"patch":"`...)
		b = base64.StdEncoding.AppendEncode(b, resp.Patch)
		b = append(b, '"')
	}
	if resp.PatchType != nil {
		b = append(b, `,"patchType":`...)
		b = jsonedit.AppendString(b, string(*resp.PatchType))
	}
	if len(resp.AuditAnnotations) > 0 {
		b = append(b, `,"auditAnnotations":{`...)
		for i, k := range slices.Sorted(maps.Keys(resp.AuditAnnotations)) {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(jsonedit.AppendString(b, k), ':')
			b = jsonedit.AppendString(b, resp.AuditAnnotations[k])
		}
		b = append(b, '}')
	}
	if len(resp.Warnings) > 0 {
		b = append(b, `,"warnings":[`...)
		for i, w := range resp.Warnings {
			if i > 0 {
				b = append(b, ',')
			}
			b = jsonedit.AppendString(b, w)
		}
		b = append(b, ']')
	}
	return append(b, "}}\n"...), true
}
