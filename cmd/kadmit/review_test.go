package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReviewState runs `kadmit review` on a Job with and without --state:
// the LocalQueue named default in the state makes Kueue's defaulting give
// the job its queue.
func TestReviewState(t *testing.T) {
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cfg := file("kadmit.yaml", "apiVersion: kadmit.io/v1alpha1\nkind: Configuration\npolicies:\n  jobQueue: {enabled: true}\n")
	job := file("job.yaml", "apiVersion: batch/v1\nkind: Job\nmetadata: {name: j, namespace: team}\nspec:\n  template:\n    spec:\n      restartPolicy: Never\n      containers: [{name: c, image: pause}]\n")
	if err := os.Mkdir(filepath.Join(dir, "state"), 0o755); err != nil {
		t.Fatal(err)
	}
	file("state/lq.yaml", "apiVersion: kueue.x-k8s.io/v1beta1\nkind: LocalQueue\nmetadata: {name: default, namespace: team}\nspec: {clusterQueue: cq}\n")
	run := func(args ...string) (string, error) {
		cmd := newReviewCmd()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(args)
		err := cmd.Execute()
		return out.String(), err
	}
	out, err := run("-f", job, "--config", cfg, "-o", "json")
	if err != nil || strings.Contains(out, `kueue.x-k8s.io/queue-name`) || !strings.Contains(out, "give --state") {
		t.Fatalf("without --state: %v\n%s", err, out)
	}
	out, err = run("-f", job, "--config", cfg, "-o", "json", "--state", filepath.Join(dir, "state"))
	if err != nil || !strings.Contains(out, `"path":"/metadata/labels","value":{"kueue.x-k8s.io/queue-name":"default"}`) {
		t.Fatalf("with --state: %v\n%s", err, out)
	}
	file("state/bad.yaml", "apiVersion: kueue.x-k8s.io/v1beta1\nkind: LocalQueue\nmetadata: {name: default, namespace: team}\n")
	if _, err := run("-f", job, "--config", cfg, "--state", filepath.Join(dir, "state")); err == nil ||
		!strings.Contains(err.Error(), `lq.yaml (document 0): LocalQueue "default" in namespace "team" is also in `+filepath.Join(dir, "state", "bad.yaml")+" (document 0)") {
		t.Fatalf("duplicate state object: %v", err)
	}
}

// TestReviewKueueExamples runs examples/scheduling/kueue as its header
// comments say.
func TestReviewKueueExamples(t *testing.T) {
	ex := filepath.Join("..", "..", "examples", "scheduling")
	run := func(args ...string) (string, error) {
		cmd := newReviewCmd()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(append([]string{"--config", filepath.Join(ex, "kueue-kadmit.yaml"), "-o", "json"}, args...))
		err := cmd.Execute()
		return out.String(), err
	}
	job := filepath.Join(ex, "kueue", "job-namespace-default-queue.yaml")
	out, err := run("-f", job, "--state", filepath.Join(ex, "state"))
	if err != nil || !strings.Contains(out, `"kueue.x-k8s.io/queue-name":"default"`) || !strings.Contains(out, `"kueue.x-k8s.io/managed":"true"`) ||
		!strings.Contains(out, `"suspend":true`) {
		t.Fatalf("with state: %v\n%s", err, out)
	}
	if out, err = run("-f", job); err != nil || strings.Contains(out, `"kueue.x-k8s.io/queue-name"`) || !strings.Contains(out, "give --state") {
		t.Fatalf("without state: %v\n%s", err, out)
	}
	out, err = run("-f", filepath.Join(ex, "kueue", "job-bad-max-exec-time.yaml"))
	if err == nil || !strings.Contains(out, `"code":403`) || !strings.Contains(out, `Invalid value: 0: should be greater than 0`) {
		t.Fatalf("max-exec-time: %v\n%s", err, out)
	}
	if out, err = run("-f", filepath.Join(ex, "kueue", "flavor-relabel.yaml"), "--operation", "UPDATE",
		"--old", filepath.Join(ex, "manifests", "flavor-good.yaml")); err != nil {
		t.Fatalf("flavor update: %v\n%s", err, out)
	}
}

// TestReviewContext runs `kadmit review --policies` with the request's
// context from the flags: --group reaching request.userInfo.groups, the
// namespaces of --state reaching a binding's namespaceSelector, and a
// generateName pod named before the validating policies.
func TestReviewContext(t *testing.T) {
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	policies := file("policies/p.yaml", `apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: prod-deployers}
spec:
  matchConstraints:
    resourceRules: [{apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [configmaps]}]
  validations:
  - expression: "'deployers' in request.userInfo.?groups.orValue([])"
    messageExpression: "request.userInfo.username + ' may not write to ' + namespaceObject.metadata.labels.env"
    reason: Forbidden
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: prod}
spec:
  policyName: prod-deployers
  validationActions: [Deny]
  matchResources: {namespaceSelector: {matchLabels: {env: prod}}}
`)
	state := file("state/ns.yaml", "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop, labels: {env: prod}}\n")
	cm := file("cm.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c, namespace: shop}\n")
	run := func(args ...string) (string, error) {
		cmd := newReviewCmd()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(append([]string{"--policies", filepath.Dir(policies), "-f", cm}, args...))
		err := cmd.Execute()
		return out.String(), err
	}
	// Without the state, shop has no env label: the binding does not match.
	if out, err := run(); err != nil {
		t.Fatalf("without --state: %v\n%s", err, out)
	}
	out, err := run("--state", state, "--user", "alice", "--group", "dev")
	if err == nil || !strings.Contains(out, "alice may not write to prod") {
		t.Fatalf("alice in dev: %v\n%s", err, out)
	}
	if out, err := run("--state", state, "--user", "alice", "--group", "dev", "--group", "deployers"); err != nil {
		t.Fatalf("alice in deployers: %v\n%s", err, out)
	}
	if _, err := run("--group", "deployers"); err == nil || !strings.Contains(err.Error(), "--group and --uid need --user") {
		t.Fatalf("--group without --user: %v", err)
	}

	// generateName: the validating policy reads the generated name.
	file("policies/name.yaml", `apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: name-length}
spec:
  matchConstraints:
    resourceRules: [{apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [pods]}]
  validations:
  - expression: "object.metadata.name.size() <= 63"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: name-length}
spec: {policyName: name-length, validationActions: [Deny]}
`)
	pod := file("pod.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {generateName: web-, namespace: shop}\nspec: {containers: [{name: c, image: nginx}]}\n")
	cmd := newReviewCmd()
	var buf bytes.Buffer
	cmd.SetOut(&buf)
	cmd.SetErr(&buf)
	cmd.SetArgs([]string{"--policies", filepath.Dir(policies), "-f", pod, "-o", "json"})
	if err := cmd.Execute(); err != nil || !strings.Contains(buf.String(), `"name":"web-`) || !strings.Contains(buf.String(), `"allowed":true`) {
		t.Fatalf("generateName pod: %v\n%s", err, buf.String())
	}
}
