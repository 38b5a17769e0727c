package policysuite

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The example suite records the API server's decisions (test/e2e/celdiff
// checks it against kube-apiserver) and says defaults: true; run as
// written, without the defaults, the JSONPatch appending to tolerations
// fails on every pod that has none and the limits-only pod has no
// requests: the offline/server difference the option closes.
func TestDefaultsSuite(t *testing.T) {
	s, err := ReadSuite("../../examples/cel/defaults-tolerations/suite.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !s.Defaults {
		t.Fatal("the example suite must say defaults: true")
	}
	for _, defaults := range []bool{true, false} {
		s.Defaults = defaults
		rs, err := Run(context.Background(), s)
		if err != nil {
			t.Fatal(err)
		}
		failed := map[string]string{}
		for _, r := range rs {
			if len(r.Failures) > 0 {
				failed[r.Test] = strings.Join(r.Failures, "; ")
			}
		}
		if defaults {
			if len(failed) > 0 {
				t.Errorf("with defaults: %v", failed)
			}
			continue
		}
		if len(failed) != len(rs) {
			t.Errorf("without defaults: %d of %d tests failed, want all: %v", len(failed), len(rs), failed)
		}
		if f := failed[rs[0].Test]; !strings.Contains(f, `doc is missing path: "/spec/tolerations/-"`) {
			t.Errorf("without defaults, %s: got %s, want the JSONPatch failure", rs[0].Test, f)
		}
	}
}

// With defaults, what a mutating policy adds is defaulted as the API
// server defaults a policy's patched object: the documentation's sidecar
// gets a container's defaults, which a validating policy then sees.
func TestDefaultsAfterMutation(t *testing.T) {
	policy, err := filepath.Abs("../../examples/cel/docs-map-jsonpatch/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	suite := `apiVersion: kadmit.io/v1alpha1
kind: PolicyTest
policies: [` + policy + `]
defaults: true
tests:
- name: sidecar
  object:
    apiVersion: v1
    kind: Pod
    metadata: {name: p, namespace: default}
    spec:
      initContainers: [{name: init, image: busybox}]
      containers: [{name: c, image: nginx}]
  expect:
    allowed: true
    patched:
      /spec/initContainers/1/name: mesh-proxy
      /spec/initContainers/1/imagePullPolicy: Always  # the image "mesh-proxy/v1.0.0" has no tag
      /spec/initContainers/1/terminationMessagePath: /dev/termination-log
`
	file := filepath.Join(t.TempDir(), "suite.yaml")
	if err := os.WriteFile(file, []byte(suite), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := ReadSuite(file)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := Run(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 1 || len(rs[0].Failures) > 0 {
		t.Fatalf("with defaults: %+v", rs)
	}
	s.Defaults = false
	rs, err = Run(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	if f := strings.Join(rs[0].Failures, "; "); !strings.Contains(f, "imagePullPolicy: got nothing") {
		t.Errorf("without defaults: got %q, want the sidecar undefaulted", f)
	}
}
