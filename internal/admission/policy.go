package admission

import (
	"context"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"

	"github.com/kadmit/kadmit/internal/jsonedit"
)

// Request is one admission request as the API server sent it. Object.Raw and
// OldObject.Raw hold the JSON of the object (for a mutating chain, Object.Raw
// is the object as the previous mutators left it).
type Request struct {
	admissionv1.AdmissionRequest

	// objectIndex locates Object.Raw's top-level members, from the
	// envelope decoder's scan of the body; nil when there is none. It is
	// read-only and used only while Object.Raw is the bytes it was built
	// for (jsonedit.NewDocIndexed checks).
	objectIndex *jsonedit.Index
}

// ObjectDoc returns a new jsonedit.Doc over req.Object.Raw: what
// jsonedit.NewDoc(req.Object.Raw) returns, but when the object is the one
// the API server sent (every validator, and the first mutator on a path),
// the Doc starts from the member index DecodeReview built while scanning
// the body, instead of scanning the object's top level again. Policies read
// and edit the request's object through it.
func (req *Request) ObjectDoc() *jsonedit.Doc {
	return jsonedit.NewDocIndexed(req.Object.Raw, req.objectIndex)
}

// Validator decides on a request without changing the object.
type Validator interface {
	Validate(ctx context.Context, req *Request) Verdict
}

// Bounded is implemented by a Validator or Mutator whose review always
// ends soon, whatever the request: its cost is bounded by the request's
// size (any loop whose length the cluster sets checks ctx), and it never
// waits on I/O, on a lock held across I/O, or on another request. A
// handler whose hooks are all Bounded runs each review on the request's
// own goroutine. The others run on a review goroutine the handler can
// abandon at the deadline (answering 500 while the policy runs on), and
// the handoff to it and back costs CPU and, on a saturated core, lets each
// review jump ahead of the connections the network poller readied (the Go
// scheduler runs a goroutine woken by a channel next): at one core and
// c=64, the p99 of a mutating review doubles (docs/performance.md,
// "Tail latency at one core"). The built-in policies implement it;
// declared policies do not (a CEL evaluation checks its interrupt only
// between steps), so a path with one of their hooks keeps the review
// goroutine.
type Bounded interface {
	// BoundedReview marks the type; it is never called.
	BoundedReview()
}

// Mutator decides on a request and may change the object. It returns the
// JSONPatch operations (add, remove, replace; see package jsonedit, which
// builds them) that turn req.Object.Raw, exactly as given, into the object
// it wants, or none when it changes nothing. The webhook applies them only
// when another mutator follows on the same path, and answers the API server
// with the operations of every mutator, concatenated. A mutator must be
// idempotent: the API server may call it again on its own output
// (reinvocationPolicy IfNeeded).
type Mutator interface {
	Mutate(ctx context.Context, req *Request) ([]jsonedit.Op, Verdict)
}

// GroupMutator is a Mutator that can run with the other GroupMutators of
// its group in one call: the hooks of the declared MutatingAdmissionPolicies
// of one engine, which decode the object once, run each policy on that one
// decoded copy in order and encode the result once, as the API server's
// MutatingAdmissionPolicy plugin runs them all in one dispatcher
// (k8s.io/apiserver v0.37.1 pkg/admission/plugin/policy/mutating/
// dispatcher.go dispatchInvocations). Webhook.Review hands a group the
// matched hooks of a path that follow each other with no other matched
// hook between them: a run of one group's hooks; a built-in mutator
// between two of them ends the run, so it still sees the first one's
// result and the second sees its.
type GroupMutator interface {
	Mutator
	// MutatorGroup names the group: hooks whose MutatorGroup values are
	// equal (==) run together. It must be comparable (a pointer, say).
	MutatorGroup() any
	// MutateGroup runs run, the Mutators of consecutive hooks of the group
	// (the receiver is run[0]), in order on req, and returns the JSONPatch
	// operations that turn req.Object.Raw into the object all of them
	// made (none when it is unchanged). It calls enter(i) before member i
	// runs (so a panic is charged to the member running) and hands the
	// member's verdict to verdict(i, v) once it is decided; a member may
	// run more than once (a reinvocation pass), in the order the group
	// runs them. When verdict returns false (the chain ended: a denial, or
	// a review without decision) MutateGroup returns at once and its
	// operations are ignored.
	MutateGroup(ctx context.Context, req *Request, run []Mutator, enter func(i int), verdict func(i int, v Verdict) bool) []jsonedit.Op
}

// ValidatorFunc adapts a function to Validator.
type ValidatorFunc func(ctx context.Context, req *Request) Verdict

// Validate calls f.
func (f ValidatorFunc) Validate(ctx context.Context, req *Request) Verdict { return f(ctx, req) }

// MutatorFunc adapts a function to Mutator.
type MutatorFunc func(ctx context.Context, req *Request) ([]jsonedit.Op, Verdict)

// Mutate calls f.
func (f MutatorFunc) Mutate(ctx context.Context, req *Request) ([]jsonedit.Op, Verdict) {
	return f(ctx, req)
}

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
	// ReinvocationPolicy of a Mutating hook: whether the API server calls
	// the hook's path once more when a later mutating webhook or policy
	// changed the object. Nil means IfNeeded (kadmit's built-in mutators
	// are idempotent and want to see the object other mutators made);
	// Never is a declared MutatingAdmissionPolicy's default. Registration
	// writes one reinvocationPolicy per path: IfNeeded when any hook on the
	// path asks for it (or leaves it nil), Never only when every hook says
	// Never. Ignored for Validating hooks.
	ReinvocationPolicy *admissionregistrationv1.ReinvocationPolicyType

	Validator Validator
	Mutator   Mutator
}

// Matches reports whether the request's resource, subresource, operation and
// namespace fall within the hook's rules, as the API server decides it (see
// MatchRules).
func (h *Hook) Matches(req *Request) bool {
	return MatchRules(h.Rules, RuleAttributes(req))
}
