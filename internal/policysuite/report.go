package policysuite

import (
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Event is one line of `kadmit test -o json`: the event shape of `go test
// -json` (cmd/test2json, Go 1.26: TestEvent), so tools that read that
// stream (gotestsum --raw-command, go-junit-report -parser gojson, CI
// annotators) read kadmit's. Package is the suite's name (metadata.name,
// else its file); Test the test's name, unset on the suite's own events.
//
// Per suite, in order:
//
//	{"Action":"start","Package":S}
//	per test: {"Action":"run","Test":T}
//	          {"Action":"output","Test":T,"Output":"=== RUN   T\n"}
//	          one output event per failure line, indented by four spaces
//	          {"Action":"output","Test":T,"Output":"--- FAIL: T (0.00s)\n"} (or PASS)
//	          {"Action":"fail"|"pass","Test":T,"Elapsed":seconds}
//	{"Action":"output","Package":S,"Output":"FAIL\tS\t0.001s\n"} (or "ok  \tS\t...")
//	{"Action":"fail"|"pass","Package":S,"Elapsed":seconds}
//
// Fields are only ever added to this shape, never renamed or removed.
type Event struct {
	Time    time.Time `json:",omitzero"`
	Action  string
	Package string   `json:",omitempty"`
	Test    string   `json:",omitempty"`
	Elapsed *float64 `json:",omitempty"`
	Output  string   `json:",omitempty"`
}

// suiteGroup is one suite's results: consecutive results of one file.
type suiteGroup struct {
	name, file string
	results    []Result
	failed     int
	start      time.Time
	elapsed    time.Duration
}

func groupSuites(results []Result) []suiteGroup {
	var out []suiteGroup
	for _, r := range results {
		if n := len(out); n == 0 || out[n-1].name != r.Suite || out[n-1].file != r.File {
			out = append(out, suiteGroup{name: r.Suite, file: r.File, start: r.Start})
		}
		g := &out[len(out)-1]
		g.results = append(g.results, r)
		// From the first test's start to the last one's end.
		if end := r.Start.Add(r.Elapsed).Sub(g.start); end > g.elapsed {
			g.elapsed = end
		}
		if !r.Passed() {
			g.failed++
		}
	}
	return out
}

func seconds(d time.Duration) *float64 {
	s := d.Seconds()
	return &s
}

// WriteJSON writes results as Events, one JSON object per line (see
// Event). It returns the first write error.
func WriteJSON(w io.Writer, results []Result) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	for _, g := range groupSuites(results) {
		events := []Event{{Time: g.start, Action: "start", Package: g.name}}
		for _, r := range g.results {
			end := r.Start.Add(r.Elapsed)
			ev := func(e Event) {
				e.Package, e.Test = g.name, r.Test
				events = append(events, e)
			}
			ev(Event{Time: r.Start, Action: "run"})
			ev(Event{Time: r.Start, Action: "output", Output: "=== RUN   " + r.Test + "\n"})
			action, word := "pass", "PASS"
			if !r.Passed() {
				action, word = "fail", "FAIL"
			}
			for _, f := range r.Problems() {
				ev(Event{Time: end, Action: "output", Output: indent(f)})
			}
			if r.Server != nil {
				for _, n := range r.Server.Notes {
					ev(Event{Time: end, Action: "output", Output: indent("server: " + n)})
				}
			}
			ev(Event{Time: end, Action: "output", Output: fmt.Sprintf("--- %s: %s (%.2fs)\n", word, r.Test, r.Elapsed.Seconds())})
			ev(Event{Time: end, Action: action, Elapsed: seconds(r.Elapsed)})
		}
		end := g.start.Add(g.elapsed)
		action, line := "pass", fmt.Sprintf("ok  \t%s\t%.3fs\n", g.name, g.elapsed.Seconds())
		if g.failed > 0 {
			action, line = "fail", fmt.Sprintf("FAIL\t%s\t%.3fs\n", g.name, g.elapsed.Seconds())
		}
		events = append(events,
			Event{Time: end, Action: "output", Package: g.name, Output: line},
			Event{Time: end, Action: action, Package: g.name, Elapsed: seconds(g.elapsed)})
		for i := range events {
			if err := enc.Encode(&events[i]); err != nil {
				return fmt.Errorf("write JSON events: %w", err)
			}
		}
	}
	return nil
}

// indent gives each line of a failure four spaces, as `go test` indents
// a test's log, ending with a newline.
func indent(s string) string {
	return "    " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n    ") + "\n"
}

// JUnit report: the Apache Ant JUnit schema every CI reader accepts
// (Jenkins junit plugin, GitLab artifacts:reports:junit — which shows
// testcase classname as the suite and name as the test —, GitHub actions
// such as dorny/test-reporter and mikepenz/action-junit-report).
type junitSuites struct {
	XMLName  xml.Name     `xml:"testsuites"`
	Name     string       `xml:"name,attr"`
	Tests    int          `xml:"tests,attr"`
	Failures int          `xml:"failures,attr"`
	Errors   int          `xml:"errors,attr"`
	Time     string       `xml:"time,attr"`
	Suites   []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Name      string      `xml:"name,attr"`
	ID        int         `xml:"id,attr"`
	Tests     int         `xml:"tests,attr"`
	Failures  int         `xml:"failures,attr"`
	Errors    int         `xml:"errors,attr"`
	Skipped   int         `xml:"skipped,attr"`
	Time      string      `xml:"time,attr"`
	Timestamp string      `xml:"timestamp,attr,omitempty"`
	File      string      `xml:"file,attr,omitempty"`
	Cases     []junitCase `xml:"testcase"`
}

type junitCase struct {
	Name      string        `xml:"name,attr"`
	Classname string        `xml:"classname,attr"`
	File      string        `xml:"file,attr,omitempty"`
	Time      string        `xml:"time,attr"`
	Failure   *junitFailure `xml:"failure"`
}

type junitFailure struct {
	Message string `xml:"message,attr"`
	Type    string `xml:"type,attr"`
	Text    string `xml:",chardata"`
}

func junitTime(d time.Duration) string { return fmt.Sprintf("%.3f", d.Seconds()) }

// WriteJUnit writes results as one JUnit XML document: <testsuites>, a
// <testsuite> per suite (name, tests, failures, time, timestamp, file),
// a <testcase> per test (name, classname = the suite's name, file,
// time) and, for a failed test, <failure message="first difference"
// type="PolicyTestFailure"> holding every difference, one per line.
// encoding/xml escapes names and messages, and writes characters XML 1.0
// cannot carry even escaped (control characters) as U+FFFD, so the
// document is well-formed whatever a suite names its tests.
func WriteJUnit(w io.Writer, results []Result) error {
	doc := junitSuites{Name: "kadmit test"}
	var total time.Duration
	for i, g := range groupSuites(results) {
		s := junitSuite{Name: g.name, ID: i, Tests: len(g.results), Failures: g.failed,
			Time: junitTime(g.elapsed), File: g.file}
		if !g.start.IsZero() {
			// The schema's timestamp is ISO 8601 without a zone.
			s.Timestamp = g.start.UTC().Format("2006-01-02T15:04:05")
		}
		for _, r := range g.results {
			c := junitCase{Name: r.Test, Classname: g.name, File: r.File, Time: junitTime(r.Elapsed)}
			if p := r.Problems(); len(p) > 0 {
				c.Failure = &junitFailure{Message: p[0], Type: "PolicyTestFailure",
					Text: strings.Join(p, "\n")}
			}
			s.Cases = append(s.Cases, c)
		}
		doc.Tests += s.Tests
		doc.Failures += s.Failures
		total += g.elapsed
		doc.Suites = append(doc.Suites, s)
	}
	doc.Time = junitTime(total)
	if _, err := io.WriteString(w, xml.Header); err != nil {
		return fmt.Errorf("write JUnit report: %w", err)
	}
	enc := xml.NewEncoder(w)
	enc.Indent("", "  ")
	if err := enc.Encode(doc); err != nil {
		return fmt.Errorf("write JUnit report: %w", err)
	}
	if _, err := io.WriteString(w, "\n"); err != nil {
		return fmt.Errorf("write JUnit report: %w", err)
	}
	return nil
}

// WriteJUnitFile writes the JUnit report to path. The file is written
// whole or not at all: the report goes to a temporary file in path's
// directory, then is renamed over path. path's directory must exist; an
// existing path must be a regular file (a symlink, directory, device or
// FIFO there is an error, not followed or overwritten, so
// `--junit /dev/sda` or a symlink planted in a shared workspace cannot
// redirect the write).
func WriteJUnitFile(path string, results []Result) (err error) {
	dir := filepath.Dir(path)
	if st, err := os.Stat(dir); err != nil {
		return fmt.Errorf("JUnit report %s: directory: %w", path, err)
	} else if !st.IsDir() {
		return fmt.Errorf("JUnit report %s: %s is not a directory", path, dir)
	}
	switch st, err := os.Lstat(path); {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return fmt.Errorf("JUnit report: %w", err)
	case !st.Mode().IsRegular():
		return fmt.Errorf("JUnit report %s: exists and is not a regular file (%s); refusing to replace it", path, st.Mode().Type())
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("JUnit report %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if err := WriteJUnit(f, results); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	// CreateTemp makes the file 0600; a report is for CI to read.
	if err := f.Chmod(0o644); err != nil {
		return fmt.Errorf("JUnit report %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("JUnit report %s: %w", path, err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("JUnit report %s: %w", path, err)
	}
	return nil
}
