package celpolicy

import (
	"errors"
	"fmt"
	"sync"

	"github.com/google/cel-go/cel"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/util/version"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/policy/mutating"
	"k8s.io/apiserver/pkg/admission/plugin/policy/mutating/patch"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions"
	"k8s.io/apiserver/pkg/cel/environment"
)

var (
	baseEnvOnce sync.Once
	baseEnv     *environment.EnvSet
)

// compositionEnv is the API server's CEL environment for admission
// policies: validating/plugin.go getCompositionEnvTemplateWithStrictCost
// (v0.37.1), the same EnvSet mutating/compilation.go builds per policy.
// Its compatibility version is the library's (environment.
// DefaultCompatibilityVersion), so the CEL libraries and cost limits are
// those of the API server of the same minor. Its programs are also
// interruptible in the few library calls cel-go does not interrupt
// (interruptibleCalls).
func compositionEnv() *environment.EnvSet {
	baseEnvOnce.Do(func() {
		base := environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion())
		// Every program also stops its quadratic list functions when the
		// review's context ends (see interruptibleCalls); nothing else
		// changes: no declaration, cost or result.
		env, err := base.Extend(environment.VersionedOptions{
			IntroducedVersion: version.MajorMinor(1, 0),
			ProgramOptions:    []cel.ProgramOption{cel.CustomDecoratorV2(interruptibleCalls)},
		})
		if err != nil {
			panic(fmt.Sprintf("extend the CEL environment: %v", err))
		}
		baseEnv = env
	})
	return baseEnv
}

var (
	sharedCompilerOnce sync.Once
	sharedCompiler     *plugincel.CompositedCompiler
	sharedCompilerErr  error
)

// policyCompiler returns the CompositedCompiler a policy with vars
// variables compiles with. The API server builds one per policy
// (validating/plugin.go compilePolicy, mutating/compilation.go), and each
// builds a score of CEL environments: about 130 KB and 20 ms of CPU per
// policy, 1,000 trivial policies 238 MiB and 26 CPU-seconds per reload.
// A compiler's only per-policy state is the variables compiled into it
// (CompileAndStoreVariables); one without any is never written after it
// is built (CompileCondition and CompileMutatingEvaluator read its
// environments and its empty variable map), so every policy without
// variables shares one: same environment, same programs, same results.
// A policy with variables gets its own, as in tree.
func policyCompiler(vars int) (*plugincel.CompositedCompiler, error) {
	if vars > 0 {
		return plugincel.NewCompositedCompiler(compositionEnv())
	}
	sharedCompilerOnce.Do(func() {
		sharedCompiler, sharedCompilerErr = plugincel.NewCompositedCompiler(compositionEnv())
	})
	return sharedCompiler, sharedCompilerErr
}

// compileValidating mirrors k8s.io/apiserver pkg/admission/plugin/policy/
// validating/plugin.go compilePolicy (v0.37.1, unexported) line for line:
// compile errors are kept in the evaluator and reported when a request
// reaches the policy, under its failurePolicy, as the API server does.
func compileValidating(policy *admissionregistrationv1.ValidatingAdmissionPolicy) validating.Validator {
	hasParam := policy.Spec.ParamKind != nil
	optionalVars := plugincel.OptionalVariableDeclarations{HasParams: hasParam, HasAuthorizer: true}
	expressionOptionalVars := plugincel.OptionalVariableDeclarations{HasParams: hasParam, HasAuthorizer: false}
	failurePolicy := policy.Spec.FailurePolicy
	var matcher matchconditions.Matcher
	matchConditions := policy.Spec.MatchConditions
	filterCompiler, err := policyCompiler(len(policy.Spec.Variables))
	if err != nil {
		return validating.NewValidator(nil, nil, nil, nil, failurePolicy, err)
	}
	filterCompiler.CompileAndStoreVariables(variables(policy.Spec.Variables), optionalVars, environment.StoredExpressions)
	if len(matchConditions) > 0 {
		accessors := make([]plugincel.ExpressionAccessor, len(matchConditions))
		for i := range matchConditions {
			accessors[i] = (*matchconditions.MatchCondition)(&matchConditions[i])
		}
		matcher = matchconditions.NewMatcher(filterCompiler.CompileCondition(accessors, optionalVars, environment.StoredExpressions), failurePolicy, "policy", "validate", policy.Name)
	}
	return validating.NewValidator(
		filterCompiler.CompileCondition(validations(policy.Spec.Validations), optionalVars, environment.StoredExpressions),
		matcher,
		filterCompiler.CompileCondition(auditAnnotations(policy.Spec.AuditAnnotations), optionalVars, environment.StoredExpressions),
		filterCompiler.CompileCondition(messageExpressions(policy.Spec.Validations), expressionOptionalVars, environment.StoredExpressions),
		failurePolicy,
		nil,
	)
}

// compileMutating mirrors k8s.io/apiserver pkg/admission/plugin/policy/
// mutating/compilation.go compilePolicy (v0.37.1, unexported).
func compileMutating(policy *admissionregistrationv1.MutatingAdmissionPolicy) mutating.PolicyEvaluator {
	opts := plugincel.OptionalVariableDeclarations{HasParams: policy.Spec.ParamKind != nil, HasAuthorizer: true}
	compiler, err := policyCompiler(len(policy.Spec.Variables))
	if err != nil {
		return mutating.PolicyEvaluator{Error: fmt.Errorf("failed to initialize CEL compiler: %w", err)}
	}
	compiler.CompileAndStoreVariables(variables(policy.Spec.Variables), opts, environment.StoredExpressions)
	var matcher matchconditions.Matcher
	if mcs := policy.Spec.MatchConditions; len(mcs) > 0 {
		accessors := make([]plugincel.ExpressionAccessor, len(mcs))
		for i := range mcs {
			accessors[i] = (*matchconditions.MatchCondition)(&mcs[i])
		}
		matcher = matchconditions.NewMatcher(compiler.CompileCondition(accessors, opts, environment.StoredExpressions), policy.Spec.FailurePolicy, "policy", "validate", policy.Name)
	}
	var patchers []patch.Patcher
	patchOptions := opts
	patchOptions.HasPatchTypes = true
	for _, m := range policy.Spec.Mutations {
		switch m.PatchType {
		case admissionregistrationv1.PatchTypeJSONPatch:
			if m.JSONPatch != nil {
				accessor := &patch.JSONPatchCondition{Expression: m.JSONPatch.Expression}
				patchers = append(patchers, patch.NewJSONPatcher(compiler.CompileMutatingEvaluator(accessor, patchOptions, environment.StoredExpressions)))
			}
		case admissionregistrationv1.PatchTypeApplyConfiguration:
			if m.ApplyConfiguration != nil {
				accessor := &patch.ApplyConfigurationCondition{Expression: m.ApplyConfiguration.Expression}
				patchers = append(patchers, patch.NewApplyConfigurationPatcher(compiler.CompileMutatingEvaluator(accessor, patchOptions, environment.StoredExpressions)))
			}
		}
	}
	return mutating.PolicyEvaluator{Matcher: matcher, Mutators: patchers, CompositedCompiler: compiler}
}

// The converters below mirror validating/plugin.go convertv1Validations,
// convertv1MessageExpressions, convertv1AuditAnnotations and
// convertv1beta1Variables (v0.37.1).

func validations(in []admissionregistrationv1.Validation) []plugincel.ExpressionAccessor {
	out := make([]plugincel.ExpressionAccessor, len(in))
	for i, v := range in {
		out[i] = &validating.ValidationCondition{Expression: v.Expression, Message: v.Message, Reason: v.Reason}
	}
	return out
}

func messageExpressions(in []admissionregistrationv1.Validation) []plugincel.ExpressionAccessor {
	out := make([]plugincel.ExpressionAccessor, len(in))
	for i, v := range in {
		if v.MessageExpression != "" {
			out[i] = &validating.MessageExpressionCondition{MessageExpression: v.MessageExpression}
		}
	}
	return out
}

func auditAnnotations(in []admissionregistrationv1.AuditAnnotation) []plugincel.ExpressionAccessor {
	out := make([]plugincel.ExpressionAccessor, len(in))
	for i, a := range in {
		out[i] = &validating.AuditAnnotationCondition{Key: a.Key, ValueExpression: a.ValueExpression}
	}
	return out
}

func variables(in []admissionregistrationv1.Variable) []plugincel.NamedExpressionAccessor {
	out := make([]plugincel.NamedExpressionAccessor, len(in))
	for i, v := range in {
		out[i] = &validating.Variable{Name: v.Name, Expression: v.Expression}
	}
	return out
}

// checkValidating compiles every expression of p in the environment the API
// server validates new objects with (environment.NewExpressions), so a file
// the API server would refuse on create is refused at load, naming the
// field — what k8s.io/kubernetes pkg/apis/admissionregistration/validation
// validateValidatingAdmissionPolicySpec does for expressions (v1.37.1).
func checkValidating(p *admissionregistrationv1.ValidatingAdmissionPolicy) error {
	hasParam := p.Spec.ParamKind != nil
	opts := plugincel.OptionalVariableDeclarations{HasParams: hasParam, HasAuthorizer: true}
	msgOpts := plugincel.OptionalVariableDeclarations{HasParams: hasParam, HasAuthorizer: false}
	c, err := policyCompiler(len(p.Spec.Variables))
	if err != nil {
		return err
	}
	var errs []error
	for i, v := range p.Spec.Variables {
		if r := c.CompileAndStoreVariable(&validating.Variable{Name: v.Name, Expression: v.Expression}, opts, environment.NewExpressions); r.Error != nil {
			errs = append(errs, fmt.Errorf("spec.variables[%d].expression: %s", i, r.Error.Detail))
		}
	}
	for i := range p.Spec.MatchConditions {
		if r := c.CompileCELExpression((*matchconditions.MatchCondition)(&p.Spec.MatchConditions[i]), opts, environment.NewExpressions); r.Error != nil {
			errs = append(errs, fmt.Errorf("spec.matchConditions[%d].expression: %s", i, r.Error.Detail))
		}
	}
	for i, v := range p.Spec.Validations {
		if r := c.CompileCELExpression(&validating.ValidationCondition{Expression: v.Expression}, opts, environment.NewExpressions); r.Error != nil {
			errs = append(errs, fmt.Errorf("spec.validations[%d].expression: %s", i, r.Error.Detail))
		}
		if v.MessageExpression != "" {
			if r := c.CompileCELExpression(&validating.MessageExpressionCondition{MessageExpression: v.MessageExpression}, msgOpts, environment.NewExpressions); r.Error != nil {
				errs = append(errs, fmt.Errorf("spec.validations[%d].messageExpression: %s", i, r.Error.Detail))
			}
		}
	}
	for i, a := range p.Spec.AuditAnnotations {
		if r := c.CompileCELExpression(&validating.AuditAnnotationCondition{Key: a.Key, ValueExpression: a.ValueExpression}, opts, environment.NewExpressions); r.Error != nil {
			errs = append(errs, fmt.Errorf("spec.auditAnnotations[%d].valueExpression: %s", i, r.Error.Detail))
		}
	}
	return errors.Join(errs...)
}

// checkMutating is checkValidating for a MutatingAdmissionPolicy
// (validateMutatingAdmissionPolicySpec, same file and version).
func checkMutating(p *admissionregistrationv1.MutatingAdmissionPolicy) error {
	opts := plugincel.OptionalVariableDeclarations{HasParams: p.Spec.ParamKind != nil, HasAuthorizer: true}
	c, err := policyCompiler(len(p.Spec.Variables))
	if err != nil {
		return err
	}
	var errs []error
	for i, v := range p.Spec.Variables {
		if r := c.CompileAndStoreVariable(&validating.Variable{Name: v.Name, Expression: v.Expression}, opts, environment.NewExpressions); r.Error != nil {
			errs = append(errs, fmt.Errorf("spec.variables[%d].expression: %s", i, r.Error.Detail))
		}
	}
	for i := range p.Spec.MatchConditions {
		if r := c.CompileCELExpression((*matchconditions.MatchCondition)(&p.Spec.MatchConditions[i]), opts, environment.NewExpressions); r.Error != nil {
			errs = append(errs, fmt.Errorf("spec.matchConditions[%d].expression: %s", i, r.Error.Detail))
		}
	}
	if len(p.Spec.Mutations) == 0 {
		errs = append(errs, errors.New("spec.mutations: Required value"))
	}
	popts := opts
	popts.HasPatchTypes = true
	for i, m := range p.Spec.Mutations {
		switch m.PatchType {
		case admissionregistrationv1.PatchTypeJSONPatch:
			if m.JSONPatch == nil {
				errs = append(errs, fmt.Errorf("spec.mutations[%d].jsonPatch: Required value", i))
				continue
			}
			if r := c.CompileCELExpression(&patch.JSONPatchCondition{Expression: m.JSONPatch.Expression}, popts, environment.NewExpressions); r.Error != nil {
				errs = append(errs, fmt.Errorf("spec.mutations[%d].jsonPatch.expression: %s", i, r.Error.Detail))
			}
		case admissionregistrationv1.PatchTypeApplyConfiguration:
			if m.ApplyConfiguration == nil {
				errs = append(errs, fmt.Errorf("spec.mutations[%d].applyConfiguration: Required value", i))
				continue
			}
			if r := c.CompileCELExpression(&patch.ApplyConfigurationCondition{Expression: m.ApplyConfiguration.Expression}, popts, environment.NewExpressions); r.Error != nil {
				errs = append(errs, fmt.Errorf("spec.mutations[%d].applyConfiguration.expression: %s", i, r.Error.Detail))
			}
		default:
			errs = append(errs, fmt.Errorf("spec.mutations[%d].patchType: Unsupported value: %q: supported values: \"ApplyConfiguration\", \"JSONPatch\"", i, m.PatchType))
		}
	}
	return errors.Join(errs...)
}
