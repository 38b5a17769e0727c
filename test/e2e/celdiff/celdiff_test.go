package celdiff

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/uuid"
	apiserveradmission "k8s.io/apiserver/pkg/admission"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/kadmit/kadmit/internal/celpolicy"
	"github.com/kadmit/kadmit/internal/policysuite"
)

// effectLimit bounds the wait for the API server's policy informers to
// pick up (or drop) a policy set.
const effectLimit = 60 * time.Second

// paramKindUnresolved is in the denial the API server gives while its REST
// mapper does not yet know a CRD paramKind (k8s.io/apiserver v0.37.1
// pkg/admission/plugin/policy/generic/policy_source.go:415); it retries, so
// this state passes once its discovery catches up with the new CRD.
const paramKindUnresolved = "failed to find resource referenced by paramKind"

// outcome is what one request came to, in the terms both sides share.
type outcome struct {
	Allowed  bool
	Code     int32
	Message  string
	Warnings []string
	Object   map[string]any // the object after admission (allowed only)
	// Audit holds the policies' audit annotations: the engine's, or those
	// of the request's event in the API server's audit log.
	Audit   map[string]string `json:",omitempty"`
	auditID string
}

func (o outcome) String() string {
	b, _ := json.Marshal(o)
	return string(b)
}

// TestCorpus runs every policy set of examples/cel through both.
func TestCorpus(t *testing.T) {
	requireWorld(t)
	root := filepath.Join("..", "..", "..", "examples", "cel")
	suites, err := policysuite.Find(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(suites) < 10 {
		t.Fatalf("found %d suites under %s, want the whole corpus", len(suites), root)
	}
	for _, f := range suites {
		s, err := policysuite.ReadSuite(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Run(filepath.Base(filepath.Dir(f)), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			diffSuite(ctx, t, f, s)
		})
	}
}

type request struct {
	test   *policysuite.Test
	gvr    schema.GroupVersionResource
	obj    *unstructured.Unstructured
	old    *unstructured.Unstructured // created for real for UPDATE
	update bool
	// admitted is the object as admission sees it with no policy: the
	// dry-run result without policies (defaults applied).
	admitted *unstructured.Unstructured
}

func diffSuite(ctx context.Context, t *testing.T, file string, s *policysuite.Suite) {
	dir := filepath.Dir(file)
	var paths []string
	for _, p := range s.Policies {
		paths = append(paths, filepath.Join(dir, p))
	}
	set, err := celpolicy.Load(paths...)
	if err != nil {
		t.Fatal(err)
	}
	engine, err := celpolicy.New(set, celpolicy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// The API server gets the policy files as written, not kadmit's parse.
	written, params := policyDocuments(t, paths)
	var cleanup []func()
	defer func() {
		for i := len(cleanup) - 1; i >= 0; i-- {
			cleanup[i]()
		}
	}()

	// The world the policies need: CRDs, namespaces, params.
	if crds, err := os.ReadFile(filepath.Join(dir, "crds.yaml")); err == nil {
		for _, u := range decodeYAML(t, crds) {
			cleanup = append(cleanup, createObject(ctx, t, u))
		}
		waitFor(ctx, t, "CRDs served", func() bool {
			for _, p := range set.Params {
				if _, _, err := world.server.Mapping(p.GroupVersionKind()); err != nil {
					return false
				}
			}
			return true
		})
	}
	for i := range s.Namespaces {
		ns := s.Namespaces[i]
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace",
			"metadata": map[string]any{"name": ns.Name, "labels": toAny(ns.Labels)}}}
		// Kept: without kube-controller-manager a deleted namespace stays
		// Terminating and refuses creates for good.
		_ = createObject(ctx, t, u)
	}
	for _, p := range params {
		cleanup = append(cleanup, createObject(ctx, t, p.DeepCopy()))
	}

	// The requests, and each object as admission sees it without policies.
	var reqs []*request
	for i := range s.Tests {
		r := buildRequest(ctx, t, dir, &s.Tests[i])
		if r.update {
			cleanup = append(cleanup, createObject(ctx, t, r.old.DeepCopy()))
		}
		base, err := send(ctx, r)
		if err != nil {
			t.Fatalf("%s: without policies: %v", r.test.Name, err)
		}
		if !base.Allowed {
			t.Fatalf("%s: denied without policies: %s", r.test.Name, base)
		}
		r.admitted = &unstructured.Unstructured{Object: base.Object}
		if s.Defaults {
			checkDefaults(t, r)
		}
		reqs = append(reqs, r)
	}

	// The engine's outcome, on the same admission input.
	want := make([]outcome, len(reqs))
	probe := -1
	for i, r := range reqs {
		d, err := policysuite.Evaluate(ctx, engine, engineRequest(t, r))
		if err != nil {
			t.Fatalf("%s: engine: %v", r.test.Name, err)
		}
		want[i] = outcome{Allowed: d.Allowed, Warnings: nonNil(d.Warnings), Audit: d.AuditAnnotations}
		if !d.Allowed {
			want[i].Code, want[i].Message = d.Status.Code, d.Status.Message
		} else if d.Changed {
			var obj map[string]any
			if err := json.Unmarshal(d.Object, &obj); err != nil {
				t.Fatal(err)
			}
			want[i].Object = obj
		}
		if probe < 0 && (!d.Allowed || d.Changed || len(d.Warnings) > 0) {
			probe = i
		}
	}
	if probe < 0 {
		t.Fatal("no test of the suite is affected by its policies: the API server's uptake cannot be observed")
	}

	// In tree: the policies, then the same requests.
	removePolicies := installPolicies(ctx, t, written)
	cleanup = append(cleanup, removePolicies)
	waitFor(ctx, t, "policies in effect", func() bool {
		got, err := send(ctx, reqs[probe])
		if err == nil && strings.Contains(got.Message, paramKindUnresolved) {
			// The API server's own REST mapper has not seen the CRD yet
			// (policy_source.go retries); this denial is not the policy's.
			t.Logf("probe %s: paramKind not resolved by the API server yet", reqs[probe].test.Name)
			return false
		}
		return err == nil && (!got.Allowed || len(got.Warnings) > 0 || !sameObject(got.Object, reqs[probe].admitted.Object))
	})
	// Policies and bindings arrive through separate informers; give the
	// rest of the set the moment the first needed.
	time.Sleep(2 * time.Second)
	got := make([]outcome, len(reqs))
	for i, r := range reqs {
		if got[i], err = send(ctx, r); err != nil {
			t.Fatalf("%s: in tree: %v", r.test.Name, err)
		}
	}
	events, err := auditAnnotations()
	if err != nil {
		t.Fatal(err)
	}
	for i := range got {
		got[i].Audit = policyAnnotations(events[got[i].auditID], set)
	}
	removePolicies()
	cleanup = cleanup[:len(cleanup)-1]
	waitFor(ctx, t, "policies gone", func() bool {
		o, err := send(ctx, reqs[probe])
		if err == nil && o.Allowed && len(o.Warnings) == 0 && sameObject(o.Object, reqs[probe].admitted.Object) {
			return true
		}
		t.Logf("probe %s: %v %s", reqs[probe].test.Name, err, strip(o))
		return false
	})

	for i, r := range reqs {
		w, g := want[i], got[i]
		if w.Allowed && w.Object != nil {
			// The API server defaults what a mutation added (kadmit, a
			// webhook, leaves that to it): default the engine's object the
			// same way, by admitting it with no policy in place.
			rr := *r
			rr.obj = &unstructured.Unstructured{Object: w.Object}
			norm, err := send(ctx, &rr)
			if err != nil || !norm.Allowed {
				t.Fatalf("%s: defaulting the engine's object: %v %s", r.test.Name, err, norm)
			}
			w.Object = norm.Object
		}
		if w.Allowed && w.Object == nil {
			w.Object = r.admitted.Object
		}
		if !g.Allowed {
			g.Object = nil
		}
		if len(w.Audit) == 0 {
			w.Audit = nil
		}
		if w.Allowed != g.Allowed || w.Code != g.Code || w.Message != g.Message || !reflect.DeepEqual(w.Warnings, g.Warnings) ||
			!reflect.DeepEqual(w.Audit, g.Audit) ||
			(w.Allowed && !sameObject(w.Object, g.Object)) {
			t.Errorf("%s: kadmit and the API server differ:\n kadmit:     %s\n API server: %s", r.test.Name, strip(w), strip(g))
		} else {
			t.Logf("%s: identical: allowed=%v code=%d warnings=%d auditAnnotations=%d", r.test.Name, g.Allowed, g.Code, len(g.Warnings), len(g.Audit))
		}
		// Agreeing is not enough: both must also decide what the suite
		// records.
		for side, o := range map[string]outcome{"kadmit": w, "the API server": g} {
			f, skipped := checkExpect(r.test.Expect, o, r.obj.Object, r.admitted.Object)
			if len(f) > 0 {
				t.Errorf("%s: %s does not decide what the suite expects:\n  %s", r.test.Name, side, strings.Join(f, "\n  "))
			}
			if len(skipped) > 0 {
				t.Logf("%s: %s: expect.patched %v not checked: the API server's own admission changed what they point into (kadmit test checks them)", r.test.Name, side, skipped)
			}
		}
	}
}

func strip(o outcome) string {
	if o.Object != nil {
		o.Object = scrub(o.Object)
	}
	return o.String()
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func toAny(m map[string]string) map[string]any {
	out := map[string]any{}
	for k, v := range m {
		out[k] = v
	}
	return out
}

func decodeYAML(t *testing.T, data []byte) []*unstructured.Unstructured {
	t.Helper()
	var out []*unstructured.Unstructured
	for _, doc := range bytes.Split(data, []byte("\n---")) {
		j, err := yaml.YAMLToJSON(doc)
		if err != nil {
			t.Fatal(err)
		}
		if len(bytes.TrimSpace(j)) == 0 || string(j) == "null" {
			continue
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(j); err != nil {
			t.Fatal(err)
		}
		out = append(out, u)
	}
	return out
}

func resourceFor(t *testing.T, gvk schema.GroupVersionKind) (schema.GroupVersionResource, bool) {
	t.Helper()
	gvr, namespaced, err := world.server.Mapping(gvk)
	if err != nil {
		t.Fatal(err)
	}
	return gvr, namespaced
}

func client(t *testing.T, u *unstructured.Unstructured) dynamic.ResourceInterface {
	gvr, namespaced := resourceFor(t, u.GroupVersionKind())
	if namespaced {
		return world.dyn.Resource(gvr).Namespace(u.GetNamespace())
	}
	return world.dyn.Resource(gvr)
}

// createObject creates u (an existing one is updated to u) and returns its
// deletion.
func createObject(ctx context.Context, t *testing.T, u *unstructured.Unstructured) func() {
	t.Helper()
	c := client(t, u)
	_, err := c.Create(ctx, u, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		cur, gerr := c.Get(ctx, u.GetName(), metav1.GetOptions{})
		if gerr != nil {
			t.Fatal(gerr)
		}
		u.SetResourceVersion(cur.GetResourceVersion())
		_, err = c.Update(ctx, u, metav1.UpdateOptions{})
		if err != nil {
			t.Fatalf("update %s %s: %v", u.GetKind(), u.GetName(), err)
		}
		return func() {} // pre-existing (default, kube-public): left in place
	}
	if err != nil {
		t.Fatalf("create %s %s: %v", u.GetKind(), u.GetName(), err)
	}
	return func() {
		if err := c.Delete(context.Background(), u.GetName(), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete %s %s: %v", u.GetKind(), u.GetName(), err)
		}
	}
}

func buildRequest(ctx context.Context, t *testing.T, dir string, tc *policysuite.Test) *request {
	t.Helper()
	load := func(inline json.RawMessage, file string) *unstructured.Unstructured {
		var data []byte
		switch {
		case file != "":
			raw, err := os.ReadFile(filepath.Join(dir, file))
			if err != nil {
				t.Fatal(err)
			}
			if data, err = yaml.YAMLToJSON(raw); err != nil {
				t.Fatal(err)
			}
		case len(inline) > 0:
			data = inline
		default:
			return nil
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(data); err != nil {
			t.Fatal(err)
		}
		return u
	}
	r := &request{test: tc, obj: load(tc.Object, tc.ObjectFile), old: load(tc.OldObject, tc.OldObjectFile)}
	switch strings.ToUpper(tc.Operation) {
	case "", "CREATE":
	case "UPDATE":
		r.update = true
	default:
		t.Fatalf("%s: operation %s: the differential test sends CREATE and UPDATE", tc.Name, tc.Operation)
	}
	r.gvr, _ = resourceFor(t, r.obj.GroupVersionKind())
	return r
}

// send makes the request a server-side dry run and reads the outcome,
// with policysuite.Server.Send (what `kadmit test --server` sends); the
// Audit-ID header it carries finds its audit annotations.
func send(ctx context.Context, r *request) (outcome, error) {
	id := string(uuid.NewUUID())
	world.auditID.Store(id)
	defer world.auditID.Store("")
	sr := &policysuite.ServerRequest{Resource: r.gvr, Namespace: r.obj.GetNamespace(), Name: r.obj.GetName(),
		Operation: apiserveradmission.Create, Object: r.obj}
	if r.update {
		sr.Operation = apiserveradmission.Update
	}
	so, err := world.server.Send(ctx, sr)
	if err != nil {
		return outcome{}, err
	}
	o := outcome{Allowed: so.Allowed, Code: so.Code, Message: so.Message, Warnings: nonNil(so.Warnings), Object: so.Object, auditID: id}
	return o, nil
}

// engineRequest is the admission request the API server's policies saw:
// the defaulted object (and, for UPDATE, the stored old one).
func engineRequest(t *testing.T, r *request) *celpolicy.Request {
	t.Helper()
	obj := r.admitted.DeepCopy()
	// Set by the API server after mutating admission (BeforeCreate) and
	// returned by the dry run; not what mutating policies see.
	unstructured.RemoveNestedField(obj.Object, "metadata", "uid")
	unstructured.RemoveNestedField(obj.Object, "metadata", "creationTimestamp")
	raw, err := obj.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	gvk := obj.GroupVersionKind()
	req := &celpolicy.Request{
		Kind: gvk, Resource: r.gvr, Name: obj.GetName(), Namespace: obj.GetNamespace(),
		Operation: apiserveradmission.Create, Object: raw,
	}
	req.UserInfo.Username = "admin"
	req.UserInfo.Groups = []string{"system:masters", "system:authenticated"}
	if r.update {
		req.Operation = apiserveradmission.Update
		cur, err := client(t, r.old).Get(context.Background(), r.old.GetName(), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if req.OldObject, err = cur.MarshalJSON(); err != nil {
			t.Fatal(err)
		}
	}
	if ns := obj.GetNamespace(); ns != "" {
		u, err := world.dyn.Resource(schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}).Get(context.Background(), ns, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		nsObj := &corev1.Namespace{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, nsObj); err != nil {
			t.Fatal(err)
		}
		req.NamespaceObject = nsObj
	}
	return req
}

// installPolicies creates the policies and bindings among written (see
// policyDocuments), policies first, and returns their deletion (bindings
// first).
func installPolicies(ctx context.Context, t *testing.T, written []*unstructured.Unstructured) func() {
	t.Helper()
	var objs []*unstructured.Unstructured
	for _, u := range written {
		if !strings.HasSuffix(u.GetKind(), "Binding") {
			objs = append(objs, u.DeepCopy())
		}
	}
	for _, u := range written {
		if strings.HasSuffix(u.GetKind(), "Binding") {
			objs = append(objs, u.DeepCopy())
		}
	}
	var dels []func(context.Context) error
	for _, u := range objs {
		d, err := world.server.Create(ctx, u)
		if err != nil {
			t.Fatal(err)
		}
		dels = append(dels, d)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			dctx, cancel := context.WithTimeout(context.Background(), effectLimit)
			defer cancel()
			for i := len(dels) - 1; i >= 0; i-- {
				if err := dels[i](dctx); err != nil {
					t.Error(err)
				}
			}
		})
	}
}

func waitFor(ctx context.Context, t *testing.T, what string, cond func() bool) {
	t.Helper()
	if err := policysuite.WaitFor(ctx, what, effectLimit, cond); err != nil {
		t.Fatal(err)
	}
}

// scrub drops what differs between any two requests for the same object.
func scrub(obj map[string]any) map[string]any {
	u := &unstructured.Unstructured{Object: runtime.DeepCopyJSON(obj)}
	for _, f := range []string{"uid", "creationTimestamp", "managedFields", "resourceVersion", "generation"} {
		unstructured.RemoveNestedField(u.Object, "metadata", f)
	}
	return u.Object
}

func sameObject(a, b map[string]any) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return reflect.DeepEqual(scrub(a), scrub(b))
}

// auditAnnotations reads the audit log: each event's annotations by audit
// ID (the ResponseComplete stage carries the admission annotations).
func auditAnnotations() (map[string]map[string]string, error) {
	data, err := os.ReadFile(world.auditLog)
	if err != nil {
		return nil, err
	}
	out := map[string]map[string]string{}
	for _, line := range bytes.Split(data, []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var ev struct {
			AuditID     string            `json:"auditID"`
			Stage       string            `json:"stage"`
			Annotations map[string]string `json:"annotations"`
		}
		if err := json.Unmarshal(line, &ev); err != nil {
			return nil, fmt.Errorf("audit log: %w", err)
		}
		if ev.Stage == "ResponseComplete" {
			out[ev.AuditID] = ev.Annotations
		}
	}
	return out, nil
}

// policyAnnotations keeps the annotations the set's policies publish:
// "<validating policy>/<key>" and the validation_failure key.
func policyAnnotations(all map[string]string, set *celpolicy.Set) map[string]string {
	var out map[string]string
	for k, v := range all {
		keep := k == "validation.policy.admission.k8s.io/validation_failure"
		for _, p := range set.Validating {
			keep = keep || strings.HasPrefix(k, p.Name+"/")
		}
		if keep {
			if out == nil {
				out = map[string]string{}
			}
			out[k] = v
		}
	}
	return out
}
