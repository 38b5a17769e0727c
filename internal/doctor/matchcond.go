package doctor

import (
	"context"
	"fmt"
	"strings"
	"sync"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/cel/environment"
)

// Webhook matchConditions are evaluated with the API server's own code
// (k8s.io/apiserver v0.37.1): the compiler and environment of
// pkg/admission/plugin/webhook/generic/webhook.go:155
// (cel.NewConditionCompiler(environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion())))
// and the declarations of pkg/admission/plugin/webhook/accessors.go:142
// (HasParams false, HasAuthorizer true, environment.StoredExpressions), then
// matchconditions.Matcher.Match as generic/webhook.go:364-380 calls it. Only
// the request doctor builds is its own: see Object.

var (
	celOnce     sync.Once
	celCompiler plugincel.Compiler
	celCond     plugincel.ConditionCompiler
)

func celCompilers() (plugincel.Compiler, plugincel.ConditionCompiler) {
	celOnce.Do(func() {
		env := environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion())
		celCompiler = plugincel.NewCompiler(env)
		celCond = plugincel.NewConditionCompiler(env)
	})
	return celCompiler, celCond
}

// webhookConditionDecls are the variables a webhook matchCondition may use
// (accessors.go:144): object, oldObject, request, authorizer.
var webhookConditionDecls = plugincel.OptionalVariableDeclarations{HasParams: false, HasAuthorizer: true}

// compiledConditions is w's matchConditions compiled once.
type compiledConditions struct {
	matcher matchconditions.Matcher
	// compileErrors are "name: error" for each condition that does not
	// compile in the API server's stored-expression environment.
	compileErrors []string
}

func (w *Webhook) conditions() *compiledConditions {
	w.condOnce.Do(func() {
		comp, condComp := celCompilers()
		c := &compiledConditions{}
		accessors := make([]plugincel.ExpressionAccessor, len(w.MatchConditions))
		for i, mc := range w.MatchConditions {
			a := &matchconditions.MatchCondition{Name: mc.Name, Expression: mc.Expression}
			accessors[i] = a
			if res := comp.CompileCELExpression(a, webhookConditionDecls, environment.StoredExpressions); res.Error != nil {
				c.compileErrors = append(c.compileErrors, fmt.Sprintf("%s: %v", mc.Name, res.Error))
			}
		}
		fp := w.FailurePolicy
		c.matcher = matchconditions.NewMatcher(condComp.CompileCondition(accessors, webhookConditionDecls, environment.StoredExpressions), &fp, "webhook", w.Kind, w.Name)
		w.cond = c
	})
	return w.cond
}

// ConditionResult is what w's matchConditions decide for one request.
type ConditionResult struct {
	// Matches: every condition is true (or there are none), so the webhook
	// is called.
	Matches bool
	// Excluded names the condition that evaluated to false (the webhook is
	// skipped).
	Excluded string
	// Err is an evaluation error: with failurePolicy Fail the API server
	// rejects the request without calling the webhook
	// (generic/webhook.go:371-373); with Ignore it skips the webhook.
	Err error
	// Unknown is set when the result depends on what doctor cannot
	// reproduce offline (the authorizer): the result is not exact.
	Unknown string
}

// EvalConditions evaluates w's matchConditions on obj's representative
// request with the API server's matcher. No conditions: Matches. The
// authorizer variable has no value offline: a condition using it errors
// and the result says it is Unknown.
func (w *Webhook) EvalConditions(ctx context.Context, obj Object) ConditionResult {
	if len(w.MatchConditions) == 0 {
		return ConditionResult{Matches: true}
	}
	attr := obj.attributes()
	res := w.conditions().matcher.Match(ctx, attr, nil, nil)
	out := ConditionResult{Matches: res.Matches, Excluded: res.FailedConditionName, Err: res.Error}
	// An error (Fail), or a skip without a false condition (Ignore turns
	// errors into skips, matchconditions/matcher.go:94,133), may come from the authorizer,
	// which has no value offline: then doctor cannot tell.
	if res.Error != nil || (!res.Matches && res.FailedConditionName == "") {
		for _, mc := range w.MatchConditions {
			if strings.Contains(mc.Expression, "authorizer") {
				out.Unknown = fmt.Sprintf("matchCondition %q uses the authorizer, which doctor cannot evaluate offline", mc.Name)
				break
			}
		}
	}
	return out
}

// conditionFindings reports matchConditions that do not compile (KD607).
func conditionFindings(w *Webhook) []Finding {
	if len(w.MatchConditions) == 0 {
		return nil
	}
	errs := w.conditions().compileErrors
	if len(errs) == 0 {
		return nil
	}
	f := Finding{ID: IDMatchConditionError, Severity: SeverityWarning,
		What: fmt.Sprintf("%d matchCondition(s) do not compile: %s.", len(errs), strings.Join(errs, "; ")),
		Why:  "failurePolicy is Ignore: the API server skips the webhook for every request its rules match, so its policy is silently not applied.",
		Fix:  fmt.Sprintf("Fix the expression(s) (they must return bool and use only object, oldObject, request and authorizer): kubectl edit %s %s", w.resourceKind(), w.Configuration),
	}
	if w.Fail() {
		f.Severity = SeverityError
		f.Why = fmt.Sprintf("failurePolicy is Fail: the API server rejects every request the webhook's rules and selectors match (%s), without calling it (\"... is forbidden: ... compilation failed\").", describeRules(w.Rules))
	}
	return []Finding{f}
}

// attributes builds the admission request the API server would evaluate
// matchConditions on for obj: the object as JSON (metadata name or
// generateName, namespace, labels, plus obj.Body), the operation, the
// resource, and the user that makes such requests (obj.User).
func (obj Object) attributes() *admission.VersionedAttributes {
	gvr := schema.GroupVersionResource{Group: obj.Group, Version: obj.Version, Resource: obj.Resource}
	gvk := gvr.GroupVersion().WithKind(obj.Kind)
	u := &unstructured.Unstructured{Object: map[string]any{}}
	for k, v := range obj.Body {
		u.Object[k] = v
	}
	u.SetAPIVersion(gvk.GroupVersion().String())
	u.SetKind(obj.Kind)
	if obj.Name != "" {
		u.SetName(obj.Name)
	} else {
		u.SetGenerateName(obj.Kind + "-")
	}
	if obj.Namespaced {
		u.SetNamespace(obj.Namespace)
	}
	if len(obj.Labels) > 0 {
		u.SetLabels(obj.Labels)
	}
	var old *unstructured.Unstructured
	if obj.Operation == admissionregistrationv1.Update {
		old = u.DeepCopy()
	}
	info := &user.DefaultInfo{Name: obj.User.Name, Groups: obj.User.Groups}
	ns := ""
	if obj.Namespaced {
		ns = obj.Namespace
	}
	var attrs admission.Attributes
	if old != nil {
		attrs = admission.NewAttributesRecord(u, old, gvk, ns, obj.Name, gvr, obj.Subresource, admission.Operation(obj.Operation), nil, false, info)
	} else {
		attrs = admission.NewAttributesRecord(u, nil, gvk, ns, obj.Name, gvr, obj.Subresource, admission.Operation(obj.Operation), nil, false, info)
	}
	va := &admission.VersionedAttributes{Attributes: attrs, VersionedKind: gvk, VersionedObject: admission.NewLazyObject(u)}
	if old != nil {
		va.VersionedOldObject = admission.NewLazyObject(old)
	}
	return va
}

// Requester is who makes a representative request: the user name and
// groups matchConditions see in request.userInfo.
type Requester struct {
	Name   string
	Groups []string
}

// The requesters of the representative requests. Controllers are the
// kube-controller-manager's per-controller service accounts, as with
// --use-service-account-credentials (kubeadm's default; without it they
// all act as system:kube-controller-manager); kubelets are system:node:NAME
// in system:nodes.
var (
	replicaSetController  = controllerSA("replicaset-controller")
	deploymentController  = controllerSA("deployment-controller")
	statefulSetController = controllerSA("statefulset-controller")
	daemonSetController   = controllerSA("daemon-set-controller")
	kubelet               = Requester{Name: "system:node:node-1", Groups: []string{"system:nodes", user.AllAuthenticated}}
	// anyUser stands for a person or deploy tool updating a Deployment.
	anyUser = Requester{Name: "deployer", Groups: []string{user.AllAuthenticated}}
)

func controllerSA(name string) Requester {
	return Requester{Name: "system:serviceaccount:kube-system:" + name,
		Groups: []string{user.AllAuthenticated, "system:serviceaccounts", "system:serviceaccounts:kube-system"}}
}
