// Package kadmitpolicies implements the kadmit-policies policy: a validating
// hook on the ConfigMap of declared policies that `kadmit serve
// --policies-configmap` follows, which refuses any version of it that serve
// itself would refuse to load and compile. The kadmit-config policy does the
// same for kadmit's own configuration: a broken set can then never be
// stored, so a restarting replica never finds one.
package kadmitpolicies

import (
	"context"
	"errors"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/jsonedit"
	"github.com/kadmit/kadmit/internal/policy"
)

// Name is the policy's name (policies.kadmitPolicies in the configuration).
const Name = "kadmit-policies"

// Path is the validating hook's path. It is not kadmit-config's
// /validate-configmap: each guard gets its own webhook, scoped to its own
// ConfigMap's namespace.
const Path = "/validate-policies-configmap"

// Config is the kadmit-policies policy's configuration
// (policies.kadmitPolicies): only the fields every policy has (enabled,
// failurePolicy). The ConfigMap it guards is serve's --policies-configmap.
type Config struct{}

// DefaultConfig is the seed profile's (enabled: the guard is on whenever
// serve follows a policies ConfigMap).
func DefaultConfig() Config { return Config{} }

// Validate implements policy.Validator; there is nothing to check.
func (Config) Validate() error { return nil }

// Policy is the kadmit-policies policy.
type Policy struct {
	cm policy.PoliciesConfigMap
}

// New builds the policy around serve's ConfigMap and loader.
func New(cm policy.PoliciesConfigMap) (*Policy, error) {
	if cm.Namespace == "" || cm.Name == "" {
		return nil, errors.New("no policies ConfigMap")
	}
	if cm.Load == nil {
		return nil, errors.New("no policies loader")
	}
	return &Policy{cm: cm}, nil
}

// Hooks returns the validating hook: configmaps CREATE and UPDATE on
// /validate-policies-configmap, failurePolicy Fail, registered for the
// ConfigMap's namespace only (kadmit's own namespace in the chart, which
// every other webhook excludes). DELETE is allowed: serve refuses a
// deletion live, and a replica that starts without the ConfigMap serves
// the built-in policies (docs/policies-cel.md).
func (p *Policy) Hooks() []admission.Hook {
	return []admission.Hook{{
		Policy: Name, Path: Path, Type: admission.Validating,
		Rules: []admissionregistrationv1.RuleWithOperations{{
			Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
			Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}},
		}},
		FailurePolicy: admissionregistrationv1.Fail,
		Namespaces:    []string{p.cm.Namespace},
		Validator:     admission.ValidatorFunc(p.Validate),
	}}
}

// Validate denies (403) the policies ConfigMap when its documents do not
// load and compile with serve's --policies files; the message is serve's
// error, e.g. `declared policies: ConfigMap kadmit/policies data[p.yaml]:
// ValidatingAdmissionPolicy "x": spec.validations[0].expression: ...
// compilation failed: ...`. Other ConfigMaps are allowed after decoding
// only the request's namespace and name.
func (p *Policy) Validate(_ context.Context, req *admission.Request) admission.Verdict {
	if req.Namespace != p.cm.Namespace || (req.Name != "" && req.Name != p.cm.Name) {
		return admission.Allow()
	}
	var cm corev1.ConfigMap
	if err := jsonedit.Unmarshal(req.Object.Raw, &cm); err != nil {
		return admission.Invalid("%s: cannot parse the ConfigMap: %v", Name, err)
	}
	if cm.Name != p.cm.Name {
		return admission.Allow()
	}
	if cm.Namespace == "" {
		cm.Namespace = req.Namespace
	}
	if err := p.cm.Load(&cm); err != nil {
		return admission.Deny("%v", err)
	}
	return admission.Allow()
}
