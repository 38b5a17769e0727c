package policysuite

import (
	"bufio"
	"bytes"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// passAndFail runs the passing suite, then the failing one.
func passAndFail(t *testing.T) []Result {
	t.Helper()
	var all []Result
	for _, dir := range []string{"testdata/pass", "testdata/fail"} {
		rs, err := runDir(t, dir)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, rs...)
	}
	return all
}

func TestWriteJSONEvents(t *testing.T) {
	rs := passAndFail(t)
	var buf bytes.Buffer
	if err := WriteJSON(&buf, rs); err != nil {
		t.Fatal(err)
	}
	var events []Event
	sc := bufio.NewScanner(&buf)
	for sc.Scan() {
		dec := json.NewDecoder(strings.NewReader(sc.Text()))
		dec.DisallowUnknownFields()
		var e Event
		if err := dec.Decode(&e); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		if e.Time.IsZero() {
			t.Errorf("event without Time: %+v", e)
		}
		events = append(events, e)
	}
	// Replay the stream as a reader of go test -json does: every test's
	// events between its run and its pass/fail, suites between start and
	// their own pass/fail.
	var (
		suite        string
		test         string
		outputs      = map[string]string{}
		testActions  = map[string]string{}
		suiteActions = map[string]string{}
		order        []string
	)
	for i, e := range events {
		switch {
		case e.Action == "start":
			if suite != "" || e.Test != "" {
				t.Fatalf("event %d: start inside suite %q: %+v", i, suite, e)
			}
			suite = e.Package
			order = append(order, "start "+suite)
		case e.Package != suite:
			t.Fatalf("event %d: package %q inside suite %q", i, e.Package, suite)
		case e.Test == "" && (e.Action == "pass" || e.Action == "fail"):
			if test != "" || e.Elapsed == nil {
				t.Fatalf("event %d: suite end while %q runs or without Elapsed: %+v", i, test, e)
			}
			suiteActions[suite] = e.Action
			suite = ""
		case e.Test == "" && e.Action == "output":
			outputs[suite] += e.Output
		case e.Action == "run":
			if test != "" {
				t.Fatalf("event %d: run %q while %q runs", i, e.Test, test)
			}
			test = e.Test
			order = append(order, "run "+test)
		case e.Test != test:
			t.Fatalf("event %d: test %q while %q runs", i, e.Test, test)
		case e.Action == "output":
			outputs[suite+"/"+test] += e.Output
		case e.Action == "pass" || e.Action == "fail":
			if e.Elapsed == nil {
				t.Fatalf("event %d: %s without Elapsed", i, e.Action)
			}
			testActions[suite+"/"+test] = e.Action
			test = ""
		default:
			t.Fatalf("event %d: unexpected %+v", i, e)
		}
	}
	if suite != "" || test != "" {
		t.Fatalf("stream ended inside suite %q test %q", suite, test)
	}
	if len(testActions) != len(rs) {
		t.Fatalf("%d tests ended, want %d", len(testActions), len(rs))
	}
	for _, r := range rs {
		key := r.Suite + "/" + r.Test
		want := "pass"
		if len(r.Failures) > 0 {
			want = "fail"
		}
		if testActions[key] != want {
			t.Errorf("%s: action %q, want %q", key, testActions[key], want)
		}
		out := outputs[key]
		if !strings.HasPrefix(out, "=== RUN   "+r.Test+"\n") || !strings.Contains(out, "--- "+strings.ToUpper(want)+": "+r.Test+" (") {
			t.Errorf("%s: output %q", key, out)
		}
		for _, f := range r.Failures {
			if !strings.Contains(out, "    "+f+"\n") {
				t.Errorf("%s: output lacks failure %q:\n%s", key, f, out)
			}
		}
	}
	if suiteActions["basic"] != "pass" || suiteActions["wrong-expectations"] != "fail" {
		t.Errorf("suite actions %v", suiteActions)
	}
	if !strings.HasPrefix(outputs["wrong-expectations"], "FAIL\twrong-expectations\t") || !strings.HasPrefix(outputs["basic"], "ok  \tbasic\t") {
		t.Errorf("suite outputs %q", outputs)
	}
	if order[0] != "start basic" || order[4] != "start wrong-expectations" {
		t.Errorf("order %v", order)
	}
}

func TestWriteJUnit(t *testing.T) {
	rs := passAndFail(t)
	// A name XML cannot carry as is: escaped, and control characters
	// replaced, so the document stays well-formed.
	rs = append(rs, Result{Suite: "odd <&> \x01", Test: "t \"q\" \x1b[31m", Failures: []string{"a\nb ]]> c"},
		Start: time.Now(), Elapsed: time.Millisecond})
	var buf bytes.Buffer
	if err := WriteJUnit(&buf, rs); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(buf.String(), `<?xml version="1.0" encoding="UTF-8"?>`) {
		t.Errorf("no XML header:\n%s", buf.String())
	}
	// Well-formed: a strict token read to the end.
	dec := xml.NewDecoder(bytes.NewReader(buf.Bytes()))
	for {
		if _, err := dec.Token(); err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatalf("not well-formed: %v\n%s", err, buf.String())
			}
			break
		}
	}
	var doc junitSuites
	if err := xml.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Tests != 7 || doc.Failures != 4 || doc.Errors != 0 || len(doc.Suites) != 3 {
		t.Fatalf("testsuites: tests %d failures %d errors %d suites %d", doc.Tests, doc.Failures, doc.Errors, len(doc.Suites))
	}
	pass, fail, odd := doc.Suites[0], doc.Suites[1], doc.Suites[2]
	if pass.Name != "basic" || pass.Tests != 3 || pass.Failures != 0 || len(pass.Cases) != 3 || pass.Timestamp == "" ||
		filepath.Base(pass.File) != "suite.yaml" {
		t.Errorf("passing suite %+v", pass)
	}
	for _, c := range pass.Cases {
		if c.Failure != nil || c.Classname != "basic" || c.Time == "" {
			t.Errorf("passing case %+v", c)
		}
	}
	if fail.Name != "wrong-expectations" || fail.Tests != 3 || fail.Failures != 3 || fail.ID != 1 {
		t.Errorf("failing suite %+v", fail)
	}
	for i, c := range fail.Cases {
		r := rs[3+i]
		if c.Name != r.Test || c.Failure == nil || c.Failure.Message != r.Failures[0] || c.Failure.Text != strings.Join(r.Failures, "\n") {
			t.Errorf("failing case %d: %+v, want the differences of %+v", i, c, r)
		}
	}
	if odd.Name != "odd <&> \uFFFD" || odd.Cases[0].Name != "t \"q\" \uFFFD[31m" || odd.Cases[0].Failure.Text != "a\nb ]]> c" {
		t.Errorf("odd suite %+v %+v", odd, odd.Cases[0].Failure)
	}
}

func TestWriteJUnitFile(t *testing.T) {
	rs := passAndFail(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "report.xml")
	if err := os.WriteFile(path, bytes.Repeat([]byte("stale "), 10000), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := WriteJUnitFile(path, rs); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc junitSuites
	if err := xml.Unmarshal(data, &doc); err != nil || doc.Tests != 6 || bytes.Contains(data, []byte("stale")) {
		t.Fatalf("report not replaced whole (%v, %d tests):\n%s", err, doc.Tests, data)
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o644 {
		t.Errorf("mode %v, want 0644", st.Mode())
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("temporary files left: %v", entries)
	}

	if err := WriteJUnitFile(filepath.Join(dir, "missing", "r.xml"), rs); err == nil || !strings.Contains(err.Error(), "directory") {
		t.Errorf("missing directory: %v", err)
	}
	// A symlink is not followed: its target stays as it was.
	target := filepath.Join(dir, "target")
	if err := os.WriteFile(target, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.xml")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if err := WriteJUnitFile(link, rs); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("symlink: %v", err)
	}
	if b, _ := os.ReadFile(target); string(b) != "keep" {
		t.Errorf("symlink target written: %q", b)
	}
	if err := WriteJUnitFile(dir, rs); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("directory: %v", err)
	}
	if err := WriteJUnitFile(os.DevNull, rs); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("device: %v", err)
	}
}

// TestReportsCountServerDiffs: with --server, a test that met its
// expectations but differs from the API server fails in both reports, with
// the difference as its failure text; the server's notes are output.
func TestReportsCountServerDiffs(t *testing.T) {
	now := time.Now()
	rs := []Result{
		{Suite: "s", Test: "agrees", File: "s.yaml", Start: now, Server: &ServerCheck{Notes: []string{"audit annotations not compared"}}},
		{Suite: "s", Test: "differs", File: "s.yaml", Start: now, Server: &ServerCheck{Diff: []string{`offline allowed=false 422 "x", server allowed=true`}}},
	}
	var js bytes.Buffer
	if err := WriteJSON(&js, rs); err != nil {
		t.Fatal(err)
	}
	actions := map[string]string{}
	var outputs []string
	dec := json.NewDecoder(&js)
	for dec.More() {
		var e Event
		if err := dec.Decode(&e); err != nil {
			t.Fatal(err)
		}
		if e.Action == "pass" || e.Action == "fail" {
			actions[e.Test] = e.Action
		}
		if e.Action == "output" {
			outputs = append(outputs, e.Output)
		}
	}
	if actions["agrees"] != "pass" || actions["differs"] != "fail" || actions[""] != "fail" {
		t.Fatalf("actions %v", actions)
	}
	all := strings.Join(outputs, "")
	if !strings.Contains(all, "    differs from the API server: offline allowed=false") || !strings.Contains(all, "    server: audit annotations not compared") {
		t.Fatalf("outputs:\n%s", all)
	}
	var x bytes.Buffer
	if err := WriteJUnit(&x, rs); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Failures int `xml:"failures,attr"`
	}
	if err := xml.Unmarshal(x.Bytes(), &doc); err != nil || doc.Failures != 1 || !strings.Contains(x.String(), "differs from the API server: offline allowed=false") {
		t.Fatalf("JUnit (%v):\n%s", err, x.String())
	}
}
