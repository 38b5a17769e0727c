// Package policysuite runs test suites for declared admission policies
// (`kadmit test DIR`): each suite names policy files (policies, bindings,
// params), and its tests give an object, an operation and what the API
// server must decide — allowed or denied, code, message, warnings, audit
// annotations and the mutated object's fields — evaluated with package
// celpolicy exactly as the API server's in-tree plugins do: every
// MutatingAdmissionPolicy first, then every ValidatingAdmissionPolicy on
// the mutated object. The format is documented in docs/policies-cel.md.
package policysuite

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/storage/names"
	"sigs.k8s.io/yaml"

	kadmission "github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/celpolicy"
	"github.com/kadmit/kadmit/internal/jsonedit"
	"github.com/kadmit/kadmit/internal/manifests"
	"github.com/kadmit/kadmit/internal/served"
)

// Kind and APIVersion identify a suite file.
const (
	APIVersion = "kadmit.io/v1alpha1"
	Kind       = "PolicyTest"
)

// Bounds on suites: clear errors, bounded cost.
const (
	MaxSuiteBytes = 4 << 20
	MaxTests      = 10000
	MaxSuites     = 1000
)

// ErrInput is wrapped by errors about the suite files themselves.
var ErrInput = errors.New("invalid test suite")

// Suite is one suite file.
type Suite struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
	// Policies are files or directories (relative to the suite file) of
	// policies, bindings and params, loaded as `kadmit review --policies`.
	Policies []string `json:"policies"`
	// Namespaces are namespace objects the tests' requests may be in (for
	// namespaceSelector and namespaceObject); a namespace not listed has
	// only the label kubernetes.io/metadata.name.
	Namespaces []corev1.Namespace `json:"namespaces,omitempty"`
	Tests      []Test             `json:"tests"`

	// Defaults, when true, gives the policies each test's object and old
	// object as the API server would: with the API's defaults and the
	// default-on mutating admission plugins applied, and each mutating
	// policy's result defaulted (package apidefaults; `kadmit test
	// --defaults` sets it for every suite).
	Defaults bool `json:"defaults,omitempty"`

	file string
}

// Test is one request and its expected outcome.
type Test struct {
	Name string `json:"name"`
	// Operation: CREATE (default), UPDATE, DELETE or CONNECT.
	Operation string `json:"operation,omitempty"`
	// Object and OldObject are the request's objects (OldObject for UPDATE
	// and DELETE); ObjectFile / OldObjectFile read them from a file
	// relative to the suite instead, which must lie inside the suite's
	// directory (no absolute path, no "..", no symlink leading out) and
	// hold at most MaxSuiteBytes.
	Object        json.RawMessage `json:"object,omitempty"`
	ObjectFile    string          `json:"objectFile,omitempty"`
	OldObject     json.RawMessage `json:"oldObject,omitempty"`
	OldObjectFile string          `json:"oldObjectFile,omitempty"`
	// Resource overrides the resource guessed from the kind ("pods"),
	// e.g. for irregular plurals; SubResource, e.g. "status".
	Resource    string `json:"resource,omitempty"`
	SubResource string `json:"subResource,omitempty"`
	// UserInfo is the requesting user (default: username "kadmit-test").
	UserInfo *authenticationv1.UserInfo `json:"userInfo,omitempty"`
	// DryRun marks the request as a dry run (request.dryRun in CEL), as
	// `kubectl --dry-run=server` sends it; the options' dryRun is then
	// ["All"], as the API server's are.
	DryRun bool `json:"dryRun,omitempty"`
	// Options are the operation's options (request.options in CEL): the
	// fields of a CreateOptions for CREATE, UpdateOptions for UPDATE,
	// DeleteOptions for DELETE (e.g. {fieldManager: kubectl-edit}); none
	// for CONNECT. See admission.RequestOptions (internal/admission).
	Options json.RawMessage `json:"options,omitempty"`
	Expect  Expect          `json:"expect"`
}

// Expect is what a test requires; fields left out are not checked.
type Expect struct {
	// Allowed is required.
	Allowed *bool `json:"allowed"`
	// Code is the HTTP status of the denial (403, 422, ...).
	Code *int32 `json:"code,omitempty"`
	// Message is the whole error the API server returns, exactly;
	// MessageContains a part of it.
	Message         *string `json:"message,omitempty"`
	MessageContains string  `json:"messageContains,omitempty"`
	// Warnings is the exact list (an empty list: none).
	Warnings *[]string `json:"warnings,omitempty"`
	// AuditAnnotations each key must have exactly this value.
	AuditAnnotations map[string]string `json:"auditAnnotations,omitempty"`
	// Patched maps a JSON pointer into the object after mutation to its
	// expected JSON value; null requires that nothing is there.
	Patched map[string]json.RawMessage `json:"patched,omitempty"`
	// Object is the whole object expected after mutation.
	Object json.RawMessage `json:"object,omitempty"`
}

// Result is one test's outcome.
type Result struct {
	Suite, Test string
	// Failures say what differed; empty when the test passed.
	Failures []string
	// File is the suite file; Start and Elapsed time the test (building
	// its request and evaluating it), for the JSON and JUnit reports.
	File    string
	Start   time.Time
	Elapsed time.Duration
	// Server is the comparison of the offline outcome with a real API
	// server's (`kadmit test --server`, RunServer); nil when not run.
	Server *ServerCheck
}

// ServerCheck is how one test's offline outcome compares with the API
// server's answer to the same request sent as a server-side dry run.
type ServerCheck struct {
	// Diff says what differs between the two, one line each ("offline
	// allowed=false 422 \"...\", server allowed=true"), and what could not
	// be sent; empty when they agree.
	Diff []string
	// Notes say what was not compared and why (audit annotations, which a
	// client cannot read; CONNECT requests).
	Notes []string
}

// Passed reports whether the test met its expectations and, when it was
// also sent to an API server, the server agreed.
func (r Result) Passed() bool {
	return len(r.Failures) == 0 && (r.Server == nil || len(r.Server.Diff) == 0)
}

// Problems are the test's failures followed by its differences from the
// API server ("differs from the API server: ..."), the lines the JSON and
// JUnit reports give a test that did not pass; empty when it passed.
func (r Result) Problems() []string {
	out := slices.Clone(r.Failures)
	if r.Server != nil {
		for _, d := range r.Server.Diff {
			out = append(out, "differs from the API server: "+d)
		}
	}
	return out
}

// Find returns the suite files under path (a file, or a directory
// searched recursively for *.yaml, *.yml and *.json files whose kind is
// PolicyTest), in lexical order.
func Find(path string) ([]string, error) {
	n := 0
	files, err := manifests.Files(path, func(p string) (bool, error) {
		ok, err := isSuite(p)
		if err != nil || !ok {
			return false, err
		}
		if n++; n > MaxSuites {
			return false, fmt.Errorf("more than %d test suites under %s", MaxSuites, path)
		}
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInput, err)
	}
	return files, nil
}

func isSuite(path string) (bool, error) {
	data, err := readBounded(path)
	if err != nil {
		return false, err
	}
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	// A file that is not one YAML document with these two fields (a
	// multi-document policy file, say) is not a suite.
	if err := yaml.Unmarshal(data, &head); err != nil {
		return false, nil
	}
	return head.APIVersion == APIVersion && head.Kind == Kind, nil
}

func readBounded(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readLimited(f, path)
}

// readLimited reads f (named name in errors) whole, at most MaxSuiteBytes.
// A read error of an *os.File names its path already.
func readLimited(f io.Reader, name string) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(f, MaxSuiteBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxSuiteBytes {
		return nil, fmt.Errorf("%s: larger than %d bytes", name, MaxSuiteBytes)
	}
	return data, nil
}

// ReadSuite parses one suite file, refusing unknown fields.
func ReadSuite(path string) (*Suite, error) {
	data, err := readBounded(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInput, err)
	}
	var s Suite
	if err := yaml.UnmarshalStrict(data, &s); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrInput, path, err)
	}
	s.file = path
	switch {
	case s.APIVersion != APIVersion || s.Kind != Kind:
		return nil, fmt.Errorf("%w: %s: apiVersion/kind must be %s/%s", ErrInput, path, APIVersion, Kind)
	case len(s.Policies) == 0:
		return nil, fmt.Errorf("%w: %s: policies: at least one file or directory is required", ErrInput, path)
	case len(s.Tests) == 0:
		return nil, fmt.Errorf("%w: %s: tests: at least one test is required", ErrInput, path)
	case len(s.Tests) > MaxTests:
		return nil, fmt.Errorf("%w: %s: more than %d tests", ErrInput, path, MaxTests)
	}
	if s.Metadata.Name == "" {
		s.Metadata.Name = path
	}
	for i, t := range s.Tests {
		where := fmt.Sprintf("%s: tests[%d] (%s)", path, i, t.Name)
		if t.Name == "" {
			return nil, fmt.Errorf("%w: %s: name is required", ErrInput, where)
		}
		if t.Expect.Allowed == nil {
			return nil, fmt.Errorf("%w: %s: expect.allowed is required", ErrInput, where)
		}
		if (len(t.Object) > 0) == (t.ObjectFile != "") && t.Operation != "DELETE" {
			return nil, fmt.Errorf("%w: %s: exactly one of object and objectFile is required", ErrInput, where)
		}
		for p := range t.Expect.Patched {
			if _, err := jsonedit.ParsePointer(p); err != nil || p == "" {
				return nil, fmt.Errorf("%w: %s: expect.patched: %q is not a JSON pointer", ErrInput, where, p)
			}
		}
	}
	return &s, nil
}

func (s *Suite) rel(p string) string {
	if filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(filepath.Dir(s.file), p)
}

// Run runs one suite. It returns an error wrapping ErrInput when the
// suite's policies or objects cannot be loaded; mismatches are Results.
func Run(ctx context.Context, s *Suite) ([]Result, error) {
	return RunWith(ctx, s, celpolicy.LoadOptions{})
}

// RunWith is Run loading the suite's policies with load (`kadmit test
// --policies-allow-sensitive-groups`).
func RunWith(ctx context.Context, s *Suite, load celpolicy.LoadOptions) ([]Result, error) {
	e, err := s.engine(load)
	if err != nil {
		return nil, err
	}
	out, _, err := s.runOffline(ctx, e, false)
	return out, err
}

// engine loads and compiles the suite's policies with load through
// served.Assemble, the door `kadmit serve` and `kadmit review --policies`
// load declared policies through, with no built-in policy. Errors wrap
// ErrInput and name the suite file.
func (s *Suite) engine(load celpolicy.LoadOptions) (*celpolicy.Engine, error) {
	policies, err := served.Assemble(served.Sources{Declared: &served.Declared{Paths: s.policyPaths(), Load: load, Options: engineOptions(s)}})
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrInput, s.file, err)
	}
	return policies.Engine, nil
}

// offline is one test's offline run: the request kadmit built and the
// decision of the suite's policies.
type offline struct {
	test *Test
	req  *celpolicy.Request
	d    *celpolicy.Decision
	// dryReq and dry are the same request as a dry run and its decision,
	// when runOffline was asked for them and the test is not a dry run
	// already: `kadmit test --server` sends every test as one.
	dryReq *celpolicy.Request
	dry    *celpolicy.Decision
}

// runOffline evaluates every test of s with the suite's policies compiled
// in e (Suite.engine); with asDryRun, also each test that is not a dry run
// as one (offline.dry).
func (s *Suite) runOffline(ctx context.Context, e *celpolicy.Engine, asDryRun bool) ([]Result, []offline, error) {
	var out []Result
	var runs []offline
	for i := range s.Tests {
		t := &s.Tests[i]
		start := time.Now()
		req, err := s.request(t)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: %s: tests[%d] (%s): %w", ErrInput, s.file, i, t.Name, err)
		}
		if s.Defaults {
			if err := applyDefaults(req); err != nil {
				return nil, nil, fmt.Errorf("%w: %s: tests[%d] (%s): defaults: %w", ErrInput, s.file, i, t.Name, err)
			}
		}
		d, err := Evaluate(ctx, e, req)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: tests[%d] (%s): %w", s.file, i, t.Name, err)
		}
		out = append(out, Result{Suite: s.Metadata.Name, Test: t.Name, Failures: compare(t, req, d),
			File: s.file, Start: start, Elapsed: time.Since(start)})
		run := offline{test: t, req: req, d: d}
		if asDryRun && !req.DryRun && req.Options != nil {
			dreq := *req
			options, _, err := kadmission.RequestOptions(admissionv1.Operation(req.Operation), t.Options, true)
			if err != nil {
				return nil, nil, fmt.Errorf("%w: %s: tests[%d] (%s): %w", ErrInput, s.file, i, t.Name, err)
			}
			dreq.DryRun, dreq.Options = true, options
			if run.dry, err = Evaluate(ctx, e, &dreq); err != nil {
				return nil, nil, fmt.Errorf("%s: tests[%d] (%s): as a dry run: %w", s.file, i, t.Name, err)
			}
			run.dryReq = &dreq
		}
		runs = append(runs, run)
	}
	return out, runs, nil
}

// policyPaths are the suite's policies entries resolved against its file.
func (s *Suite) policyPaths() []string {
	paths := make([]string, len(s.Policies))
	for i, p := range s.Policies {
		paths[i] = s.rel(p)
	}
	return paths
}

// Evaluate runs req through the engine's mutating policies, then its
// validating policies on the result, and returns the combined decision:
// the API server's order (mutating admission, then validating admission
// on the final object). Between them, a CREATE's generateName object is
// named as the API server's registry names it (admission.GenerateName,
// random): the validating policies see that name in object.metadata.name
// and request.name, and the decision's Object carries it.
func Evaluate(ctx context.Context, e *celpolicy.Engine, req *celpolicy.Request) (*celpolicy.Decision, error) {
	return EvaluateWith(ctx, e, req, nil)
}

// EvaluateWith is Evaluate with gen naming generateName objects (nil: the
// API server's random names.SimpleNameGenerator), so a test can know the
// name. An object whose metadata is malformed is an error.
func EvaluateWith(ctx context.Context, e *celpolicy.Engine, req *celpolicy.Request, gen names.NameGenerator) (*celpolicy.Decision, error) {
	m, err := e.Mutate(ctx, req)
	if err != nil {
		return nil, err
	}
	if !m.Allowed {
		return m, nil
	}
	vreq := *req
	vreq.Object = m.Object
	if vreq.Operation == admission.Create && vreq.SubResource == "" && vreq.Object != nil {
		obj, name, err := kadmission.GenerateName(vreq.Object, gen)
		if err != nil {
			return nil, fmt.Errorf("object: %w", err)
		}
		vreq.Object = obj
		if vreq.Name == "" {
			vreq.Name = name
		}
	}
	v, err := e.Validate(ctx, &vreq)
	if err != nil {
		return nil, err
	}
	v.Warnings = append(m.Warnings, v.Warnings...)
	for k, val := range m.AuditAnnotations {
		if v.AuditAnnotations == nil {
			v.AuditAnnotations = map[string]string{}
		}
		v.AuditAnnotations[k] = val
	}
	v.Object, v.Changed = vreq.Object, m.Changed
	return v, nil
}

func (s *Suite) request(t *Test) (*celpolicy.Request, error) {
	obj, err := s.objectJSON(t.Object, t.ObjectFile)
	if err != nil {
		return nil, fmt.Errorf("object: %w", err)
	}
	old, err := s.objectJSON(t.OldObject, t.OldObjectFile)
	if err != nil {
		return nil, fmt.Errorf("oldObject: %w", err)
	}
	op := admission.Operation(strings.ToUpper(t.Operation))
	if op == "" {
		op = admission.Create
	}
	switch op {
	case admission.Create, admission.Connect:
	case admission.Update:
		if old == nil {
			return nil, errors.New("UPDATE needs oldObject or oldObjectFile")
		}
	case admission.Delete:
		if old == nil {
			old, obj = obj, nil
		}
		if old == nil {
			return nil, errors.New("DELETE needs oldObject or oldObjectFile")
		}
	default:
		return nil, fmt.Errorf("operation %q: must be CREATE, UPDATE, DELETE or CONNECT", t.Operation)
	}
	ref := obj
	if ref == nil {
		ref = old
	}
	var u unstructured.Unstructured
	if err := u.UnmarshalJSON(ref); err != nil {
		return nil, err
	}
	gvk := u.GroupVersionKind()
	if gvk.Kind == "" || gvk.Version == "" {
		return nil, errors.New("apiVersion and kind are required")
	}
	gvr, _ := meta.UnsafeGuessKindToResource(gvk)
	if t.Resource != "" {
		gvr = schema.GroupVersionResource{Group: gvk.Group, Version: gvk.Version, Resource: t.Resource}
	}
	ui := authenticationv1.UserInfo{Username: "kadmit-test"}
	if t.UserInfo != nil {
		ui = *t.UserInfo
	}
	options, dryRun, err := kadmission.RequestOptions(admissionv1.Operation(op), t.Options, t.DryRun)
	if err != nil {
		return nil, err
	}
	req := &celpolicy.Request{
		Kind: gvk, Resource: gvr, SubResource: t.SubResource, Name: u.GetName(), Namespace: u.GetNamespace(),
		Operation: op, Object: obj, OldObject: old, UserInfo: ui, Options: options, DryRun: dryRun,
	}
	for i := range s.Namespaces {
		if s.Namespaces[i].Name == req.Namespace {
			ns := s.Namespaces[i].DeepCopy()
			if ns.Labels == nil {
				ns.Labels = map[string]string{}
			}
			if _, ok := ns.Labels[corev1.LabelMetadataName]; !ok {
				ns.Labels[corev1.LabelMetadataName] = ns.Name
			}
			req.NamespaceObject = ns
		}
	}
	return req, nil
}

func (s *Suite) objectJSON(inline json.RawMessage, file string) ([]byte, error) {
	if file != "" {
		data, err := s.readObjectFile(file)
		if err != nil {
			return nil, err
		}
		return yaml.YAMLToJSON(data)
	}
	if len(bytes.TrimSpace(inline)) == 0 || string(bytes.TrimSpace(inline)) == "null" {
		return nil, nil
	}
	return inline, nil
}

// readObjectFile reads an objectFile / oldObjectFile, at most MaxSuiteBytes.
// The file must lie inside the suite's directory: a relative path without
// "..", and no symlink on the way may lead outside (os.Root resolves them
// and refuses an escape). A suite is often someone else's file, and what
// it reads is printed back in the diff, so it must not be able to read
// ~/.kube/config or /etc/shadow through the runner.
func (s *Suite) readObjectFile(file string) ([]byte, error) {
	if filepath.IsAbs(file) || !filepath.IsLocal(file) {
		return nil, fmt.Errorf("%s: must be a path inside the suite's directory %s (relative, without ..)", file, filepath.Dir(s.file))
	}
	root, err := os.OpenRoot(filepath.Dir(s.file))
	if err != nil {
		return nil, err
	}
	defer root.Close()
	f, err := root.Open(file)
	if err != nil {
		return nil, fmt.Errorf("%s: must be a file inside the suite's directory %s: %w", file, filepath.Dir(s.file), err)
	}
	defer f.Close()
	return readLimited(f, file)
}

func compare(t *Test, req *celpolicy.Request, d *celpolicy.Decision) []string {
	var f []string
	msg, code := "", int32(200)
	if d.Status != nil {
		msg, code = d.Status.Message, d.Status.Code
	}
	if *t.Expect.Allowed != d.Allowed {
		if d.Allowed {
			f = append(f, "allowed: got true, want false")
		} else {
			f = append(f, fmt.Sprintf("allowed: got false (%d %s), want true", code, msg))
		}
	}
	if c := t.Expect.Code; c != nil && *c != code {
		f = append(f, fmt.Sprintf("code: got %d, want %d", code, *c))
	}
	if m := t.Expect.Message; m != nil && *m != msg {
		f = append(f, fmt.Sprintf("message: got %q, want %q", msg, *m))
	}
	if m := t.Expect.MessageContains; m != "" && !strings.Contains(msg, m) {
		f = append(f, fmt.Sprintf("message: got %q, want it to contain %q", msg, m))
	}
	if w := t.Expect.Warnings; w != nil {
		got := d.Warnings
		if len(got) != len(*w) || !equalStrings(got, *w) {
			f = append(f, fmt.Sprintf("warnings: got %q, want %q", got, *w))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(t.Expect.AuditAnnotations)) {
		want := t.Expect.AuditAnnotations[k]
		if got, ok := d.AuditAnnotations[k]; !ok || got != want {
			f = append(f, fmt.Sprintf("auditAnnotations[%s]: got %q (present %v), want %q", k, got, ok, want))
		}
	}
	obj := d.Object
	if obj == nil {
		obj = req.Object
	}
	if len(t.Expect.Object) > 0 {
		if !sameJSON(obj, t.Expect.Object) {
			f = append(f, fmt.Sprintf("object: got %s, want %s", obj, t.Expect.Object))
		}
	}
	for _, p := range slices.Sorted(maps.Keys(t.Expect.Patched)) {
		want := t.Expect.Patched[p]
		segs, _ := jsonedit.ParsePointer(p)
		got, err := jsonedit.NewDoc(obj).Get(segs...)
		if err != nil {
			f = append(f, fmt.Sprintf("patched %s: %v", p, err))
			continue
		}
		if string(bytes.TrimSpace(want)) == "null" {
			if got != nil && string(got) != "null" {
				f = append(f, fmt.Sprintf("patched %s: got %s, want nothing there", p, got))
			}
			continue
		}
		if got == nil || !sameJSON(got, want) {
			f = append(f, fmt.Sprintf("patched %s: got %s, want %s", p, orNothing(got), want))
		}
	}
	return f
}

func orNothing(b []byte) string {
	if b == nil {
		return "nothing"
	}
	return string(b)
}

func equalStrings(a, b []string) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func sameJSON(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return bytes.Equal(xa, ya)
}

// Print writes results as text: one line per test ("PASS" or "FAIL"),
// each failure indented below, then, for a run against an API server, a
// "DIFF  suite / test: ..." line per difference and each note indented,
// and a summary line. It returns the number of tests that failed or
// differ from the API server.
func Print(w io.Writer, results []Result) int {
	failed, differ, bad, server := 0, 0, 0, false
	for _, r := range results {
		if len(r.Failures) == 0 {
			fmt.Fprintf(w, "PASS  %s / %s\n", r.Suite, r.Test)
		} else {
			failed++
			fmt.Fprintf(w, "FAIL  %s / %s\n", r.Suite, r.Test)
			for _, f := range r.Failures {
				fmt.Fprintf(w, "      %s\n", f)
			}
		}
		if r.Server == nil {
			if len(r.Failures) > 0 {
				bad++
			}
			continue
		}
		server = true
		for _, d := range r.Server.Diff {
			fmt.Fprintf(w, "DIFF  %s / %s: %s\n", r.Suite, r.Test, d)
		}
		for _, n := range r.Server.Notes {
			fmt.Fprintf(w, "      server: %s\n", n)
		}
		if len(r.Server.Diff) > 0 {
			differ++
		}
		if len(r.Failures) > 0 || len(r.Server.Diff) > 0 {
			bad++
		}
	}
	if server {
		fmt.Fprintf(w, "%d tests, %d passed, %d failed, %d differ from the API server\n", len(results), len(results)-failed, failed, differ)
	} else {
		fmt.Fprintf(w, "%d tests, %d passed, %d failed\n", len(results), len(results)-failed, failed)
	}
	return bad
}
