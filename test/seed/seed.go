// Package seed is the one table of what the manifests in examples/seed/ make
// a real API server do through kadmit's seed profile: for each scenario, what
// is applied, the outcome expected, and a check of what the API server
// answered and stored. `make demo` prints the table; the e2e suite runs each
// row as a subtest. A change of a seed manifest or of a policy's outcome is
// made here, once.
package seed

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"
)

// Names the seed profile's policies use on objects.
const (
	LifespanKey      = "acme.com/lifespan-remaining"
	LifespanLabel    = "acme.com/lifespan-requested"
	AnnotationRaw    = "kadmit.io/raw-allocatable"
	AnnotationRatio  = "kadmit.io/overcommit-ratio"
	OffensiveMessage = `pod name contains "offensive"`
	PodNameWebhook   = "pod-name.kadmit.io"
)

// Dir is the directory of the seed manifests in the repository at root.
func Dir(root string) string { return filepath.Join(root, "examples", "seed") }

// Load decodes the manifest dir/name into out, strictly, so that a typo in an
// example fails rather than silently dropping a field.
func Load(dir, name string, out any) error {
	data, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return fmt.Errorf("seed: read manifest: %w", err)
	}
	if err := yaml.UnmarshalStrict(data, out); err != nil {
		return fmt.Errorf("seed: decode %s: %w", name, err)
	}
	return nil
}

// Env is where the scenarios run.
type Env struct {
	// Client talks to the API server kadmit is registered with.
	Client kubernetes.Interface
	// Dir holds the seed manifests (Dir(root)).
	Dir string
	// Namespace receives the pods; empty means "default".
	Namespace string
	// NodeSuffix, when set, is appended (after a dash) to the name of every
	// node the scenarios create: nodes are cluster-wide, and a suffix of the
	// run keeps reruns against one API server apart.
	NodeSuffix string
	// Created, when set, is called for every object the API server stored
	// (kind "Pod" or "Node"), so that the caller can delete it afterwards.
	Created func(kind, namespace, name string)
}

// Scenario is one row of the table.
type Scenario struct {
	// Name says what is done, e.g. "create pod offensive-pod".
	Name string
	// Expected is the outcome the seed profile should produce, for people.
	Expected string
	// Run applies the scenario and checks the answer. It runs the scenarios
	// before it in the table need not have run; a scenario that needs the
	// seed node creates it when it is missing.
	Run func(ctx context.Context, e *Env) Result
}

// Result is what the API server answered and how it differs from Expected.
type Result struct {
	// Got is what the API server answered or stored, on one line.
	Got string
	// Problems lists each difference from the expected outcome; none means
	// the outcome matched.
	Problems []string
}

// Matched reports whether the outcome was the expected one.
func (r Result) Matched() bool { return len(r.Problems) == 0 }

func (r *Result) problem(format string, args ...any) {
	r.Problems = append(r.Problems, fmt.Sprintf(format, args...))
}

// failed is the Result of a scenario that could not get an answer to check.
func failed(err error) Result {
	return Result{Got: "error: " + err.Error(), Problems: []string{err.Error()}}
}

// Scenarios returns the table, in the order the demo shows it.
func Scenarios() []Scenario {
	return []Scenario{
		{"create pod offensive-pod", "denied (403): " + OffensiveMessage, offensivePod},
		{"create pod lifespan-three (asks for 3 days)", "12 tolerations, values 3..14", lifespanThree},
		{"create pod plain-pod (no lifespan label)", "one toleration, operator Exists", plainPod},
		{"create pod lifespan-abc (label not a number)", "rejected (4xx), naming the label and [0, 14]", lifespanNotANumber},
		{"create node demo-node (cpu 3500m/4)", "cpu allocatable/capacity 7/7500m", nodeCreate},
		{"kubelet PUTs raw status (3500m/4) 4 times", "still 7/7500m after each", nodeStatusUpdates},
		{"kubelet PATCHes status: raw resources, heartbeats", "still 7/7500m after each", nodeStatusPatches},
		{"create node demo-node-bad-ratio (ratio 0.5)", "denied, naming " + AnnotationRatio, badRatioNode},
	}
}

func (e *Env) namespace() string {
	if e.Namespace == "" {
		return metav1.NamespaceDefault
	}
	return e.Namespace
}

func (e *Env) nodeName(name string) string {
	if e.NodeSuffix == "" {
		return name
	}
	return name + "-" + e.NodeSuffix
}

func (e *Env) created(kind, namespace, name string) {
	if e.Created != nil {
		e.Created(kind, namespace, name)
	}
}

// pod loads a seed pod into the run's namespace.
func (e *Env) pod(file string) (*corev1.Pod, error) {
	var pod corev1.Pod
	if err := Load(e.Dir, file, &pod); err != nil {
		return nil, err
	}
	pod.Namespace = e.namespace()
	return &pod, nil
}

// createPod creates pod and returns what etcd holds, not the create response.
func (e *Env) createPod(ctx context.Context, pod *corev1.Pod) (*corev1.Pod, error) {
	pods := e.Client.CoreV1().Pods(pod.Namespace)
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	e.created("Pod", pod.Namespace, pod.Name)
	return pods.Get(ctx, pod.Name, metav1.GetOptions{})
}

// node loads a seed node, named for this run.
func (e *Env) node(file string) (*corev1.Node, error) {
	var node corev1.Node
	if err := Load(e.Dir, file, &node); err != nil {
		return nil, err
	}
	node.Name = e.nodeName(node.Name)
	return &node, nil
}

// seedNode returns the stored seed node (node.yaml), creating it when it is
// missing.
func (e *Env) seedNode(ctx context.Context) (*corev1.Node, error) {
	node, err := e.node("node.yaml")
	if err != nil {
		return nil, err
	}
	nodes := e.Client.CoreV1().Nodes()
	stored, err := nodes.Get(ctx, node.Name, metav1.GetOptions{})
	if !apierrors.IsNotFound(err) {
		return stored, err
	}
	if _, err := nodes.Create(ctx, node, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("create node %s: %w", node.Name, err)
	}
	e.created("Node", "", node.Name)
	return nodes.Get(ctx, node.Name, metav1.GetOptions{})
}

// rejected checks the answer to a request the API server must refuse with
// an error containing each of want.
func rejected(err error, want ...string) Result {
	if err == nil {
		return Result{Got: "admitted and stored", Problems: []string{"admitted; want it refused"}}
	}
	r := Result{Got: fmt.Sprintf("%d: %s", StatusCode(err), webhookDenial.ReplaceAllString(err.Error(), "$1 denied: "))}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			r.problem("error %q does not contain %s", err, w)
		}
	}
	return r
}

// webhookDenial matches the API server's preamble to a webhook's message, to
// shorten it in Got.
var webhookDenial = regexp.MustCompile(`admission webhook "([^"]+)" denied the request: `)

// StatusCode is the HTTP status of an API error, or 0.
func StatusCode(err error) int32 {
	var s apierrors.APIStatus
	if errors.As(err, &s) {
		return s.Status().Code
	}
	return 0
}

func offensivePod(ctx context.Context, e *Env) Result {
	pod, err := e.pod("offensive-pod.yaml")
	if err != nil {
		return failed(err)
	}
	_, err = e.createPod(ctx, pod)
	r := rejected(err, OffensiveMessage, `admission webhook "`+PodNameWebhook+`" denied the request`)
	if err == nil {
		return r
	}
	if !apierrors.IsForbidden(err) {
		r.problem("HTTP %d (%s); want 403 Forbidden", StatusCode(err), apierrors.ReasonForError(err))
	}
	if _, err := e.Client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		r.problem("after the denial, get pod %s = %v; want NotFound", pod.Name, err)
	}
	return r
}

// LifespanTolerations returns the tolerations the lifespan policy manages
// (key prefix acme.com/), leaving out e.g. the API server's not-ready and
// unreachable defaults.
func LifespanTolerations(ts []corev1.Toleration) []corev1.Toleration {
	var out []corev1.Toleration
	for _, t := range ts {
		if strings.HasPrefix(t.Key, "acme.com/") {
			out = append(out, t)
		}
	}
	return out
}

func lifespanThree(ctx context.Context, e *Env) Result {
	pod, err := e.pod("lifespan-three.yaml")
	if err != nil {
		return failed(err)
	}
	stored, err := e.createPod(ctx, pod)
	if err != nil {
		return failed(err)
	}
	got := LifespanTolerations(stored.Spec.Tolerations)
	var vals []string
	for _, t := range got {
		vals = append(vals, t.Value)
	}
	r := Result{Got: fmt.Sprintf("%d tolerations, values %s", len(got), strings.Join(vals, ","))}
	if len(got) != 12 {
		r.problem("%d acme.com tolerations; want 12 (values 3..14): %+v", len(got), got)
	}
	for i, t := range got {
		want := corev1.Toleration{Key: LifespanKey, Operator: corev1.TolerationOpEqual, Value: strconv.Itoa(3 + i), Effect: corev1.TaintEffectNoSchedule}
		if t != want {
			r.problem("toleration %d = %+v; want %+v", i, t, want)
		}
	}
	return r
}

func plainPod(ctx context.Context, e *Env) Result {
	pod, err := e.pod("plain-pod.yaml")
	if err != nil {
		return failed(err)
	}
	if _, ok := pod.Labels[LifespanLabel]; ok {
		return failed(fmt.Errorf("seed plain-pod.yaml carries %s; it must not", LifespanLabel))
	}
	stored, err := e.createPod(ctx, pod)
	if err != nil {
		return failed(err)
	}
	got := LifespanTolerations(stored.Spec.Tolerations)
	var desc []string
	for _, t := range got {
		desc = append(desc, fmt.Sprintf("%s %s", t.Operator, t.Effect))
	}
	r := Result{Got: fmt.Sprintf("%d toleration(s): %s", len(got), strings.Join(desc, "; "))}
	if len(got) == 0 {
		r.Got = "no " + LifespanKey + " toleration"
	}
	want := corev1.Toleration{Key: LifespanKey, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}
	if len(got) != 1 || got[0] != want {
		r.problem("stored acme.com tolerations = %+v; want exactly [%+v]", got, want)
	}
	return r
}

func lifespanNotANumber(ctx context.Context, e *Env) Result {
	pod, err := e.pod("lifespan-three.yaml")
	if err != nil {
		return failed(err)
	}
	pod.Name = "lifespan-abc"
	pod.Labels[LifespanLabel] = "abc"
	_, err = e.createPod(ctx, pod)
	r := rejected(err, LifespanLabel, "[0, 14]", `"abc"`)
	if c := StatusCode(err); err != nil && (c < 400 || c >= 500) {
		r.problem("HTTP %d; want a 4xx client error", c)
	}
	return r
}

// amplified checks the stored node carries the seed profile's amplified
// cpu (allocatable 3500m -> 7, capacity 4 -> 7500m) and untouched memory,
// and returns "allocatable/capacity" for Got.
func amplified(r *Result, when string, n *corev1.Node) string {
	alloc, capa := n.Status.Allocatable[corev1.ResourceCPU], n.Status.Capacity[corev1.ResourceCPU]
	if alloc.Cmp(resource.MustParse("7")) != 0 || capa.Cmp(resource.MustParse("7500m")) != 0 {
		r.problem("%s: cpu allocatable/capacity = %s/%s; want 7/7500m", when, alloc.String(), capa.String())
	}
	// Only cpu is amplified in the seed profile; memory must be left alone.
	if m := n.Status.Allocatable[corev1.ResourceMemory]; m.Cmp(resource.MustParse("7Gi")) != 0 {
		r.problem("%s: memory allocatable = %s; want 7Gi (untouched)", when, m.String())
	}
	return alloc.String() + "/" + capa.String()
}

func nodeCreate(ctx context.Context, e *Env) Result {
	node, err := e.node("node.yaml")
	if err != nil {
		return failed(err)
	}
	nodes := e.Client.CoreV1().Nodes()
	if _, err := nodes.Create(ctx, node, metav1.CreateOptions{}); err != nil {
		return failed(err)
	}
	e.created("Node", "", node.Name)
	stored, err := nodes.Get(ctx, node.Name, metav1.GetOptions{})
	if err != nil {
		return failed(err)
	}
	var r Result
	r.Got = amplified(&r, "after create", stored)
	return r
}

// nodeStatusUpdates posts node-status.yaml 4 times as a kubelet that knows
// nothing of kadmit does: a PUT of nodes/status with its raw numbers on the
// latest resourceVersion. kadmit must amplify them afresh each time, never
// compounding its earlier result.
func nodeStatusUpdates(ctx context.Context, e *Env) Result {
	var status corev1.Node
	if err := Load(e.Dir, "node-status.yaml", &status); err != nil {
		return failed(err)
	}
	node, err := e.seedNode(ctx)
	if err != nil {
		return failed(err)
	}
	nodes := e.Client.CoreV1().Nodes()
	var r Result
	var seen []string
	for i := 1; i <= 4; i++ {
		latest, err := nodes.Get(ctx, node.Name, metav1.GetOptions{})
		if err == nil {
			// Exactly what a kubelet posts: its raw status on the latest
			// resourceVersion, metadata as last read.
			latest.Status = *status.Status.DeepCopy()
			_, err = nodes.UpdateStatus(ctx, latest, metav1.UpdateOptions{})
		}
		var stored *corev1.Node
		if err == nil {
			stored, err = nodes.Get(ctx, node.Name, metav1.GetOptions{})
		}
		if err != nil {
			r.problem("status update %d: %v", i, err)
			r.Got = strings.Join(append(seen, "error: "+err.Error()), ", ")
			return r
		}
		when := fmt.Sprintf("after status update %d", i)
		seen = append(seen, amplified(&r, when, stored))
		if _, ok := stored.Annotations[AnnotationRaw]; !ok {
			r.problem("%s: annotation %s is missing; annotations = %v", when, AnnotationRaw, stored.Annotations)
			seen[len(seen)-1] += " (no " + AnnotationRaw + ")"
		}
		if !ready(stored) {
			r.problem("%s: the kubelet's Ready condition was not stored", when)
		}
	}
	r.Got = strings.Join(seen, ", ")
	return r
}

func ready(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// nodeStatusPatches makes the writes a real kubelet makes: strategic-merge
// PATCHes of nodes/status, one carrying its raw resources again and one that
// is a heartbeat touching only a condition. The heartbeat reaches kadmit with
// the already amplified values merged in, which must not be amplified twice.
func nodeStatusPatches(ctx context.Context, e *Env) Result {
	node, err := e.seedNode(ctx)
	if err != nil {
		return failed(err)
	}
	patches := []struct{ name, body string }{
		{"raw resources", `{"status":{"capacity":{"cpu":"4"},"allocatable":{"cpu":"3500m"}}}`},
		{"heartbeat", `{"status":{"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady","lastHeartbeatTime":"2025-01-01T00:00:40Z","lastTransitionTime":"2025-01-01T00:00:00Z"}]}}`},
		{"raw resources again", `{"status":{"capacity":{"cpu":"4"},"allocatable":{"cpu":"3500m"}}}`},
		{"heartbeat again", `{"status":{"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady","lastHeartbeatTime":"2025-01-01T00:01:20Z","lastTransitionTime":"2025-01-01T00:00:00Z"}]}}`},
	}
	nodes := e.Client.CoreV1().Nodes()
	var r Result
	var seen []string
	for _, p := range patches {
		_, err := nodes.Patch(ctx, node.Name, types.StrategicMergePatchType, []byte(p.body), metav1.PatchOptions{}, "status")
		var stored *corev1.Node
		if err == nil {
			stored, err = nodes.Get(ctx, node.Name, metav1.GetOptions{})
		}
		if err != nil {
			r.problem("PATCH nodes/status (%s): %v", p.name, err)
			r.Got = strings.Join(append(seen, "error: "+err.Error()), ", ")
			return r
		}
		seen = append(seen, amplified(&r, "after PATCH "+p.name, stored))
	}
	r.Got = strings.Join(seen, ", ")
	return r
}

func badRatioNode(ctx context.Context, e *Env) Result {
	node, err := e.node("bad-ratio-node.yaml")
	if err != nil {
		return failed(err)
	}
	_, err = e.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err == nil {
		e.created("Node", "", node.Name)
	}
	return rejected(err, AnnotationRatio)
}
