package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kadmit/kadmit/internal/cmdexit"
)

// --defaults on kadmit review and kadmit test: the example policies deny a
// pod that sets CPU limits only (review) and fail on pods without
// tolerations (test) without it (exit 1), and pass with it (exit 0), as on
// the API server.
func TestDefaultsFlag(t *testing.T) {
	dir := t.TempDir()
	pod := filepath.Join(dir, "pod.yaml")
	if err := os.WriteFile(pod, []byte("apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: default}\nspec:\n  containers: [{name: c, image: nginx, resources: {limits: {cpu: 500m}}}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	policy := "../../examples/cel/defaults-tolerations/policy.yaml"
	out, err := runTrustCmd(newReviewCmd(), "-f", pod, "--policies", policy)
	var ce *cmdexit.Error
	if !errors.As(err, &ce) || ce.Code != 1 || !strings.Contains(out, "every container must request CPU") {
		t.Fatalf("review without --defaults: %v\n%s", err, out)
	}
	out, err = runTrustCmd(newReviewCmd(), "-f", pod, "--policies", policy, "--defaults", "-o", "json")
	if err != nil || !strings.Contains(out, `"allowed":true`) || !strings.Contains(out, `"key":"dedicated"`) {
		t.Fatalf("review --defaults: %v\n%s", err, out)
	}

	// The suite says defaults: true; a copy without it needs --defaults.
	suite, err := os.ReadFile("../../examples/cel/defaults-tolerations/suite.yaml")
	if err != nil {
		t.Fatal(err)
	}
	abs, err := filepath.Abs(policy)
	if err != nil {
		t.Fatal(err)
	}
	plain := strings.Replace(strings.Replace(string(suite), "\ndefaults: true\n", "\n", 1), "policies: [policy.yaml]", "policies: ["+abs+"]", 1)
	if plain == string(suite) {
		t.Fatal("the example suite changed: no defaults: true to remove")
	}
	if err := os.WriteFile(filepath.Join(dir, "suite.yaml"), []byte(plain), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := runTrustCmd(newTestCmd(), dir); !errors.As(err, &ce) || ce.Code != 1 || !strings.Contains(out, "4 tests, 0 passed, 4 failed") {
		t.Fatalf("test without --defaults: %v\n%s", err, out)
	}
	if out, err := runTrustCmd(newTestCmd(), "--defaults", dir); err != nil || !strings.Contains(out, "4 tests, 4 passed, 0 failed") {
		t.Fatalf("test --defaults: %v\n%s", err, out)
	}
}
