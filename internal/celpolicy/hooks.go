package celpolicy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	apiserveradmission "k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/admission/plugin/policy/mutating"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/jsonedit"
)

// The paths kadmit serves declared policies on. Every ValidatingAdmission-
// Policy is one hook on ValidatePath, every MutatingAdmissionPolicy one hook
// on MutatePath (the ones a request matches served in one run), in the
// order they were loaded.
const (
	ValidatePath = "/validate-policies"
	MutatePath   = "/mutate-policies"
)

// HookName is the admission.Hook Policy name of a declared policy, so its
// webhook registers as "<HookName>.kadmit.io": "vap-<name>" or "map-<name>".
func HookName(kind admission.Type, policy string) string {
	if kind == admission.Mutating {
		return "map-" + policy
	}
	return "vap-" + policy
}

// Hooks returns one admission.Hook per policy of the engine. A hook's Rules
// are its policy's matchConstraints.resourceRules (operations, groups,
// versions, resources, scope; resourceNames, excludeResourceRules,
// selectors and matchPolicy are applied by the engine, which the API
// server's matcher decides exactly); its FailurePolicy is the policy's,
// the webhook's answer when kadmit cannot be reached. Each hook decides
// for its own policy only: the chain's first denial ends it, as in-tree the
// first denial's message is the one returned. The mutating hooks a request
// reaches one after another run together on one decoded copy of the
// object (mapHook, admission.GroupMutator). A mutating hook carries its
// policy's reinvocationPolicy (the loader requires one, as the API server
// does; Never for a Set built in code without it); the
// webhook on MutatePath is registered IfNeeded when any policy asks for it
// (registration.Build).
func (e *Engine) Hooks() []admission.Hook {
	var out []admission.Hook
	for i, h := range e.mutating {
		p := h.Policy
		name := p.Name
		reinvoke := p.Spec.ReinvocationPolicy
		if reinvoke == "" {
			reinvoke = admissionregistrationv1.NeverReinvocationPolicy
		}
		out = append(out, admission.Hook{
			Policy:             HookName(admission.Mutating, name),
			Path:               MutatePath,
			Type:               admission.Mutating,
			Rules:              webhookRules(p.Spec.MatchConstraints, true),
			FailurePolicy:      *p.Spec.FailurePolicy,
			ReinvocationPolicy: &reinvoke,
			Mutator:            mapHook{e: e, i: i},
		})
	}
	for _, h := range e.validating {
		p := h.Policy
		name := p.Name
		out = append(out, admission.Hook{
			Policy:        HookName(admission.Validating, name),
			Path:          ValidatePath,
			Type:          admission.Validating,
			Rules:         webhookRules(p.Spec.MatchConstraints, false),
			FailurePolicy: *p.Spec.FailurePolicy,
			Validator: admission.ValidatorFunc(func(ctx context.Context, req *admission.Request) admission.Verdict {
				return e.serveValidate(ctx, name, req)
			}),
		})
	}
	return out
}

// webhookRules turns matchConstraints.resourceRules into webhook rules.
// A mutating policy never sees DELETE (mutating/plugin.go NewPlugin), so
// that operation is dropped from its rules; a rule left with none is
// dropped.
func webhookRules(m *admissionregistrationv1.MatchResources, mutating bool) []admissionregistrationv1.RuleWithOperations {
	if m == nil {
		return nil
	}
	var out []admissionregistrationv1.RuleWithOperations
	for _, r := range m.ResourceRules {
		rule := r.RuleWithOperations
		if mutating {
			var ops []admissionregistrationv1.OperationType
			for _, op := range rule.Operations {
				switch op {
				case admissionregistrationv1.Delete:
				case admissionregistrationv1.OperationAll:
					ops = append(ops, admissionregistrationv1.Create, admissionregistrationv1.Update, admissionregistrationv1.Connect)
				default:
					ops = append(ops, op)
				}
			}
			if len(ops) == 0 {
				continue
			}
			rule.Operations = ops
		}
		out = append(out, rule)
	}
	return out
}

// FromAdmission turns an AdmissionRequest into the engine's Request.
func FromAdmission(req *admission.Request) *Request {
	r := &Request{
		Kind:        schema.GroupVersionKind{Group: req.Kind.Group, Version: req.Kind.Version, Kind: req.Kind.Kind},
		Resource:    schema.GroupVersionResource{Group: req.Resource.Group, Version: req.Resource.Version, Resource: req.Resource.Resource},
		SubResource: req.SubResource,
		Name:        req.Name,
		Namespace:   req.Namespace,
		Operation:   apiserveradmission.Operation(req.Operation),
		Object:      req.Object.Raw,
		OldObject:   req.OldObject.Raw,
		Options:     req.Options.Raw,
		UserInfo:    req.UserInfo,
	}
	if req.DryRun != nil {
		r.DryRun = *req.DryRun
	}
	if len(r.Object) == 0 {
		r.Object = nil
	}
	if len(r.OldObject) == 0 {
		r.OldObject = nil
	}
	return r
}

func (e *Engine) serveValidate(ctx context.Context, policy string, req *admission.Request) admission.Verdict {
	if err := ctx.Err(); err != nil {
		// The review was abandoned at its deadline (its answer, a 500, is
		// sent): the policies after the one that overran do not run.
		return notEvaluated(http.StatusInternalServerError, policy, admission.Validating, err)
	}
	if err := e.checkSize(req); err != nil {
		return unanswered(policy, admission.Validating, err)
	}
	r := FromAdmission(req)
	if len(e.validating) > 1 {
		r.shared = e.decoded.get(ctx, req)
		defer r.shared.m.leave()
	}
	if r.shared == nil || r.shared.m == nil {
		// Decoding for this hook alone (see decoded.meterFor): a shared
		// entry charges its own meter, so a hook on one needs none.
		r.meter = newMeter(e.budget)
		defer r.meter.release()
	}
	d, err := e.ValidatePolicy(ctx, policy, r)
	if err != nil {
		if v, ok := bounded(policy, admission.Validating, err); ok {
			return v
		}
		return admission.Invalid("ValidatingAdmissionPolicy '%s': %v", policy, err)
	}
	return asVerdict(d)
}

// mapHook is the Mutator of one MutatingAdmissionPolicy's hook. The
// hooks of one engine are one admission.GroupMutator group: a run of them
// that the chain reaches with no other hook between (every MAP of the
// engine matching a request, unless a built-in mutator shares the path)
// is served by one serveMutateGroup, which decodes the object once, runs
// each policy on that copy in order (with the API server's reinvocation
// across them) and encodes and diffs the result once, where a hook per
// policy would decode, encode and diff the object once per policy.
type mapHook struct {
	e *Engine
	i int // its policy's index in e.mutating
}

// Mutate serves the policy alone: a run of one.
func (h mapHook) Mutate(ctx context.Context, req *admission.Request) ([]jsonedit.Op, admission.Verdict) {
	v := admission.Allow()
	ops := h.MutateGroup(ctx, req, []admission.Mutator{h}, func(int) {}, func(_ int, pv admission.Verdict) bool {
		// The verdicts of its passes, folded: warnings and audit
		// annotations add up, a denial (or a review without decision)
		// ends it with what came before.
		pv.Warnings = append(v.Warnings, pv.Warnings...)
		for k, val := range v.AuditAnnotations {
			if _, ok := pv.AuditAnnotations[k]; !ok {
				pv = pv.WithAuditAnnotation(k, val)
			}
		}
		v = pv
		return v.Allowed
	})
	if !v.Allowed {
		return nil, v
	}
	return ops, v
}

// MutatorGroup is the engine: its hooks run together.
func (h mapHook) MutatorGroup() any { return h.e }

// MutateGroup serves the policies of run (hooks of h's engine) on one
// decoded copy of req's object: see serveMutateGroup.
func (h mapHook) MutateGroup(ctx context.Context, req *admission.Request, run []admission.Mutator, enter func(int), verdict func(int, admission.Verdict) bool) []jsonedit.Op {
	hooks := make([]mutating.PolicyHook, len(run))
	for i, m := range run {
		hooks[i] = h.e.mutating[m.(mapHook).i] // one group: one engine's mapHooks
	}
	return h.e.serveMutateGroup(ctx, hooks, req, enter, verdict)
}

// serveMutateGroup runs the MutatingAdmissionPolicies of hooks, in order, on
// req as the API server's mutating dispatcher runs them all (see
// mutateRun), handing each policy's verdict to verdict under its own
// index, and returns the JSONPatch of their joint result, made once. The
// decode budget is charged once for the run (mutateFactor estimates of
// the object: one decoded copy and what patching and the diff build
// beside it), on the request's shared mutating meter. A request refused
// before any policy runs (abandoned, too large, over budget, not
// decodable) is answered as the first policy's.
func (e *Engine) serveMutateGroup(ctx context.Context, hooks []mutating.PolicyHook, req *admission.Request, enter func(int), verdict func(int, admission.Verdict) bool) []jsonedit.Op {
	name := func(i int) string { return hooks[i].Policy.Name }
	fail := func(i int, v admission.Verdict) []jsonedit.Op {
		enter(i)
		verdict(i, v)
		return nil
	}
	if err := ctx.Err(); err != nil {
		// The review was abandoned at its deadline (its answer, a 500, is
		// sent): the policies after the one that overran do not run.
		return fail(0, notEvaluated(http.StatusInternalServerError, name(0), admission.Mutating, err))
	}
	if err := e.checkSize(req); err != nil {
		return fail(0, unanswered(name(0), admission.Mutating, err))
	}
	r := FromAdmission(req)
	var own bool
	r.meter, own = e.mutators.get(ctx, e.budget)
	if own {
		defer r.meter.release()
	} else {
		defer r.meter.leave()
	}
	if len(e.mutating) > 1 && r.OldObject != nil {
		r.shared = e.decoded.get(ctx, req)
		defer r.shared.m.leave()
	}
	out, at, err := e.mutateRun(ctx, r, hooks, enter, func(i int, d *Decision) bool {
		return verdict(i, asVerdict(d))
	})
	switch {
	case errors.Is(err, errRunStopped):
		return nil
	case err == nil:
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return fail(at, notEvaluated(http.StatusInternalServerError, name(at), admission.Mutating, err))
	default:
		if v, ok := bounded(name(at), admission.Mutating, err); ok {
			return fail(at, v)
		}
		return fail(at, admission.Invalid("MutatingAdmissionPolicy '%s': %v", name(at), err))
	}
	if out == nil {
		return nil
	}
	ops, err := Ops(req.Object.Raw, out)
	if err != nil {
		names := make([]string, len(hooks))
		for i := range hooks {
			names[i] = name(i)
		}
		return fail(len(hooks)-1, admission.Errored(500, fmt.Errorf("MutatingAdmissionPolicy '%s': %w", strings.Join(names, "', '"), err)))
	}
	return ops
}

// checkSize refuses a request whose object or oldObject is larger than
// the engine's MaxObjectBytes.
func (e *Engine) checkSize(req *admission.Request) error {
	if e.maxObject < 0 {
		return nil
	}
	for _, o := range []struct {
		what string
		n    int
	}{{"object", len(req.Object.Raw)}, {"oldObject", len(req.OldObject.Raw)}} {
		if o.n > e.maxObject {
			return fmt.Errorf("%w: %s of %d bytes, more than the %d bytes kadmit evaluates declared policies on (kadmit serve --policy-max-object-bytes)", ErrObjectTooLarge, o.what, o.n, e.maxObject)
		}
	}
	return nil
}

// bounded turns an error of a bound (ErrObjectTooLarge, ErrDecodeBudget)
// into a review without decision: HTTP 413 or 503, so the webhook's
// failurePolicy decides, as for a body too large or a server at its
// limit (admission.Limits).
func bounded(policy string, kind admission.Type, err error) (admission.Verdict, bool) {
	if errors.Is(err, ErrObjectTooLarge) || errors.Is(err, admission.ErrBusy) {
		return unanswered(policy, kind, err), true
	}
	return admission.Verdict{}, false
}

// unanswered is notEvaluated for an error of a bound: 413 for
// ErrObjectTooLarge, else 503.
func unanswered(policy string, kind admission.Type, err error) admission.Verdict {
	code := http.StatusServiceUnavailable
	if errors.Is(err, ErrObjectTooLarge) {
		code = http.StatusRequestEntityTooLarge
	}
	return notEvaluated(code, policy, kind, err)
}

// notEvaluated is the verdict of a policy the review ends at without
// evaluating it (see admission.Unanswered): HTTP code, and err under the
// policy's kind and name.
func notEvaluated(code int, policy string, kind admission.Type, err error) admission.Verdict {
	what := "ValidatingAdmissionPolicy"
	if kind == admission.Mutating {
		what = "MutatingAdmissionPolicy"
	}
	return admission.Unanswered(code, fmt.Errorf("%s '%s' not evaluated: %w", what, policy, err))
}

// asVerdict states a Decision as a webhook answers. Audit annotation keys
// lose their "<policy>/" prefix (the API server prefixes a webhook's keys
// with the webhook's name, which already names the policy, and a key with
// two slashes is refused); the validation_failure key loses its
// "validation.policy.admission.k8s.io/" prefix for the same reason.
func asVerdict(d *Decision) admission.Verdict {
	v := admission.Verdict{Allowed: d.Allowed, Warnings: d.Warnings}
	for k, val := range d.AuditAnnotations {
		if i := strings.LastIndexByte(k, '/'); i >= 0 {
			k = k[i+1:]
		}
		v = v.WithAuditAnnotation(k, val)
	}
	if !d.Allowed {
		v.Code, v.Reason, v.Message = d.Status.Code, d.Status.Reason, d.Message()
	}
	return v
}
