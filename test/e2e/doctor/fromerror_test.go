package doctor

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kadmit/kadmit/internal/doctor"
	"github.com/kadmit/kadmit/test/e2e/e2eenv"
	"github.com/kadmit/kadmit/test/netns"
	"github.com/kadmit/kadmit/test/poll"
)

// provoke dry-runs pod creations in ns until the API server's error
// contains want (bounded by webhookTakeEffect) and returns that error's
// message: a real API server message, as a user would paste it.
func provoke(t *testing.T, e *env, ns, want string) string {
	t.Helper()
	var msg string
	err := poll.Until(t.Context(), webhookTakeEffect, func(ctx context.Context) error {
		err := dryRunPod(ctx, e, ns, nil)
		if err != nil && strings.Contains(err.Error(), want) {
			msg = err.Error()
			return nil
		}
		return fmt.Errorf("API server answered: %v", err)
	})
	if err != nil {
		t.Fatalf("no API server error containing %q: %v", want, err)
	}
	t.Logf("the API server's message: %s", msg)
	return msg
}

// TestFromErrorConnectionRefused: the webhook pod is ready but nothing
// listens. The API server's message, fed back, names the webhook, and
// doctor leads with KD202 on that endpoint.
func TestFromErrorConnectionRefused(t *testing.T) {
	e := routedWorld(t)
	sys := namespace(t, e, "refused-system", nil)
	work := namespace(t, e, "refused-work", nil)
	labels := map[string]string{"app.kubernetes.io/name": "refused"}
	pods := workload(t, e, sys, "refused-webhook", labels, 1)
	service(t, e, sys, "refused-webhook", labels)
	ip := nextIP(t)
	if err := netns.AddLoopbackAddr(ip); err != nil {
		t.Fatal(err)
	}
	endpointSlice(t, e, sys, "refused-webhook", ep{IP: ip, Pod: pods[0], Ready: true})
	const config, name = "refused", "vpod.refused.example.com"
	validating(t, e, config, hook{Name: name, Service: svcRef(sys, "refused-webhook"), CABundle: newCA(t).pem(), Fail: true, NamespaceSelector: onlyNamespaces(work)})
	// A decoy with the same webhook name in another configuration: the
	// URL in the message tells them apart.
	validating(t, e, "refused-decoy", hook{Name: name, Service: svcRef(sys, "other-service"), CABundle: newCA(t).pem(), NamespaceSelector: onlyNamespaces("nowhere-" + suffix())})

	msg := provoke(t, e, work, "connection refused")
	rep := runDoctor(t, e, doctor.Options{FromError: msg})
	if len(rep.Webhooks) != 1 || rep.Webhooks[0].Configuration != config {
		t.Fatalf("--from-error %q selected:\n%s", msg, render(rep))
	}
	fs := rep.Webhooks[0].Findings
	if fs[0].ID != doctor.IDFromError || !fs[1].Lead || fs[1].ID != doctor.IDEndpointRefused {
		t.Fatalf("want KD002 then KD202 leading for %q; got:\n%s", msg, render(rep))
	}
	contains(t, "KD002 what", fs[0].What, "connection refused", "KD202 explains it")
	if rep.FromError.Service != sys+"/refused-webhook" || rep.FromError.Explained != doctor.IDEndpointRefused {
		t.Errorf("FromError = %+v", rep.FromError)
	}
}

// TestFromErrorSelectorCollision: LeaderWorkerSet #528 as users saw it, an
// intermittent "x509: certificate is valid for kueue-webhook-service...,
// not lws-webhook-service..." on their own requests. Fed to the plugin,
// doctor leads with the selector collision, not the certificate.
func TestFromErrorSelectorCollision(t *testing.T) {
	e := routedWorld(t)
	sys := namespace(t, e, "lws-system", nil)
	work := namespace(t, e, "lws-work", nil)
	lwsLabels := map[string]string{"control-plane": "controller-manager", "app.kubernetes.io/name": "lws"}
	kueueLabels := map[string]string{"control-plane": "controller-manager", "app.kubernetes.io/name": "kueue"}
	lwsPods := workload(t, e, sys, "lws-controller-manager", lwsLabels, 1)
	kueuePods := workload(t, e, sys, "kueue-controller-manager", kueueLabels, 1)
	service(t, e, sys, "lws-webhook-service", map[string]string{"control-plane": "controller-manager"})
	lwsCA, kueueCA := newCA(t), newCA(t)
	lwsIP, kueueIP := nextIP(t), nextIP(t)
	webhookServer(t, lwsIP, lwsCA.serving(t, svcNames(sys, "lws-webhook-service"), time.Now(), 24*time.Hour), 0)
	webhookServer(t, kueueIP, kueueCA.serving(t, svcNames(sys, "kueue-webhook-service"), time.Now(), 24*time.Hour), 0)
	endpointSlice(t, e, sys, "lws-webhook-service", ep{IP: lwsIP, Pod: lwsPods[0], Ready: true}, ep{IP: kueueIP, Pod: kueuePods[0], Ready: true})
	const config, name = "lws-validating-webhook-configuration", "vleaderworkerset.kb.io"
	validating(t, e, config, hook{Name: name, Service: svcRef(sys, "lws-webhook-service"), CABundle: lwsCA.pem(), Fail: true, NamespaceSelector: onlyNamespaces(work)})

	msg := provoke(t, e, work, "x509: certificate is valid for")
	out, code := runPlugin(t, e, "doctor", "--from-error", msg)
	if code != 1 {
		t.Fatalf("kubectl kadmit doctor --from-error: exit %d; want 1 (errors found)\n%s", code, out)
	}
	contains(t, "plugin output", out, "From the error: webhook "+name, `cause "x509 SAN mismatch"`, "Explained by KD301", "> ERROR   KD301")
	if strings.Index(out, "KD301") > strings.Index(out, "KD405") && strings.Contains(out, "KD405") {
		t.Errorf("KD301 does not lead:\n%s", out)
	}
}

// TestFromErrorPolicyParamMissing: a ValidatingAdmissionPolicyBinding
// names a param that does not exist, with parameterNotFoundAction Deny: the
// API server rejects every matched request. Its message leads to KD902.
func TestFromErrorPolicyParamMissing(t *testing.T) {
	e := world(t)
	ns := namespace(t, e, "vap-work", nil)
	ctx := e2eenv.TestCtx(t, apiTimeout)
	reg := e.Client.AdmissionregistrationV1()
	name := "max-replicas-" + suffix()
	fail, deny := admissionregistrationv1.Fail, admissionregistrationv1.DenyAction
	pol := &admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
		FailurePolicy: &fail, ParamKind: &admissionregistrationv1.ParamKind{APIVersion: "v1", Kind: "ConfigMap"},
		MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{RuleWithOperations: podRules()[0]}}},
		Validations:      []admissionregistrationv1.Validation{{Expression: `size(object.spec.containers) <= int(params.data.max)`}},
	}}
	if _, err := reg.ValidatingAdmissionPolicies().Create(ctx, pol, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ValidatingAdmissionPolicy: %v", err)
	}
	b := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: name + "-binding"}, Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
		PolicyName: name, ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
		ParamRef:       &admissionregistrationv1.ParamRef{Name: "limits", Namespace: ns, ParameterNotFoundAction: &deny},
		MatchResources: &admissionregistrationv1.MatchResources{NamespaceSelector: onlyNamespaces(ns)},
	}}
	if _, err := reg.ValidatingAdmissionPolicyBindings().Create(ctx, b, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ValidatingAdmissionPolicyBinding: %v", err)
	}
	orphan := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: name + "-orphan"}, Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
		PolicyName: name + "-deleted", ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}}}
	if _, err := reg.ValidatingAdmissionPolicyBindings().Create(ctx, orphan, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ValidatingAdmissionPolicyBinding: %v", err)
	}
	t.Cleanup(func() {
		// t.Context() is done by now.
		ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
		defer cancel()
		_ = reg.ValidatingAdmissionPolicyBindings().Delete(ctx, b.Name, metav1.DeleteOptions{})
		_ = reg.ValidatingAdmissionPolicyBindings().Delete(ctx, orphan.Name, metav1.DeleteOptions{})
		_ = reg.ValidatingAdmissionPolicies().Delete(ctx, name, metav1.DeleteOptions{})
	})

	msg := provoke(t, e, ns, "no params found")
	rep := runDoctor(t, e, doctor.Options{FromError: msg})
	var binding *doctor.PolicyReport
	for i := range rep.Policies {
		if rep.Policies[i].Name == b.Name {
			binding = &rep.Policies[i]
		}
	}
	if binding == nil || len(binding.Findings) < 2 || binding.Findings[0].ID != doctor.IDFromError || binding.Findings[1].ID != doctor.IDPolicyParamMissing || binding.Findings[1].Severity != doctor.SeverityError {
		t.Fatalf("--from-error %q:\n%s", msg, render(rep))
	}
	contains(t, "KD902 what", binding.Findings[1].What, "ConfigMap "+ns+"/limits")

	// Without --from-error the orphan binding is reported too.
	rep = runDoctor(t, e, doctor.Options{})
	found := false
	for _, p := range rep.Policies {
		if p.Name == orphan.Name && len(p.Findings) == 1 && p.Findings[0].ID == doctor.IDPolicyBindingMissing {
			found = true
		}
	}
	if !found {
		t.Errorf("no KD901 for binding %s:\n%s", orphan.Name, render(rep))
	}
}

// TestFromErrorPolicyParamKindNotServed: a ValidatingAdmissionPolicy whose
// paramKind is a custom resource nobody installed (or whose CRD is not
// served yet, as after an API server restart: Gatekeeper #4530), with
// failurePolicy Fail: the API server rejects every matched request. Doctor
// reports KD903 on the policy and KD902 on the binding, and the API
// server's message leads to KD902.
func TestFromErrorPolicyParamKindNotServed(t *testing.T) {
	e := world(t)
	ns := namespace(t, e, "vap-crd-work", nil)
	ctx := e2eenv.TestCtx(t, apiTimeout)
	reg := e.Client.AdmissionregistrationV1()
	name := "required-labels-" + suffix()
	fail, deny := admissionregistrationv1.Fail, admissionregistrationv1.DenyAction
	pol := &admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
		FailurePolicy: &fail, ParamKind: &admissionregistrationv1.ParamKind{APIVersion: "constraints.gatekeeper.sh/v1beta1", Kind: "K8sRequiredLabels"},
		MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{RuleWithOperations: podRules()[0]}}},
		Validations:      []admissionregistrationv1.Validation{{Expression: `has(object.metadata.labels)`}},
	}}
	if _, err := reg.ValidatingAdmissionPolicies().Create(ctx, pol, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ValidatingAdmissionPolicy: %v", err)
	}
	b := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: name + "-binding"}, Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
		PolicyName: name, ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
		ParamRef:       &admissionregistrationv1.ParamRef{Name: "must-have-owner", ParameterNotFoundAction: &deny},
		MatchResources: &admissionregistrationv1.MatchResources{NamespaceSelector: onlyNamespaces(ns)},
	}}
	if _, err := reg.ValidatingAdmissionPolicyBindings().Create(ctx, b, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ValidatingAdmissionPolicyBinding: %v", err)
	}
	t.Cleanup(func() {
		// t.Context() is done by now.
		ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
		defer cancel()
		_ = reg.ValidatingAdmissionPolicyBindings().Delete(ctx, b.Name, metav1.DeleteOptions{})
		_ = reg.ValidatingAdmissionPolicies().Delete(ctx, name, metav1.DeleteOptions{})
	})

	msg := provoke(t, e, ns, name)
	rep := runDoctor(t, e, doctor.Options{FromError: msg})
	byName := map[string]*doctor.PolicyReport{}
	for i := range rep.Policies {
		byName[rep.Policies[i].Kind+"/"+rep.Policies[i].Name] = &rep.Policies[i]
	}
	bind := byName["ValidatingAdmissionPolicyBinding/"+b.Name]
	if bind == nil || len(bind.Findings) < 2 || bind.Findings[0].ID != doctor.IDFromError || bind.Findings[1].ID != doctor.IDPolicyParamMissing || !bind.Findings[1].Lead {
		t.Fatalf("--from-error %q:\n%s", msg, render(rep))
	}
	contains(t, "KD902 what", bind.Findings[1].What, "constraints.gatekeeper.sh/v1beta1 K8sRequiredLabels, which the API server does not serve")
	p := byName["ValidatingAdmissionPolicy/"+name]
	if p == nil || !hasID(p.Findings, doctor.IDPolicyParamKindFail) {
		t.Fatalf("no KD903 for %s:\n%s", name, render(rep))
	}
}

func hasID(fs []doctor.Finding, id string) bool {
	for _, f := range fs {
		if f.ID == id {
			return true
		}
	}
	return false
}
