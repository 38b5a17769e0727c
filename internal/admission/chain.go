package admission

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime/debug"
	"slices"

	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// PanicError is returned by Webhook.Review when a policy panicked. The server
// answers it with HTTP 500 so the webhook's failurePolicy applies, instead of a
// made-up admission decision.
type PanicError struct {
	Policy string
	Value  any
	Stack  []byte
}

func (e *PanicError) Error() string {
	return fmt.Sprintf("policy %s panicked: %v", e.Policy, e.Value)
}

// Webhook is the set of hooks served on one path, run in order. All hooks of a
// webhook have the same Type.
type Webhook struct {
	Path  string
	Type  Type
	Hooks []Hook
}

// Outcome is what a webhook decided about one request.
type Outcome struct {
	// Response is the AdmissionResponse to send, uid already set.
	Response *admissionv1.AdmissionResponse
	// Patch is the JSONPatch from the request's object to Object; nil when
	// nothing changed or the webhook is validating.
	Patch []jsonpatch.Operation
	// Object is the object after every mutator ran (the request's own object
	// when nothing changed).
	Object []byte
	// Policy names the hook that denied, or "" when allowed.
	Policy string
	// Matched is how many hooks matched the request.
	Matched int
}

// NewWebhooks groups hooks by path, keeping their order. It returns an error
// when a path mixes mutating and validating hooks, a hook's Type disagrees with
// its Validator/Mutator, or a path is empty.
func NewWebhooks(hooks []Hook) ([]*Webhook, error) {
	byPath := map[string]*Webhook{}
	var out []*Webhook
	for _, h := range hooks {
		if h.Path == "" || h.Path[0] != '/' {
			return nil, fmt.Errorf("policy %s: path %q must start with /", h.Policy, h.Path)
		}
		switch {
		case h.Type == Mutating && h.Mutator == nil, h.Type == Validating && h.Validator == nil,
			h.Type != Mutating && h.Type != Validating:
			return nil, fmt.Errorf("policy %s: hook on %s has type %q without a matching implementation", h.Policy, h.Path, h.Type)
		}
		wh := byPath[h.Path]
		if wh == nil {
			wh = &Webhook{Path: h.Path, Type: h.Type}
			byPath[h.Path] = wh
			out = append(out, wh)
		}
		if wh.Type != h.Type {
			return nil, fmt.Errorf("path %s mixes %s and %s hooks", h.Path, wh.Type, h.Type)
		}
		wh.Hooks = append(wh.Hooks, h)
	}
	return out, nil
}

// Review runs the webhook's hooks that match req, in order, and builds the
// response. Mutators see the object as the previous ones left it and the
// response patch is computed once, from the request's object to the final one.
// The first denial ends the chain; warnings and audit annotations accumulate.
// A panicking policy yields a *PanicError and no outcome.
func (w *Webhook) Review(ctx context.Context, req *Request) (out Outcome, err error) {
	return w.review(ctx, req, false)
}

// review is Review; with patchOnly, a webhook whose only hook is a
// PatchMutator gets its patch from MutatePatch instead of Mutate and a diff,
// and the Outcome's Object is then nil (the HTTP handler never reads it).
func (w *Webhook) review(ctx context.Context, req *Request, patchOnly bool) (out Outcome, err error) {
	if patchOnly && w.Type == Mutating && len(w.Hooks) == 1 {
		if pm, ok := w.Hooks[0].Mutator.(PatchMutator); ok {
			if out, ok, err := w.reviewPatch(ctx, req, pm); ok || err != nil {
				return out, err
			}
		}
	}
	resp := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	out = Outcome{Response: resp, Object: req.Object.Raw}
	cur := *req
	var audit map[string]string
	for i := range w.Hooks {
		h := &w.Hooks[i]
		if !h.Matches(req) {
			continue
		}
		out.Matched++
		var v Verdict
		var mutated []byte
		if err := callPolicy(h.Policy, func() {
			if w.Type == Mutating {
				mutated, v = h.Mutator.Mutate(ctx, &cur)
			} else {
				v = h.Validator.Validate(ctx, &cur)
			}
		}); err != nil {
			return Outcome{}, err
		}
		resp.Warnings = append(resp.Warnings, v.Warnings...)
		for k, val := range v.AuditAnnotations {
			if !validAuditKey(k) {
				resp.Warnings = append(resp.Warnings, fmt.Sprintf("kadmit: policy %s: dropped invalid audit annotation key %q", h.Policy, k))
				continue
			}
			if audit == nil {
				audit = map[string]string{}
			}
			audit[k] = val
		}
		if !v.Allowed {
			resp.Allowed = false
			resp.Result = &metav1.Status{
				Status:  metav1.StatusFailure,
				Code:    v.Code,
				Reason:  v.Reason,
				Message: v.Message,
			}
			if resp.Result.Code == 0 {
				resp.Result.Code = 403
			}
			if resp.Result.Message == "" {
				resp.Result.Message = fmt.Sprintf("denied by kadmit policy %s", h.Policy)
			}
			out.Policy = h.Policy
			break
		}
		if mutated != nil {
			cur.Object.Raw = mutated
			cur.Object.Object = nil
		}
	}
	resp.Warnings = sanitizeWarnings(resp.Warnings)
	resp.AuditAnnotations = audit
	if !resp.Allowed || w.Type != Mutating || slices.Equal(cur.Object.Raw, req.Object.Raw) {
		return out, nil
	}
	ops, err := jsonpatch.CreatePatch(req.Object.Raw, cur.Object.Raw)
	if err != nil {
		return Outcome{}, fmt.Errorf("build JSONPatch for %s: %w", w.Path, err)
	}
	out.Object = cur.Object.Raw
	if len(ops) == 0 {
		return out, nil
	}
	patch, err := json.Marshal(ops)
	if err != nil {
		return Outcome{}, fmt.Errorf("encode JSONPatch for %s: %w", w.Path, err)
	}
	pt := admissionv1.PatchTypeJSONPatch
	resp.Patch, resp.PatchType = patch, &pt
	out.Patch = ops
	return out, nil
}

// reviewPatch is review for a webhook whose single hook is pm: the same
// response as the chain gives, with pm's operations as the patch. ok is false
// when pm declined; the caller then runs the chain.
func (w *Webhook) reviewPatch(ctx context.Context, req *Request, pm PatchMutator) (_ Outcome, ok bool, _ error) {
	h := &w.Hooks[0]
	resp := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	out := Outcome{Response: resp}
	if !h.Matches(req) {
		out.Object = req.Object.Raw
		return out, true, nil
	}
	out.Matched = 1
	var ops []jsonpatch.Operation
	var v Verdict
	if err := callPolicy(h.Policy, func() { ops, v, ok = pm.MutatePatch(ctx, req) }); err != nil {
		return Outcome{}, false, err
	}
	if !ok {
		return Outcome{}, false, nil
	}
	resp.Warnings = append([]string(nil), v.Warnings...)
	for k, val := range v.AuditAnnotations {
		if !validAuditKey(k) {
			resp.Warnings = append(resp.Warnings, fmt.Sprintf("kadmit: policy %s: dropped invalid audit annotation key %q", h.Policy, k))
			continue
		}
		if resp.AuditAnnotations == nil {
			resp.AuditAnnotations = map[string]string{}
		}
		resp.AuditAnnotations[k] = val
	}
	resp.Warnings = sanitizeWarnings(resp.Warnings)
	if !v.Allowed {
		resp.Allowed = false
		resp.Result = &metav1.Status{Status: metav1.StatusFailure, Code: v.Code, Reason: v.Reason, Message: v.Message}
		if resp.Result.Code == 0 {
			resp.Result.Code = 403
		}
		if resp.Result.Message == "" {
			resp.Result.Message = fmt.Sprintf("denied by kadmit policy %s", h.Policy)
		}
		out.Policy = h.Policy
		return out, true, nil
	}
	if len(ops) == 0 {
		out.Object = req.Object.Raw
		return out, true, nil
	}
	patch, err := json.Marshal(ops)
	if err != nil {
		return Outcome{}, false, fmt.Errorf("encode JSONPatch for %s: %w", w.Path, err)
	}
	pt := admissionv1.PatchTypeJSONPatch
	resp.Patch, resp.PatchType = patch, &pt
	out.Patch = ops
	return out, true, nil
}

func callPolicy(policy string, f func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &PanicError{Policy: policy, Value: r, Stack: debug.Stack()}
		}
	}()
	f()
	return nil
}
