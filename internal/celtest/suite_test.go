package celtest

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
