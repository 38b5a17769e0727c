package sloconfig

import (
	"context"
	"errors"
	"slices"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/policy/kadmit/kadmitconfig"
	"github.com/kadmit/kadmit/internal/registration"
)

// TestCoexistsWithKadmitConfig: kadmit-config and slo-config share
// /validate-configmap; the chain runs both, each judges only its own
// ConfigMap, and the registered webhook's namespaceSelector names both
// namespaces.
func TestCoexistsWithKadmitConfig(t *testing.T) {
	kc, err := kadmitconfig.New(kadmitconfig.Config{Namespace: "kadmit", Name: "kadmit", Key: "config.yaml"},
		func(*corev1.ConfigMap, string) error { return errors.New("kadmit config refused") })
	if err != nil {
		t.Fatal(err)
	}
	sc := newPolicy(t, DefaultConfig(), nil)
	hooks := append(kc.Hooks(), sc.Hooks()...)
	whs, err := admission.NewWebhooks(hooks)
	if err != nil {
		t.Fatal(err)
	}
	var cmHook *admission.Webhook
	for _, wh := range whs {
		if wh.Path == "/validate-configmap" {
			cmHook = wh
		}
	}
	if cmHook == nil || len(cmHook.Hooks) != 2 {
		t.Fatalf("webhooks %+v", whs)
	}
	ctx := context.Background()
	bad := map[string]string{ColocationConfigKey: `{"metricAggregateDurationSeconds":-1}`}
	out, err := cmHook.Review(ctx, cmReq(admissionv1.Create, bad, nil))
	if err != nil || out.Response.Allowed || out.Policy != Name || out.Response.Result.Code != 400 {
		t.Fatalf("slo-controller-config: %+v %v", out, err)
	}
	good := map[string]string{ColocationConfigKey: `{"enable":true}`}
	if out, err := cmHook.Review(ctx, cmReq(admissionv1.Create, good, nil)); err != nil || !out.Response.Allowed || out.Matched != 2 {
		t.Fatalf("good slo-controller-config: %+v %v", out, err)
	}
	// DELETE reaches only slo-config (kadmit-config handles CREATE, UPDATE).
	if out, err := cmHook.Review(ctx, cmReq(admissionv1.Delete, nil, bad)); err != nil || !out.Response.Allowed || out.Matched != 1 {
		t.Fatalf("delete: %+v %v", out, err)
	}
	// kadmit's own ConfigMap is judged by kadmit-config alone.
	r := cmReq(admissionv1.Create, map[string]string{"config.yaml": "x"}, nil)
	r.Namespace, r.Name = "kadmit", "kadmit"
	r.Object.Raw = cmRaw("kadmit", "kadmit", map[string]string{"config.yaml": "x"})
	if out, err := cmHook.Review(ctx, r); err != nil || out.Response.Allowed || out.Policy != kadmitconfig.Name {
		t.Fatalf("kadmit config: %+v %v", out, err)
	}
	_, vwc, err := registration.Build(hooks, registration.Options{URL: "https://127.0.0.1:9443"})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range vwc.Webhooks {
		if w.Name != "validate-configmap.kadmit.io" {
			continue
		}
		vals := w.NamespaceSelector.MatchExpressions[0].Values
		if !slices.Contains(vals, "kadmit") || !slices.Contains(vals, DefaultNamespace) || string(*w.FailurePolicy) != "Fail" {
			t.Fatalf("selector %+v", w.NamespaceSelector)
		}
		return
	}
	t.Fatal("no validate-configmap webhook")
}
