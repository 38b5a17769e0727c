package admission

import (
	"fmt"
	"net/http"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MaxWarningLength is the longest warning kadmit sends, in characters. The API
// server truncates longer ones and kubectl prints each on one line, so policies
// keep them short and the handler enforces the bound.
const MaxWarningLength = 120

// Verdict is what one policy decides about one request.
//
// The zero Verdict denies with no message: a policy that forgets to decide
// fails closed. Build verdicts with Allow, Deny, Invalid or Errored.
type Verdict struct {
	// Allowed is true when the policy admits the request.
	Allowed bool
	// Code is the HTTP-style status code of a denial: 403 for a policy
	// denial, 400 for object content the policy cannot read, 500 for a
	// policy failure. Ignored when Allowed.
	Code int32
	// Reason is the machine-readable metav1.StatusReason of a denial.
	Reason metav1.StatusReason
	// Message is shown to the user by the API server; it says what to change.
	Message string
	// Warnings are returned to the client even when allowed; each is at most
	// MaxWarningLength characters (longer ones are truncated by the handler).
	Warnings []string
	// AuditAnnotations are added to the audit event; the API server prefixes
	// each key with the webhook name.
	AuditAnnotations map[string]string

	// unanswered, set by Unanswered, makes the review end without a
	// decision (see StatusError).
	unanswered *StatusError
}

// Allow admits the request, optionally with warnings.
func Allow(warnings ...string) Verdict {
	return Verdict{Allowed: true, Warnings: warnings}
}

// Deny refuses the request on policy grounds: code 403, reason Forbidden.
func Deny(format string, args ...any) Verdict {
	return Verdict{Code: http.StatusForbidden, Reason: metav1.StatusReasonForbidden, Message: fmt.Sprintf(format, args...)}
}

// Invalid refuses the request because the object's content is malformed for the
// policy (a bad annotation value, say): code 400, reason BadRequest.
func Invalid(format string, args ...any) Verdict {
	return Verdict{Code: http.StatusBadRequest, Reason: metav1.StatusReasonBadRequest, Message: fmt.Sprintf(format, args...)}
}

// Errored refuses the request because the policy itself failed: code is the
// HTTP status (500 when 0), reason InternalError.
func Errored(code int32, err error) Verdict {
	if code == 0 {
		code = http.StatusInternalServerError
	}
	return Verdict{Code: code, Reason: metav1.StatusReasonInternalError, Message: err.Error()}
}

// WithWarnings returns v with warnings appended.
func (v Verdict) WithWarnings(warnings ...string) Verdict {
	v.Warnings = append(v.Warnings, warnings...)
	return v
}

// WithAuditAnnotation returns v with one audit annotation added.
func (v Verdict) WithAuditAnnotation(key, value string) Verdict {
	m := make(map[string]string, len(v.AuditAnnotations)+1)
	for k, val := range v.AuditAnnotations {
		m[k] = val
	}
	m[key] = value
	v.AuditAnnotations = m
	return v
}
