package serve

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/celpolicy"
)

func TestDeclaredHooks(t *testing.T) {
	hooks, err := declaredHooks(celpolicy.LoadOptions{}, []string{"../../examples/cel/lifespan"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]admission.Type{"map-lifespan": admission.Mutating, "vap-lifespan-label": admission.Validating}
	if len(hooks) != len(want) {
		t.Fatalf("hooks = %+v", hooks)
	}
	for _, h := range hooks {
		if want[h.Policy] != h.Type {
			t.Errorf("hook %s %s", h.Policy, h.Type)
		}
	}
	if _, err := admission.NewWebhooks(hooks); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicyBinding\nmetadata: {name: b}\nspec: {policyName: none, validationActions: [Deny]}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := declaredHooks(celpolicy.LoadOptions{}, []string{bad}, nil); !errors.Is(err, celpolicy.ErrInput) {
		t.Errorf("bad policy file: %v", err)
	}
}
