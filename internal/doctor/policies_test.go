package doctor

import (
	"context"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
)

func vap(name string, pk *admissionregistrationv1.ParamKind, fp admissionregistrationv1.FailurePolicyType, warnings ...admissionregistrationv1.ExpressionWarning) *admissionregistrationv1.ValidatingAdmissionPolicy {
	p := &admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{ParamKind: pk, FailurePolicy: &fp,
			Validations: []admissionregistrationv1.Validation{{Expression: "true"}}}}
	if len(warnings) > 0 {
		p.Status.TypeChecking = &admissionregistrationv1.TypeChecking{ExpressionWarnings: warnings}
	}
	return p
}

func vapb(name, policy string, ref *admissionregistrationv1.ParamRef) *admissionregistrationv1.ValidatingAdmissionPolicyBinding {
	return &admissionregistrationv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: policy, ParamRef: ref,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}}}
}

func paramRef(ns, name string, action admissionregistrationv1.ParameterNotFoundActionType) *admissionregistrationv1.ParamRef {
	return &admissionregistrationv1.ParamRef{Namespace: ns, Name: name, ParameterNotFoundAction: &action}
}

func policyReport(rep *Report, kind, name string) *PolicyReport {
	for i := range rep.Policies {
		if rep.Policies[i].Kind == kind && rep.Policies[i].Name == name {
			return &rep.Policies[i]
		}
	}
	return nil
}

func TestPolicyChecks(t *testing.T) {
	cmKind := &admissionregistrationv1.ParamKind{APIVersion: "v1", Kind: "ConfigMap"}
	crdKind := &admissionregistrationv1.ParamKind{APIVersion: "constraints.gatekeeper.sh/v1beta1", Kind: "K8sRequiredLabels"}
	goneKind := &admissionregistrationv1.ParamKind{APIVersion: "example.com/v1", Kind: "Gone"}
	fail, ignore := admissionregistrationv1.Fail, admissionregistrationv1.Ignore
	deny, allow := admissionregistrationv1.DenyAction, admissionregistrationv1.AllowAction
	objs := []runtime.Object{
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "policies", Name: "limits"}},
		vap("cm-policy", cmKind, fail),
		vap("gatekeeper-required-labels", crdKind, fail),
		vap("gatekeeper-ignore", crdKind, ignore),
		vap("gone-kind", goneKind, fail),
		vap("typo", nil, fail, admissionregistrationv1.ExpressionWarning{FieldRef: "spec.validations[0].expression", Warning: "undefined field 'replica'"}),
		vapb("ok", "cm-policy", paramRef("policies", "limits", deny)),
		vapb("orphan", "no-such-policy", nil),
		vapb("missing-param-deny", "cm-policy", paramRef("policies", "absent", deny)),
		vapb("missing-param-allow", "cm-policy", paramRef("policies", "absent", allow)),
		vapb("no-paramref", "cm-policy", nil),
		vapb("gone-kind", "gone-kind", paramRef("", "x", deny)),
	}
	cs := fake.NewClientset(objs...)
	cs.Resources = []*metav1.APIResourceList{
		{GroupVersion: "v1", APIResources: []metav1.APIResource{{Name: "configmaps", Kind: "ConfigMap", Namespaced: true}}},
		{GroupVersion: "constraints.gatekeeper.sh/v1beta1", APIResources: []metav1.APIResource{{Name: "k8srequiredlabels", Kind: "K8sRequiredLabels"}}},
	}
	rep := diagnose(t, cs)
	const vapK, bK = "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"
	cases := []struct {
		kind, name, id string
		sev            Severity
		what           string
	}{
		{bK, "orphan", IDPolicyBindingMissing, SeverityWarning, `binds ValidatingAdmissionPolicy "no-such-policy", which does not exist`},
		{bK, "missing-param-deny", IDPolicyParamMissing, SeverityError, "names param ConfigMap policies/absent, which does not exist"},
		{bK, "missing-param-allow", IDPolicyParamMissing, SeverityWarning, "names param ConfigMap policies/absent"},
		{bK, "no-paramref", IDPolicyParamMissing, SeverityError, "has no paramRef"},
		{bK, "gone-kind", IDPolicyParamMissing, SeverityError, "example.com/v1 Gone, which the API server does not serve"},
		{vapK, "gatekeeper-required-labels", IDPolicyParamKindFail, SeverityWarning, "paramKind constraints.gatekeeper.sh/v1beta1 K8sRequiredLabels, a custom resource"},
		{vapK, "gone-kind", IDPolicyParamKindFail, SeverityWarning, "example.com/v1 Gone"},
		{vapK, "typo", IDPolicyTypeCheck, SeverityWarning, "spec.validations[0].expression: undefined field 'replica'"},
	}
	for _, c := range cases {
		p := policyReport(rep, c.kind, c.name)
		if p == nil || len(p.Findings) != 1 {
			t.Errorf("%s %s: want one finding; got %+v", c.kind, c.name, p)
			continue
		}
		f := p.Findings[0]
		if f.ID != c.id || f.Severity != c.sev || !strings.Contains(f.What, c.what) || f.Fix == "" {
			t.Errorf("%s %s: got %+v; want %s %s containing %q", c.kind, c.name, f, c.id, c.sev, c.what)
		}
	}
	for _, quiet := range [][2]string{{bK, "ok"}, {vapK, "cm-policy"}, {vapK, "gatekeeper-ignore"}} {
		if p := policyReport(rep, quiet[0], quiet[1]); p != nil {
			t.Errorf("%s %s: unexpected findings %+v", quiet[0], quiet[1], p.Findings)
		}
	}
	if rep.Errors != 3 {
		t.Errorf("report errors = %d; want 3", rep.Errors)
	}
}

// A 1.35 API server without MutatingAdmissionPolicy, or a user who may
// not list policies: gaps, not failures.
func TestPolicyAPIsRefused(t *testing.T) {
	cs := fake.NewClientset()
	forbid(cs, "list", "admissionregistration.k8s.io", "validatingadmissionpolicies")
	snap, err := LoadSnapshot(context.Background(), cs)
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Policies.Gaps) != 1 || !strings.Contains(snap.Policies.Gaps[0].String(), "list validatingadmissionpolicies.admissionregistration.k8s.io (cluster-wide): forbidden") {
		t.Errorf("gaps = %+v", snap.Policies.Gaps)
	}
}
