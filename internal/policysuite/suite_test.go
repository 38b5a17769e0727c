package policysuite

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kadmit/kadmit/internal/celpolicy"
)

func runDir(t *testing.T, dir string) ([]Result, error) {
	t.Helper()
	files, err := Find(dir)
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		t.Fatalf("no suites under %s", dir)
	}
	var all []Result
	for _, f := range files {
		s, err := ReadSuite(f)
		if err != nil {
			return nil, err
		}
		rs, err := Run(context.Background(), s)
		if err != nil {
			return nil, err
		}
		all = append(all, rs...)
	}
	return all, nil
}

func TestPassingSuite(t *testing.T) {
	rs, err := runDir(t, "testdata/pass")
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if n := Print(&out, rs); n != 0 || len(rs) != 3 {
		t.Fatalf("failed %d of %d:\n%s", n, len(rs), out.String())
	}
}

// Every test of the failing suite must fail, each for the stated reasons.
func TestFailingSuite(t *testing.T) {
	rs, err := runDir(t, "testdata/fail")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{
		"expects allowed but denied": {"allowed: got false (422 "},
		"wrong message and warnings": {"code: got 422, want 403", "want it to contain \"replicas <= 3\"", "warnings: got [\"Validation failed"},
		"wrong patched field":        {"patched /spec/initContainers/1/image: got \"mesh/proxy:v1.0.0\", want \"mesh/proxy:v2\""},
	}
	var out bytes.Buffer
	if n := Print(&out, rs); n != len(want) {
		t.Fatalf("failed %d, want %d:\n%s", n, len(want), out.String())
	}
	for _, r := range rs {
		joined := strings.Join(r.Failures, "\n")
		for _, w := range want[r.Test] {
			if !strings.Contains(joined, w) {
				t.Errorf("%s: failures %q lack %q", r.Test, joined, w)
			}
		}
	}
}

func TestInputErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cases := map[string]struct{ body, want string }{
		"unknown field": {"apiVersion: kadmit.io/v1alpha1\nkind: PolicyTest\npolicies: [x]\ntests: [{name: a, expect: {allowed: true}, objekt: {}}]\n", "unknown field"},
		"no allowed":    {"apiVersion: kadmit.io/v1alpha1\nkind: PolicyTest\npolicies: [x]\ntests: [{name: a, object: {kind: Pod}, expect: {}}]\n", "expect.allowed is required"},
		"no policies":   {"apiVersion: kadmit.io/v1alpha1\nkind: PolicyTest\ntests: [{name: a, expect: {allowed: true}}]\n", "policies: at least one"},
		"bad pointer":   {"apiVersion: kadmit.io/v1alpha1\nkind: PolicyTest\npolicies: [x]\ntests: [{name: a, object: {kind: Pod}, expect: {allowed: true, patched: {'spec': 1}}}]\n", "is not a JSON pointer"},
	}
	for name, c := range cases {
		_, err := ReadSuite(write(strings.ReplaceAll(name, " ", "-")+".yaml", c.body))
		if err == nil || !errors.Is(err, ErrInput) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want %q", name, err, c.want)
		}
	}
	// A missing policy file is an input error naming it.
	s, err := ReadSuite(write("missing.yaml", "apiVersion: kadmit.io/v1alpha1\nkind: PolicyTest\npolicies: [nope.yaml]\ntests: [{name: a, object: {apiVersion: v1, kind: Pod, metadata: {name: p}}, expect: {allowed: true}}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Run(context.Background(), s); err == nil || !errors.Is(err, ErrInput) || !strings.Contains(err.Error(), "nope.yaml") {
		t.Errorf("missing policy file: %v", err)
	}
}

// TestObjectFileConfined: objectFile and oldObjectFile read only files
// inside the suite's directory, at most MaxSuiteBytes; anything else is an
// input error naming the path, and nothing of the outside file is read
// into a diff.
func TestObjectFileConfined(t *testing.T) {
	outside := t.TempDir()
	secret := filepath.Join(outside, "secret.yaml")
	if err := os.WriteFile(secret, []byte("apiVersion: v1\nkind: Pod\nmetadata: {name: topsecret}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "suite")
	if err := os.MkdirAll(filepath.Join(dir, "objs"), 0o700); err != nil {
		t.Fatal(err)
	}
	policies, err := os.ReadFile("testdata/pass/policies.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string][]byte{
		"policies.yaml": policies,
		"objs/pod.yaml": []byte("apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: default}\n"),
		"big.yaml":      bytes.Repeat([]byte("#"), MaxSuiteBytes+1),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), body, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(secret, filepath.Join(dir, "link.yaml")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("objs/pod.yaml", filepath.Join(dir, "inside-link.yaml")); err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(dir, secret)
	if err != nil {
		t.Fatal(err)
	}
	run := func(field, path string) error {
		t.Helper()
		obj := "objectFile: " + path
		if field == "oldObjectFile" {
			obj = "object: {apiVersion: v1, kind: Pod, metadata: {name: p}}, oldObjectFile: " + path
		}
		suite := filepath.Join(dir, "suite.yaml")
		body := "apiVersion: kadmit.io/v1alpha1\nkind: PolicyTest\npolicies: [policies.yaml]\ntests: [{name: a, operation: UPDATE, " + obj + ", expect: {allowed: true}}]\n"
		if field == "objectFile" {
			body = "apiVersion: kadmit.io/v1alpha1\nkind: PolicyTest\npolicies: [policies.yaml]\ntests: [{name: a, " + obj + ", expect: {allowed: true}}]\n"
		}
		if err := os.WriteFile(suite, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		s, err := ReadSuite(suite)
		if err != nil {
			t.Fatal(err)
		}
		_, err = Run(context.Background(), s)
		return err
	}
	for _, field := range []string{"objectFile", "oldObjectFile"} {
		for _, ok := range []string{"objs/pod.yaml", "./objs/pod.yaml", "inside-link.yaml"} {
			if err := run(field, ok); err != nil {
				t.Errorf("%s %s: %v", field, ok, err)
			}
		}
		for path, want := range map[string]string{
			secret:      "must be a path inside the suite's directory",
			rel:         "must be a path inside the suite's directory",
			"link.yaml": "must be a file inside the suite's directory",
			"big.yaml":  "larger than",
		} {
			err := run(field, path)
			if err == nil || !errors.Is(err, ErrInput) || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "topsecret") {
				t.Errorf("%s %s: err = %v, want an input error containing %q", field, path, err, want)
			}
		}
	}
}

// TestGenerateNameSuite: a pod created with generateName reaches the
// validating policies named (object.metadata.name and request.name set),
// the mutating ones unnamed, as on the API server; without the name the
// validation's object.metadata.name is an error ("no such key: name").
func TestGenerateNameSuite(t *testing.T) {
	rs, err := runDir(t, "testdata/generatename")
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if n := Print(&out, rs); n != 0 || len(rs) != 4 {
		t.Fatalf("failed %d of %d:\n%s", n, len(rs), out.String())
	}
}

// TestEvaluateWithGenerator: the generator names the object the validating
// policies see, the denial's message and the decision's object; a mutating
// policy sees no name.
func TestEvaluateWithGenerator(t *testing.T) {
	s, err := ReadSuite("testdata/generatename/suite.yaml")
	if err != nil {
		t.Fatal(err)
	}
	set, err := celpolicy.Load("testdata/generatename/policies.yaml")
	if err != nil {
		t.Fatal(err)
	}
	e, err := celpolicy.New(set, celpolicy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range map[int]string{0: "web-abcde", 2: "blocked-abcde"} {
		req, err := s.request(&s.Tests[i])
		if err != nil {
			t.Fatal(err)
		}
		d, err := EvaluateWith(context.Background(), e, req, fixedName("abcde"))
		if err != nil {
			t.Fatal(err)
		}
		var obj struct {
			Metadata struct {
				Name        string            `json:"name"`
				Annotations map[string]string `json:"annotations"`
			} `json:"metadata"`
		}
		if err := json.Unmarshal(d.Object, &obj); err != nil {
			t.Fatal(err)
		}
		if obj.Metadata.Name != want {
			t.Errorf("%s: object named %q, want %q", s.Tests[i].Name, obj.Metadata.Name, want)
		}
		if d.Allowed && obj.Metadata.Annotations["saw-name"] != "none,none" {
			t.Errorf("%s: the mutating policy saw %q, want no name", s.Tests[i].Name, obj.Metadata.Annotations["saw-name"])
		}
		if !d.Allowed && d.Status.Message != `pods "blocked-abcde" is forbidden: ValidatingAdmissionPolicy 'name-length' with binding 'name-length' denied request: name blocked-abcde is blocked` {
			t.Errorf("%s: message %q", s.Tests[i].Name, d.Status.Message)
		}
	}
}
