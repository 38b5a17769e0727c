package builtin

// Policies of different origins that share a path or an object: each
// policy package tests its own rules; how two of them behave in one chain
// is tested here, where they are composed, so that no policy package
// imports another origin's policy (hack/check-layers.sh).

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/policy/kadmit/kadmitconfig"
	"github.com/kadmit/kadmit/internal/policy/koordinator/nodeamplification"
	"github.com/kadmit/kadmit/internal/policy/koordinator/sloconfig"
	"github.com/kadmit/kadmit/internal/policy/seed/nodeovercommit"
	"github.com/kadmit/kadmit/internal/registration"
	"github.com/kadmit/kadmit/internal/testkit"
)

// TestWithNodeOvercommit: both policies enabled on /mutate-node-status.
// node-overcommit runs first (registry order) and amplifies cpu; the
// Koordinator ratio then amplifies only memory, records only memory as
// raw, and warns that its cpu ratio is ignored. cpu is never amplified
// twice.
func TestWithNodeOvercommit(t *testing.T) {
	oc, err := nodeovercommit.New(nodeovercommit.DefaultConfig()) // cpu ×2
	if err != nil {
		t.Fatal(err)
	}
	na, _ := nodeamplification.New(nodeamplification.Config{})
	whs, err := admission.NewWebhooks(append(oc.Hooks(), na.Hooks()...))
	if err != nil {
		t.Fatal(err)
	}
	var wh *admission.Webhook
	for _, w := range whs {
		if w.Path == nodeamplification.Path {
			wh = w
		}
	}
	in := testkit.NodeJSON(t, "test-node", map[string]string{nodeamplification.AnnotationRatio: `{"cpu":1.5,"memory":2}`},
		corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("8Gi")})
	out, err := wh.Review(context.Background(), statusReq(admissionv1.Update, in, in))
	if err != nil || !out.Response.Allowed || out.Matched != 2 {
		t.Fatalf("%+v %v", out, err)
	}
	n := testkit.Decode[corev1.Node](t, out.Object)
	if cpu := n.Status.Allocatable.Cpu(); cpu.Cmp(resource.MustParse("8")) != 0 {
		t.Fatalf("cpu %s, want 8 (node-overcommit's ×2 only)", cpu)
	}
	if mem := n.Status.Allocatable.Memory(); mem.Cmp(resource.MustParse("16Gi")) != 0 {
		t.Fatalf("memory %s, want 16Gi", mem)
	}
	if raw := n.Annotations[nodeamplification.AnnotationRawAllocatable]; raw != `{"memory":"8Gi"}` {
		t.Fatalf("raw-allocatable %q", raw)
	}
	if len(out.Response.Warnings) != 1 || !strings.Contains(out.Response.Warnings[0], "cpu is amplified by node-overcommit") {
		t.Fatalf("warnings %v", out.Response.Warnings)
	}
	// Applied again on its own output (the kubelet's next status write
	// that carries the same values), nothing moves.
	again, err := wh.Review(context.Background(), statusReq(admissionv1.Update, string(out.Object), string(out.Object)))
	if err != nil || len(again.Patch) != 0 {
		t.Fatalf("second review: %+v %v", again.Patch, err)
	}
}

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
	sc, err := sloconfig.New(sloconfig.DefaultConfig(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
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
	bad := map[string]string{sloconfig.ColocationConfigKey: `{"metricAggregateDurationSeconds":-1}`}
	out, err := cmHook.Review(ctx, cmReq(admissionv1.Create, bad, nil))
	if err != nil || out.Response.Allowed || out.Policy != sloconfig.Name || out.Response.Result.Code != 400 {
		t.Fatalf("slo-controller-config: %+v %v", out, err)
	}
	good := map[string]string{sloconfig.ColocationConfigKey: `{"enable":true}`}
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
		if !slices.Contains(vals, "kadmit") || !slices.Contains(vals, sloconfig.DefaultNamespace) || string(*w.FailurePolicy) != "Fail" {
			t.Fatalf("selector %+v", w.NamespaceSelector)
		}
		return
	}
	t.Fatal("no validate-configmap webhook")
}

func statusReq(op admissionv1.Operation, obj, old string) *admission.Request {
	return testkit.Request(op, testkit.Nodes, obj, old, testkit.Name("test-node"), testkit.SubResource("status"))
}

func cmRaw(ns, name string, data map[string]string) []byte {
	b, _ := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"namespace": ns, "name": name}, "data": data})
	return b
}

// cmReq reviews slo-config's own ConfigMap (data, and old for UPDATE and
// DELETE).
func cmReq(op admissionv1.Operation, data, old map[string]string) *admission.Request {
	var obj, prev []byte
	if op != admissionv1.Delete {
		obj = cmRaw(sloconfig.DefaultNamespace, sloconfig.DefaultName, data)
	}
	if old != nil {
		prev = cmRaw(sloconfig.DefaultNamespace, sloconfig.DefaultName, old)
	}
	return testkit.Request(op, testkit.ConfigMaps, obj, prev, testkit.Namespace(sloconfig.DefaultNamespace), testkit.Name(sloconfig.DefaultName))
}
