package serve

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kadmit/kadmit/internal/celpolicy"
)

// serve's --policies-allow-sensitive-groups (Options.PolicyAllowSensitiveGroups)
// reaches the loader for files and the ConfigMap alike: refused without
// it, loaded with it.
func TestDeclaredHooksSensitiveGroups(t *testing.T) {
	const escalate = "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicy\nmetadata: {name: rbac}\nspec:\n" +
		"  matchConstraints:\n    resourceRules: [{apiGroups: [\"rbac.authorization.k8s.io\"], apiVersions: [\"v1\"], operations: [\"*\"], resources: [\"*\"]}]\n" +
		"  validations: [{expression: 'false'}]\n---\napiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicyBinding\nmetadata: {name: rbac}\nspec: {policyName: rbac, validationActions: [Deny]}\n"
	file := filepath.Join(t.TempDir(), "p.yaml")
	if err := os.WriteFile(file, []byte(escalate), 0o600); err != nil {
		t.Fatal(err)
	}
	docs := []celpolicy.Document{{Name: "ConfigMap ns/p data[p.yaml]", Data: escalate}}
	for name, in := range map[string]struct {
		paths []string
		docs  []celpolicy.Document
	}{"file": {paths: []string{file}}, "configmap": {docs: docs}} {
		if _, err := declaredHooks(declaredLoad(Options{}), in.paths, in.docs); err == nil || !strings.Contains(err.Error(), "declared policies may not match") {
			t.Errorf("%s, default: %v", name, err)
		}
		hooks, err := declaredHooks(declaredLoad(Options{PolicyAllowSensitiveGroups: true}), in.paths, in.docs)
		if err != nil || len(hooks) != 1 {
			t.Errorf("%s, allowed: %d hooks, %v", name, len(hooks), err)
		}
	}
}
