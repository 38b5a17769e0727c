package kadmitpolicies_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/builtin"
	"github.com/kadmit/kadmit/internal/celpolicy"
	"github.com/kadmit/kadmit/internal/policy"
	"github.com/kadmit/kadmit/internal/policy/kadmit/kadmitpolicies"
	"github.com/kadmit/kadmit/internal/testkit"
)

// load is what serve hands the policy: LoadAll and New over the
// ConfigMap's documents (internal/serve declaredHooks).
func load(cm *corev1.ConfigMap) error {
	set, err := celpolicy.LoadAll(nil, celpolicy.ConfigMapDocuments(cm))
	if err != nil {
		return err
	}
	_, err = celpolicy.New(set, celpolicy.Options{})
	return err
}

func vap(expr string) string {
	return `apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: max}
spec:
  matchConstraints:
    resourceRules:
    - {apiGroups: [apps], apiVersions: [v1], operations: [CREATE], resources: [deployments]}
  validations:
  - expression: ` + expr + "\n"
}

func cmReq(ns, name string, data map[string]string) *admission.Request {
	raw, _ := json.Marshal(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: data})
	return testkit.Request(admissionv1.Update, testkit.ConfigMaps, raw, nil, testkit.Namespace(ns), testkit.Name(name))
}

func TestValidate(t *testing.T) {
	p, err := kadmitpolicies.New(policy.PoliciesConfigMap{Namespace: "kadmit-system", Name: "policies", Load: load})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if v := p.Validate(ctx, cmReq("kadmit-system", "policies", map[string]string{"p.yaml": vap("object.spec.replicas <= 5")})); !v.Allowed {
		t.Fatalf("compiling set denied: %+v", v)
	}
	v := p.Validate(ctx, cmReq("kadmit-system", "policies", map[string]string{"p.yaml": vap("object.spec.replicas <= (")}))
	if v.Allowed || v.Code != 403 {
		t.Fatalf("non-compiling set: %+v", v)
	}
	// The message is serve's own error for the same documents.
	want := load(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kadmit-system", Name: "policies"}, Data: map[string]string{"p.yaml": vap("object.spec.replicas <= (")}})
	if want == nil || v.Message != want.Error() || !strings.Contains(v.Message, "ConfigMap kadmit-system/policies data[p.yaml]") {
		t.Fatalf("message %q, want serve's %v naming the key", v.Message, want)
	}
	for _, r := range []*admission.Request{
		cmReq("kadmit-system", "other", map[string]string{"p.yaml": "{"}),
		cmReq("elsewhere", "policies", map[string]string{"p.yaml": "{"}),
	} {
		if v := p.Validate(ctx, r); !v.Allowed {
			t.Fatalf("unrelated ConfigMap denied: %+v", v)
		}
	}
	hs := p.Hooks()
	if len(hs) != 1 || hs[0].Path != kadmitpolicies.Path || hs[0].FailurePolicy != "Fail" || len(hs[0].Namespaces) != 1 || hs[0].Namespaces[0] != "kadmit-system" {
		t.Fatalf("hooks %+v", hs)
	}
}

// The seed profile guards the ConfigMap whenever serve follows one, and
// has no hook without one (offline, or no --policies-configmap).
func TestRegistered(t *testing.T) {
	cfg := builtin.Config.Default()
	names := func(env policy.Env) []string {
		hooks, err := builtin.Hooks(cfg, env)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, h := range hooks {
			if h.Policy == kadmitpolicies.Name {
				out = append(out, h.Path)
			}
		}
		return out
	}
	if got := names(policy.Env{}); len(got) != 0 {
		t.Fatalf("guard without a ConfigMap: %v", got)
	}
	if got := names(policy.Env{PoliciesConfigMap: &policy.PoliciesConfigMap{Namespace: "n", Name: "p", Load: load}}); len(got) != 1 {
		t.Fatalf("guard with a ConfigMap: %v", got)
	}
	if got := names(policy.Env{PoliciesConfigMap: &policy.PoliciesConfigMap{Namespace: "kube-system", Name: "p", Load: load}}); len(got) != 0 {
		t.Fatalf("guard registered for kube-system: %v", got)
	}
	off, err := builtin.Config.Parse([]byte("apiVersion: kadmit.io/v1alpha1\nkind: Configuration\npolicies:\n  kadmitPolicies: {enabled: false}\n"))
	if err != nil {
		t.Fatal(err)
	}
	hooks, err := builtin.Hooks(off, policy.Env{PoliciesConfigMap: &policy.PoliciesConfigMap{Namespace: "n", Name: "p", Load: load}})
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hooks {
		if h.Policy == kadmitpolicies.Name {
			t.Fatal("enabled: false still guards")
		}
	}
}
