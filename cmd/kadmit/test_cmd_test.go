package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"encoding/xml"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kadmit/kadmit/internal/cmdexit"
)

// TestTestOutputs runs `kadmit test` on a passing and a failing suite with
// each output: text by default, -o json events only on stdout, --junit
// beside either; the exit status is 1 on failures in every format.
func TestTestOutputs(t *testing.T) {
	dir := t.TempDir()
	run := func(args ...string) (string, error) {
		cmd := newTestCmd()
		// As under the root command (main.go).
		cmd.SilenceUsage, cmd.SilenceErrors = true, true
		var out, stderr bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&stderr)
		cmd.SetArgs(args)
		err := cmd.Execute()
		return out.String(), err
	}
	status := func(err error) int {
		var e *cmdexit.Error
		if err == nil {
			return 0
		}
		if errors.As(err, &e) {
			return e.Code
		}
		return -1
	}
	pass := filepath.Join("..", "..", "internal", "policysuite", "testdata", "pass")
	fail := filepath.Join("..", "..", "internal", "policysuite", "testdata", "fail")

	out, err := run(pass)
	if status(err) != 0 || !strings.Contains(out, "3 tests, 3 passed, 0 failed") {
		t.Fatalf("text: %v\n%s", err, out)
	}
	junit := filepath.Join(dir, "report.xml")
	out, err = run("-o", "json", "--junit", junit, fail)
	if status(err) != 1 {
		t.Fatalf("json: exit %d (%v)\n%s", status(err), err, out)
	}
	var actions []string
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var e struct{ Action, Package, Test string }
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("stdout line is not a JSON event: %q: %v", sc.Text(), err)
		}
		if e.Action != "output" {
			actions = append(actions, e.Action)
		}
	}
	if strings.Join(actions, " ") != "start run fail run fail run fail fail" {
		t.Errorf("actions %v", actions)
	}
	data, err := os.ReadFile(junit)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Tests    int `xml:"tests,attr"`
		Failures int `xml:"failures,attr"`
	}
	if err := xml.Unmarshal(data, &doc); err != nil || doc.Tests != 3 || doc.Failures != 3 {
		t.Errorf("junit %+v %v:\n%s", doc, err, data)
	}
	if _, err := run("-o", "yaml", pass); status(err) != 2 || !strings.Contains(err.Error(), "must be text or json") {
		t.Errorf("-o yaml: %v", err)
	}
	out, err = run("--junit", filepath.Join(dir, "missing", "r.xml"), pass)
	if status(err) != 2 || !strings.Contains(out, "3 tests, 3 passed") {
		t.Errorf("unwritable report: exit %d %v\n%s", status(err), err, out)
	}
}
