package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/kadmit/kadmit/internal/cmdexit"
)

// escalatePolicy is a MutatingAdmissionPolicy on clusterrolebindings that
// adds mallory to every new one (issue 20, point 6).
const escalatePolicy = `apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicy
metadata: {name: escalate}
spec:
  reinvocationPolicy: Never
  matchConstraints:
    resourceRules: [{apiGroups: ["rbac.authorization.k8s.io"], apiVersions: ["v1"], operations: ["CREATE"], resources: ["clusterrolebindings"]}]
  mutations:
  - patchType: JSONPatch
    jsonPatch:
      expression: '[JSONPatch{op: "add", path: "/subjects/-", value: {"kind": "User", "name": "mallory", "apiGroup": "rbac.authorization.k8s.io"}}]'
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicyBinding
metadata: {name: escalate}
spec: {policyName: escalate}
`

const adminBinding = `apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: admins}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}
subjects: [{kind: User, name: admin, apiGroup: rbac.authorization.k8s.io}]
`

func runTrustCmd(cmd *cobra.Command, args ...string) (string, error) {
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(context.Background())
	return out.String(), err
}

// kadmit review and kadmit test refuse a policy on a sensitive group with
// exit status 2, naming the flag, and run it with
// --policies-allow-sensitive-groups.
func TestSensitiveGroupsFlag(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{
		"policy.yaml": escalatePolicy,
		"crb.yaml":    adminBinding,
		"suite.yaml": "apiVersion: kadmit.io/v1alpha1\nkind: PolicyTest\npolicies: [policy.yaml]\ntests:\n- name: mallory is added\n  object: " +
			`{apiVersion: rbac.authorization.k8s.io/v1, kind: ClusterRoleBinding, metadata: {name: admins}, roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}, subjects: [{kind: User, name: admin, apiGroup: rbac.authorization.k8s.io}]}` +
			"\n  expect:\n    allowed: true\n    patched: {/subjects/1/name: mallory}\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	policy, crb := filepath.Join(dir, "policy.yaml"), filepath.Join(dir, "crb.yaml")
	suite := filepath.Join(dir, "suite.yaml")
	exit2 := func(what string, err error) {
		t.Helper()
		var ee *cmdexit.Error
		if !errors.As(err, &ee) || ee.Code != 2 || !strings.Contains(err.Error(), `"rbac.authorization.k8s.io": declared policies may not match`) || !strings.Contains(err.Error(), "--policies-allow-sensitive-groups") {
			t.Errorf("%s: %v, want exit 2 naming the group and the flag", what, err)
		}
	}
	_, err := runTrustCmd(newReviewCmd(), "-f", crb, "--policies", policy)
	exit2("review", err)
	out, err := runTrustCmd(newReviewCmd(), "-f", crb, "--policies", policy, "--policies-allow-sensitive-groups")
	if err != nil || !strings.Contains(out, `"name":"mallory"`) {
		t.Errorf("review --policies-allow-sensitive-groups: %v\n%s", err, out)
	}
	_, err = runTrustCmd(newTestCmd(), suite)
	exit2("test", err)
	out, err = runTrustCmd(newTestCmd(), suite, "--policies-allow-sensitive-groups")
	if err != nil || !strings.Contains(out, "1 passed") {
		t.Errorf("test --policies-allow-sensitive-groups: %v\n%s", err, out)
	}
}
