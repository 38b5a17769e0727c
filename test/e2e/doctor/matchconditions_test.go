package doctor

import (
	"context"
	"fmt"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kadmit/kadmit/internal/doctor"
	"github.com/kadmit/kadmit/test/e2e/e2eenv"
	"github.com/kadmit/kadmit/test/poll"
)

// dryRunPod dry-runs the creation of a pod with labels in ns, as the
// ReplicaSet controller would, and returns the API server's answer.
func dryRunPod(ctx context.Context, e *env, ns string, labels map[string]string) error {
	_, err := e.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "manager-", Labels: labels},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "manager", Image: "example.com/manager"}}},
	}, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	return err
}

// TestMatchConditionExcludesOwnNamespace: two Fail webhooks on pod CREATE
// whose namespaceSelector matches their own namespace, with no pod running
// (a fresh install). One excludes its own namespace only by a matchCondition
// (as Kyverno's --excludeBootstrapResources does): no deadlock. The other's
// condition excludes something else: KD501, and the API server agrees in
// both cases (it admits the first's pods and rejects the second's).
func TestMatchConditionExcludesOwnNamespace(t *testing.T) {
	e := world(t)
	nsOK := namespace(t, e, "kyverno", nil)
	nsBad := namespace(t, e, "policy-system", nil)
	labels := map[string]string{"app.kubernetes.io/name": "admission-controller"}
	workload(t, e, nsOK, "kyverno-admission-controller", labels, 0)
	workload(t, e, nsBad, "policy-admission-controller", labels, 0)
	service(t, e, nsOK, "kyverno-svc", labels)
	service(t, e, nsBad, "policy-svc", labels)
	bundle := newCA(t).pem()
	const okConfig, badConfig = "kyverno-resource-validating-webhook-cfg", "policy-validating-webhook-cfg"
	// Created first, so that once the API server has loaded the second, it
	// has loaded this one too (one informer, in resourceVersion order).
	validating(t, e, okConfig, hook{Name: "validate.kyverno.svc-fail", Service: svcRef(nsOK, "kyverno-svc"), CABundle: bundle, Fail: true,
		NamespaceSelector: onlyNamespaces(nsOK),
		MatchConditions:   []admissionregistrationv1.MatchCondition{{Name: "exclude-own-namespace", Expression: fmt.Sprintf(`request.namespace != %q`, nsOK)}}})
	validating(t, e, badConfig, hook{Name: "validate.policy.example.com", Service: svcRef(nsBad, "policy-svc"), CABundle: bundle, Fail: true,
		NamespaceSelector: onlyNamespaces(nsBad),
		MatchConditions: []admissionregistrationv1.MatchCondition{
			{Name: "exclude-kube-system", Expression: `request.namespace != "kube-system"`},
			{Name: "not-dry-run-of-nodes", Expression: `!("system:nodes" in request.userInfo.groups)`},
		}})

	rep := runDoctor(t, e, doctor.Options{Names: []string{okConfig, badConfig}})
	if w := hookReport(t, rep, okConfig, "validate.kyverno.svc-fail"); w.Has(doctor.IDSelfInterception) || w.Has(doctor.IDMatchConditionError) {
		t.Errorf("webhook excluding its own namespace by a matchCondition reported:\n%s", render(rep))
	}
	f := need(t, rep, hookReport(t, rep, badConfig, "validate.policy.example.com"), doctor.IDSelfInterception, doctor.SeverityError)[0]
	contains(t, "KD501 what", f.What, "new pods of Deployment/policy-admission-controller", "2 matchCondition(s)", "all return true",
		"system:serviceaccount:kube-system:replicaset-controller")

	if !e.Routed {
		return // the API server would dial ClusterIPs: only inside the private namespace
	}
	// The API server's own verdict on the same requests (no endpoints:
	// every call fails at once).
	ctx := e2eenv.TestCtx(t, 2*webhookTakeEffect)
	if err := poll.Until(ctx, webhookTakeEffect, func(ctx context.Context) error {
		err := dryRunPod(ctx, e, nsBad, labels)
		if err != nil && strings.Contains(err.Error(), `"validate.policy.example.com"`) {
			return nil
		}
		return fmt.Errorf("not yet rejected: %v", err)
	}); err != nil {
		t.Fatalf("the API server does not reject the second webhook's own pods: %v", err)
	}
	if err := dryRunPod(ctx, e, nsOK, labels); err != nil {
		t.Errorf("the API server rejects the pods of the webhook that excludes its namespace by a matchCondition: %v", err)
	}
}

// TestMatchConditionThatDoesNotCompile: a stored condition the API server's
// CEL environment cannot compile (possible in objects stored by another API
// server version) fails every matched request with failurePolicy Fail.
// The API server refuses to store one, so this checks that it does, and
// that doctor compiles the conditions it is given with the same library.
func TestMatchConditionThatDoesNotCompile(t *testing.T) {
	e := world(t)
	ctx := e2eenv.TestCtx(t, apiTimeout)
	fail, none := admissionregistrationv1.Fail, admissionregistrationv1.SideEffectClassNone
	c := &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "bad-cel-" + suffix()}, Webhooks: []admissionregistrationv1.ValidatingWebhook{{
		Name: "bad-cel.example.com", ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: ptr("https://127.0.0.1:1/")}, Rules: podRules(),
		FailurePolicy: &fail, SideEffects: &none, AdmissionReviewVersions: []string{"v1"},
		MatchConditions: []admissionregistrationv1.MatchCondition{{Name: "broken", Expression: `request.namespace ==`}},
	}}}
	_, err := e.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, c, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err == nil || !strings.Contains(err.Error(), "compil") {
		t.Fatalf("the API server stored a condition that does not compile: %v", err)
	}
	w := doctor.FromValidating(c)[0]
	if got := w.EvalConditions(ctx, doctor.Object{Request: doctor.Request{Version: "v1", Resource: "pods", Operation: "CREATE", Namespaced: true}, Kind: "Pod", Namespace: "default"}); got.Err == nil {
		t.Errorf("doctor evaluated a condition the API server cannot compile: %+v", got)
	}
}
