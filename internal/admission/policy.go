package admission

import (
	"context"

	"gomodules.xyz/jsonpatch/v2"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
)

// Request is one admission request as the API server sent it. Object.Raw and
// OldObject.Raw hold the JSON of the object (for a mutating chain, Object.Raw
// is the object as the previous mutators left it).
type Request struct {
	admissionv1.AdmissionRequest
}

// Validator decides on a request without changing the object.
type Validator interface {
	Validate(ctx context.Context, req *Request) Verdict
}

// Mutator decides on a request and may change the object. It returns the
// mutated object's JSON, or nil when it changed nothing. A mutator must be
// idempotent: the API server may call it again on its own output
// (reinvocationPolicy IfNeeded).
type Mutator interface {
	Mutate(ctx context.Context, req *Request) (mutated []byte, v Verdict)
}

// PatchMutator is a Mutator that can also state its change as a JSONPatch.
// MutatePatch returns the operations that turn req.Object.Raw into the object
// Mutate would return (nil when Mutate would return nil) and the same
// verdict. The handler uses it when the mutator is the only hook on its path:
// the response patch is then built from what the policy changed, and the whole
// object is neither re-encoded nor diffed. With several mutators on a path the
// chain calls Mutate and diffs, since each must see the previous one's output.
// MutatePatch returns ok false, and nothing else, when it cannot state the
// change exactly as a patch (say, the object spells a field it edits in an
// unusual way); the chain then calls Mutate and diffs.
type PatchMutator interface {
	Mutator
	MutatePatch(ctx context.Context, req *Request) (ops []jsonpatch.Operation, v Verdict, ok bool)
}

// ValidatorFunc adapts a function to Validator.
type ValidatorFunc func(ctx context.Context, req *Request) Verdict

// Validate calls f.
func (f ValidatorFunc) Validate(ctx context.Context, req *Request) Verdict { return f(ctx, req) }

// MutatorFunc adapts a function to Mutator.
type MutatorFunc func(ctx context.Context, req *Request) ([]byte, Verdict)

// Mutate calls f.
func (f MutatorFunc) Mutate(ctx context.Context, req *Request) ([]byte, Verdict) { return f(ctx, req) }

// Type tells whether a hook may change objects.
type Type string

const (
	// Mutating hooks run first and may change the object.
	Mutating Type = "Mutating"
	// Validating hooks run on the final object and never change it.
	Validating Type = "Validating"
)

// Hook is one policy's entry point on one path: what it handles (Rules), how
// the API server should treat a failure to call it (FailurePolicy), and the
// code that decides. Exactly one of Validator and Mutator is set, matching Type.
type Hook struct {
	// Policy is the policy's name, e.g. "pod-name"; webhooks are registered as
	// "<policy>.kadmit.io".
	Policy string
	// Path is the URL path the API server calls, e.g. "/validate-pod".
	// Several hooks of one Type may share a path; they run in order.
	Path string
	// Type is Mutating or Validating.
	Type Type
	// Rules are the resources (with subresources, e.g. "nodes/status") and
	// operations the hook handles; requests outside them skip the hook.
	Rules []admissionregistrationv1.RuleWithOperations
	// FailurePolicy is the default failurePolicy when kadmit registers the hook.
	FailurePolicy admissionregistrationv1.FailurePolicyType
	// Namespaces, when set, limits the registered webhook to exactly these
	// namespaces instead of "every namespace but kadmit's own, kube-system
	// and kadmit.io/ignore=true": for a policy that guards objects in
	// kadmit's own namespace, such as its configuration ConfigMap.
	Namespaces []string

	Validator Validator
	Mutator   Mutator
}

// Matches reports whether the request's resource, subresource and operation
// fall within the hook's rules. Group and version "*" match anything.
func (h *Hook) Matches(req *Request) bool {
	resource := req.Resource.Resource
	if req.SubResource != "" {
		resource += "/" + req.SubResource
	}
	for _, r := range h.Rules {
		if matchOp(r.Operations, req.Operation) &&
			matchAny(r.APIGroups, req.Resource.Group) &&
			matchAny(r.APIVersions, req.Resource.Version) &&
			matchResource(r.Resources, req.Resource.Resource, resource) {
			return true
		}
	}
	return false
}

func matchOp(ops []admissionregistrationv1.OperationType, op admissionv1.Operation) bool {
	for _, o := range ops {
		if o == admissionregistrationv1.OperationAll || string(o) == string(op) {
			return true
		}
	}
	return false
}

func matchAny(list []string, s string) bool {
	for _, v := range list {
		if v == "*" || v == s {
			return true
		}
	}
	return false
}

// matchResource follows the API server's rule matching: "*" is every resource
// without subresources, "*/*" everything, "pods/*" every pods subresource.
func matchResource(list []string, main, full string) bool {
	for _, v := range list {
		switch {
		case v == "*/*", v == full:
			return true
		case v == "*" && main == full:
			return true
		case len(v) > 2 && v[len(v)-2:] == "/*" && v[:len(v)-2] == main && main != full:
			return true
		case len(v) > 2 && v[:2] == "*/" && full != main && full[len(main)+1:] == v[2:]:
			return true
		}
	}
	return false
}
