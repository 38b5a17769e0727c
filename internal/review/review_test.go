package review

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/builtin"
	"github.com/kadmit/kadmit/internal/policy"
)

const offensivePod = `apiVersion: v1
kind: Pod
metadata:
  name: offensive-pod
  namespace: default
spec:
  containers:
    - name: pause
      image: registry.k8s.io/pause:3.10
`

const lifespanPod = `apiVersion: v1
kind: Pod
metadata:
  name: lifespan-three
  namespace: default
  labels:
    acme.com/lifespan-requested: "3"
spec:
  containers:
    - name: pause
      image: registry.k8s.io/pause:3.10
`

const node = `apiVersion: v1
kind: Node
metadata:
  name: demo-node
status:
  capacity: {cpu: "4", memory: 8Gi, pods: "110"}
  allocatable: {cpu: 3500m, memory: 7Gi, pods: "110"}
`

func write(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func names(t *testing.T, docs []Document) []string {
	t.Helper()
	var out []string
	for _, d := range docs {
		var m struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := json.Unmarshal(d.Object, &m); err != nil {
			t.Fatalf("%s: object is not JSON: %v: %s", d, err, d.Object)
		}
		out = append(out, m.Kind+"/"+m.Metadata.Name)
	}
	return out
}

func TestReadMultiDocument(t *testing.T) {
	dir := t.TempDir()
	p := write(t, dir, "all.yaml", "---\n"+offensivePod+"---\n# only a comment\n---\n"+lifespanPod+"---\n"+node)
	docs, err := Read(p, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := names(t, docs), []string{"Pod/offensive-pod", "Pod/lifespan-three", "Node/demo-node"}; !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i, d := range docs {
		if d.Source != p || d.Index != i {
			t.Errorf("doc %d: source %q index %d", i, d.Source, d.Index)
		}
	}
	if s := docs[1].String(); s != p+" (document 1)" {
		t.Errorf("String() = %q", s)
	}
}

func TestReadList(t *testing.T) {
	dir := t.TempDir()
	p := write(t, dir, "list.yaml", `apiVersion: v1
kind: List
items:
  - {apiVersion: v1, kind: Pod, metadata: {name: a}}
  - {apiVersion: v1, kind: Pod, metadata: {name: b}}
---
apiVersion: v1
kind: PodList
items:
  - {apiVersion: v1, kind: Pod, metadata: {name: c}}
`)
	docs, err := Read(p, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := names(t, docs), []string{"Pod/a", "Pod/b", "Pod/c"}; !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i, d := range docs {
		if d.Index != i {
			t.Errorf("item %d has index %d", i, d.Index)
		}
	}
}

func TestReadDirectory(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "b.yaml", lifespanPod)
	write(t, dir, "a.yml", offensivePod)
	write(t, dir, "sub/c.json", `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c"}}`)
	write(t, dir, "README.md", "not a manifest")
	write(t, dir, "z.txt", "apiVersion: v1\nkind: Pod\nmetadata: {name: ignored}\n")
	docs, err := Read(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := names(t, docs), []string{"Pod/offensive-pod", "Pod/lifespan-three", "ConfigMap/c"}; !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if docs[0].Source != filepath.Join(dir, "a.yml") || docs[2].Source != filepath.Join(dir, "sub", "c.json") {
		t.Fatalf("sources %q %q", docs[0].Source, docs[2].Source)
	}
	if _, err := Read(filepath.Join(dir, "missing"), nil); !errors.Is(err, ErrInput) || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing path: %v", err)
	}
}

func TestReadStdin(t *testing.T) {
	docs, err := Read("-", strings.NewReader(offensivePod+"---\n"+node))
	if err != nil {
		t.Fatal(err)
	}
	if got := names(t, docs); !slices.Equal(got, []string{"Pod/offensive-pod", "Node/demo-node"}) || docs[1].Source != "-" {
		t.Fatalf("got %v from %q", got, docs[1].Source)
	}
	// JSON objects, several in one stream.
	docs, err = Read("-", strings.NewReader(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"x"}}
{"apiVersion":"v1","kind":"Pod","metadata":{"name":"y"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := names(t, docs); !slices.Equal(got, []string{"Pod/x", "Pod/y"}) {
		t.Fatalf("JSON stream: %v", got)
	}
}

func TestReadBadYAML(t *testing.T) {
	dir := t.TempDir()
	p := write(t, dir, "bad.yaml", offensivePod+"---\nkind: Pod\nmetadata: {name: [unclosed\n")
	_, err := Read(p, nil)
	if !errors.Is(err, ErrInput) || !strings.Contains(err.Error(), p+" (document 1)") {
		t.Fatalf("err = %v, want ErrInput naming %s (document 1)", err, p)
	}
	// The index is Document.Index's: empty documents are skipped and List
	// items count individually.
	_, err = Read("-", strings.NewReader("---\n# nothing\n---\n"+offensivePod+"---\nkind: [\n"))
	if !errors.Is(err, ErrInput) || !strings.Contains(err.Error(), "- (document 1)") {
		t.Fatalf("after an empty document: %v", err)
	}
	_, err = Read("-", strings.NewReader("apiVersion: v1\nkind: List\nitems: [{apiVersion: v1, kind: Pod}, {apiVersion: v1, kind: Pod}]\n---\nkind: [\n"))
	if !errors.Is(err, ErrInput) || !strings.Contains(err.Error(), "- (document 2)") {
		t.Fatalf("after a List: %v", err)
	}
	_, err = Read("-", strings.NewReader("- just\n- a list\n"))
	if !errors.Is(err, ErrInput) || !strings.Contains(err.Error(), "- (document 0)") {
		t.Fatalf("not an object: %v", err)
	}
}

func seedWebhooks(t *testing.T) []*admission.Webhook {
	t.Helper()
	whs, err := builtin.Webhooks(builtin.Config.Default(), policy.Env{})
	if err != nil {
		t.Fatal(err)
	}
	return whs
}

func runOne(t *testing.T, manifest string, opts Options) *Result {
	t.Helper()
	docs, err := Read("-", strings.NewReader(manifest))
	if err != nil || len(docs) != 1 {
		t.Fatalf("Read: %v, %d docs", err, len(docs))
	}
	res, err := Run(context.Background(), seedWebhooks(t), docs[0], opts)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func TestRunOffensivePodDenied(t *testing.T) {
	res := runOne(t, offensivePod, Options{})
	if res.Allowed || res.Code != 403 || res.Message != `pod name contains "offensive"` {
		t.Fatalf("result %+v", res)
	}
	if res.Kind != "Pod" || res.APIVersion != "v1" || res.Namespace != "default" || res.Name != "offensive-pod" {
		t.Fatalf("identity %+v", res)
	}
	if !slices.Equal(res.Webhooks, []string{"/mutate-pod", "/validate-pod"}) {
		t.Fatalf("webhooks %v", res.Webhooks)
	}
	if len(res.Patch) != 0 {
		t.Fatalf("denied object has a patch: %+v", res.Patch)
	}
}

func TestRunLifespanTolerations(t *testing.T) {
	res := runOne(t, lifespanPod, Options{})
	if !res.Allowed || res.Code != 200 || res.Message != "" {
		t.Fatalf("result %+v", res)
	}
	var pod corev1.Pod
	if err := json.Unmarshal(res.Object, &pod); err != nil {
		t.Fatal(err)
	}
	if len(pod.Spec.Tolerations) != 12 {
		t.Fatalf("%d tolerations in the object, want 12 (3..14): %+v", len(pod.Spec.Tolerations), pod.Spec.Tolerations)
	}
	for i, tol := range pod.Spec.Tolerations {
		want := corev1.Toleration{Key: "acme.com/lifespan-remaining", Operator: corev1.TolerationOpEqual, Value: itoa(3 + i), Effect: corev1.TaintEffectNoSchedule}
		if tol != want {
			t.Errorf("toleration %d = %+v, want %+v", i, tol, want)
		}
	}
	// The patch adds the same 12 tolerations.
	var added int
	for _, op := range res.Patch {
		if op.Op != "add" || !strings.HasPrefix(op.Path, "/spec/tolerations") {
			t.Errorf("unexpected patch op %+v", op)
			continue
		}
		var list []any
		if json.Unmarshal(op.Value, &list) == nil {
			added += len(list)
		} else {
			added++
		}
	}
	if added != 12 {
		t.Fatalf("patch adds %d tolerations, want 12: %+v", added, res.Patch)
	}
}

func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }

func TestRunNodeOvercommit(t *testing.T) {
	res := runOne(t, node, Options{})
	if !res.Allowed || !slices.Equal(res.Webhooks, []string{"/mutate-node-status", "/validate-node"}) {
		t.Fatalf("result %+v", res)
	}
	var n corev1.Node
	if err := json.Unmarshal(res.Object, &n); err != nil {
		t.Fatal(err)
	}
	alloc, capacity := n.Status.Allocatable[corev1.ResourceCPU], n.Status.Capacity[corev1.ResourceCPU]
	if alloc.String() != "7" || capacity.String() != "7500m" {
		t.Fatalf("cpu allocatable %s capacity %s, want 7 and 7500m", alloc.String(), capacity.String())
	}
	if mem := n.Status.Allocatable[corev1.ResourceMemory]; mem.String() != "7Gi" {
		t.Fatalf("memory changed to %s", mem.String())
	}
	if n.Annotations["kadmit.io/raw-allocatable"] == "" || len(res.Patch) == 0 {
		t.Fatalf("annotations %v patch %+v", n.Annotations, res.Patch)
	}

	// A status UPDATE of the same node, reviewed with its old object.
	docs, err := Read("-", strings.NewReader(node))
	if err != nil {
		t.Fatal(err)
	}
	res, err = Run(context.Background(), seedWebhooks(t), docs[0], Options{Operation: admissionv1.Update, SubResource: "status", Old: docs})
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(res.Object, &n); err != nil {
		t.Fatal(err)
	}
	alloc = n.Status.Allocatable[corev1.ResourceCPU]
	if !res.Allowed || !slices.Equal(res.Webhooks, []string{"/mutate-node-status"}) || alloc.String() != "7" {
		t.Fatalf("status update: %+v, allocatable cpu %s", res, alloc.String())
	}
}

func TestRunUpdateNeedsOld(t *testing.T) {
	docs, err := Read("-", strings.NewReader(lifespanPod))
	if err != nil {
		t.Fatal(err)
	}
	_, err = Run(context.Background(), seedWebhooks(t), docs[0], Options{Operation: admissionv1.Update})
	if !errors.Is(err, ErrInput) || !strings.Contains(err.Error(), "--old") {
		t.Fatalf("err = %v", err)
	}
	// Not a Kubernetes object.
	_, err = Run(context.Background(), seedWebhooks(t), Document{Source: "x", Object: []byte(`{"metadata":{"name":"a"}}`)}, Options{})
	if !errors.Is(err, ErrInput) || !strings.Contains(err.Error(), "x (document 0)") {
		t.Fatalf("no kind: %v", err)
	}
}

func TestRunPanicIsError(t *testing.T) {
	whs, err := admission.NewWebhooks([]admission.Hook{{
		Policy: "boom", Path: "/validate-pod", Type: admission.Validating,
		Rules: seedWebhooks(t)[0].Hooks[0].Rules,
		Validator: admission.ValidatorFunc(func(context.Context, *admission.Request) admission.Verdict {
			panic("kaboom")
		}),
	}})
	if err != nil {
		t.Fatal(err)
	}
	docs, err := Read("-", strings.NewReader(offensivePod))
	if err != nil {
		t.Fatal(err)
	}
	_, err = Run(context.Background(), whs, docs[0], Options{})
	var pe *admission.PanicError
	if !errors.As(err, &pe) || pe.Policy != "boom" || errors.Is(err, ErrInput) {
		t.Fatalf("err = %v, want a *admission.PanicError", err)
	}
}

func TestPrintJSON(t *testing.T) {
	var buf bytes.Buffer
	for _, m := range []string{offensivePod, lifespanPod, node} {
		if err := Print(&buf, runOne(t, m, Options{}), "json"); err != nil {
			t.Fatal(err)
		}
	}
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d lines: %q", len(lines), buf.String())
	}
	for i, line := range lines {
		var m map[string]json.RawMessage
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("line %d is not JSON: %v", i, err)
		}
		for _, k := range []string{"apiVersion", "kind", "namespace", "name", "allowed", "code", "message", "warnings", "patch", "object"} {
			if _, ok := m[k]; !ok {
				t.Errorf("line %d lacks %q: %s", i, k, line)
			}
		}
		for _, k := range []string{"warnings", "patch"} {
			if v := string(m[k]); v == "null" {
				t.Errorf("line %d: %s is null, want an array", i, k)
			}
		}
	}
	var denied Result
	if err := json.Unmarshal([]byte(lines[0]), &denied); err != nil || denied.Allowed || denied.Code != 403 || denied.Message != `pod name contains "offensive"` ||
		denied.Name != "offensive-pod" || denied.Namespace != "default" {
		t.Fatalf("denied line: %v %+v", err, denied)
	}
	var allowed Result
	if err := json.Unmarshal([]byte(lines[1]), &allowed); err != nil || !allowed.Allowed || allowed.Code != 200 || len(allowed.Patch) == 0 {
		t.Fatalf("allowed line: %v %+v", err, allowed)
	}
	// A cluster-scoped object still has the namespace key, empty.
	if !strings.Contains(lines[2], `"namespace":""`) || !strings.Contains(lines[2], `"message":""`) {
		t.Fatalf("node line: %s", lines[2])
	}
}

func TestPrintText(t *testing.T) {
	var buf bytes.Buffer
	if err := Print(&buf, runOne(t, offensivePod, Options{}), "text"); err != nil {
		t.Fatal(err)
	}
	want := "Pod default/offensive-pod: DENIED (403)\n  message: pod name contains \"offensive\"\n  webhooks: /mutate-pod, /validate-pod\n"
	if buf.String() != want {
		t.Fatalf("got %q, want %q", buf.String(), want)
	}
	buf.Reset()
	if err := Print(&buf, runOne(t, node, Options{}), "text"); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	if !strings.HasPrefix(out, "Node demo-node: ALLOWED\n  webhooks: /mutate-node-status, /validate-node\n") ||
		!strings.Contains(out, `  patch: replace /status/allocatable/cpu "7"`) || !strings.Contains(out, `  patch: replace /status/capacity/cpu "7500m"`) {
		t.Fatalf("got %q", out)
	}
}
