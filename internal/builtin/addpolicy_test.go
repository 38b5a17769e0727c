package builtin_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/builtin"
	"github.com/kadmit/kadmit/internal/clustercache"
	"github.com/kadmit/kadmit/internal/config"
	"github.com/kadmit/kadmit/internal/policy"
	"github.com/kadmit/kadmit/internal/served"
)

// This file follows docs/architecture.md's "How to add a policy" step by
// step with a trivial policy, so the recipe stays true. It is an external
// test package so that step 5 can run the chart generator (package served,
// which imports builtin).

// Step 1: the policy's config, with Validate naming the field.
type denyLabelConfig struct {
	Label string `json:"label"`
}

func (c denyLabelConfig) Validate() error {
	if c.Label == "" {
		return errors.New("label: must not be empty")
	}
	return nil
}

// Step 2: the policy: a Validator that reads only what it needs.
type denyLabel struct{ label string }

var _ admission.Validator = denyLabel{}

func (p denyLabel) Validate(_ context.Context, req *admission.Request) admission.Verdict {
	var pod struct {
		Metadata struct {
			Labels map[string]string `json:"labels"`
		} `json:"metadata"`
	}
	if _, err := admission.DecodeFields(req.Object.Raw, admission.Keep{"metadata": {"labels": nil}}, &pod); err != nil {
		return admission.Invalid("deny-label: %v", err)
	}
	if _, ok := pod.Metadata.Labels[p.label]; ok {
		return admission.Deny("label %s is not allowed", p.label)
	}
	return admission.Allow()
}

// Step 3: the Definition: name, section key, defaults, hooks, caches.
var denyLabelDefinition = &policy.Definition[denyLabelConfig]{
	PolicyName: "deny-label",
	SectionKey: "denyLabel",
	Defaults:   func() denyLabelConfig { return denyLabelConfig{Label: "example.com/forbidden"} },
	Build: func(cfg denyLabelConfig, _ policy.Env) ([]admission.Hook, error) {
		return []admission.Hook{{
			Policy: "deny-label", Path: "/validate-pod", Type: admission.Validating,
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
			}},
			FailurePolicy: admissionregistrationv1.Fail,
			Validator:     denyLabel{cfg.Label},
		}}, nil
	},
}

func TestAddPolicy(t *testing.T) {
	// Step 4: one line in the registry (here a copy of it).
	reg := append(append(policy.Registry{}, builtin.Registry...), denyLabelDefinition)
	if err := reg.Validate(); err != nil {
		t.Fatal(err)
	}
	loader := config.Loader{Registry: reg}

	// Step 5: RBAC, below (TestAddPolicyRBAC).

	// Step 6: the section parses, validates and builds like any other.
	cfg, err := loader.Parse([]byte("apiVersion: kadmit.io/v1alpha1\nkind: Configuration\npolicies:\n  denyLabel: {enabled: true, label: team/banned, failurePolicy: Ignore}\n"))
	if err != nil {
		t.Fatal(err)
	}
	hooks, err := builtin.Hooks(cfg, policy.Env{})
	if err != nil {
		t.Fatal(err)
	}
	whs, err := admission.NewWebhooks(hooks)
	if err != nil {
		t.Fatal(err)
	}
	var validatePod *admission.Webhook
	for _, wh := range whs {
		if wh.Path == "/validate-pod" {
			validatePod = wh
		}
	}
	if validatePod == nil || len(validatePod.Hooks) != 2 || validatePod.Hooks[1].Policy != "deny-label" ||
		validatePod.Hooks[1].FailurePolicy != admissionregistrationv1.Ignore {
		t.Fatalf("/validate-pod = %+v", validatePod)
	}
	review := func(labels string) *admissionv1.AdmissionResponse {
		t.Helper()
		raw := fmt.Appendf(nil, `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","labels":{%s}}}`, labels)
		out, err := validatePod.Review(context.Background(), &admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
			UID: "u", Operation: admissionv1.Create, Namespace: "ns",
			Kind:     metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
			Object:   runtime.RawExtension{Raw: raw},
		}})
		if err != nil {
			t.Fatal(err)
		}
		return out.Response
	}
	if r := review(`"team/banned":"x"`); r.Allowed || r.Result.Code != 403 || !strings.Contains(r.Result.Message, "team/banned") {
		t.Fatalf("labelled pod: %+v", r)
	}
	if r := review(`"team/ok":"x"`); !r.Allowed {
		t.Fatalf("plain pod: %+v", r.Result)
	}

	// Errors name the policy and the field.
	if _, err := loader.Parse([]byte("apiVersion: kadmit.io/v1alpha1\nkind: Configuration\npolicies:\n  denyLabel: {label: \"\"}\n")); err == nil ||
		err.Error() != "invalid kadmit configuration: policies.denyLabel.label: must not be empty" {
		t.Fatalf("empty label: %v", err)
	}
	// The seed loader does not know the new section.
	if _, err := builtin.Config.Parse([]byte("apiVersion: kadmit.io/v1alpha1\nkind: Configuration\npolicies:\n  denyLabel: {}\n")); err == nil ||
		!strings.Contains(err.Error(), "policies.denyLabel: unknown policy") {
		t.Fatalf("unknown section: %v", err)
	}
}

func TestHookNamingAnotherPolicyIsRefused(t *testing.T) {
	bad := &policy.Definition[denyLabelConfig]{
		PolicyName: "bad", SectionKey: "bad", EnabledByDefault: true,
		Defaults: denyLabelDefinition.Defaults,
		Build: func(cfg denyLabelConfig, env policy.Env) ([]admission.Hook, error) {
			return denyLabelDefinition.Build(cfg, env) // hooks say "deny-label"
		},
	}
	cfg := config.Loader{Registry: policy.Registry{bad}}.Default()
	if _, err := builtin.Hooks(cfg, policy.Env{}); err == nil || !strings.HasPrefix(err.Error(), "policy bad: hook on /validate-pod names policy \"deny-label\"") {
		t.Fatalf("err = %v", err)
	}
}

// Step 5, RBAC: a policy without Caches leaves the chart's grants as they
// are; one that declares Caches (here deny-label reading namespace labels)
// changes them, so the committed chart is stale (TestChartCachesGenerated
// in internal/served fails) until `make generate` rewrites it from the
// registry, and the rewritten chart grants the read when the section is
// enabled. The recipe says so.
func TestAddPolicyRBAC(t *testing.T) {
	committed, err := os.ReadFile(filepath.Join("..", "..", served.ChartCachesPath))
	if err != nil {
		t.Fatal(err)
	}
	without, err := served.ChartCachesTemplate(append(append(policy.Registry{}, builtin.Registry...), denyLabelDefinition))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(without, committed) {
		t.Fatalf("a policy without caches changed the chart's grants, or %s is stale (make generate)", served.ChartCachesPath)
	}

	withCache := *denyLabelDefinition
	withCache.Caches = func(denyLabelConfig) []clustercache.Read {
		return []clustercache.Read{clustercache.Namespaces.Keep(clustercache.P("metadata", "labels"))}
	}
	generated, err := served.ChartCachesTemplate(append(append(policy.Registry{}, builtin.Registry...), &withCache))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(generated, committed) {
		t.Fatal("the generator ignores the new policy's cache: make generate would not grant it")
	}
	for _, want := range []string{
		`{{- if dig "policies" "denyLabel" "enabled" false .Values.config }}{{ $on = true }}{{ end }}`,
		"deny-label (denyLabel.enabled)",
	} {
		if !bytes.Contains(generated, []byte(want)) {
			t.Errorf("generated chart lacks %s", want)
		}
	}

	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, recipe, _ := strings.Cut(string(doc), "## How to add a policy")
	recipe, _, _ = strings.Cut(recipe, "\n## ")
	if !strings.Contains(recipe, "**RBAC.**") || !strings.Contains(recipe, "`make generate`") || !strings.Contains(recipe, served.ChartCachesPath) {
		t.Errorf("docs/architecture.md's recipe does not give the RBAC step (make generate, %s)", served.ChartCachesPath)
	}
}
