package scheduling

// Kueue v0.13.0 fidelity of the job-queue and resource-flavor policies
// against a real API server (issue 12): Kueue's Job webhook rules answered
// 403 with its field errors, LocalQueueDefaulting from the informer cache,
// and the ResourceFlavor split between Kueue's CRD rules (the API server,
// 422) and its webhook (kadmit, 403). The suite's kadmit runs with
// managedLabel and requireQueue on (main_test.go); queue "spare" is
// configured for every namespace.

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/kadmit/kadmit/test/e2e/e2eenv"
	"github.com/kadmit/kadmit/test/poll"
)

// wantStatus fails unless err is an API error with code and a message
// containing msg.
func wantStatus(t *testing.T, err error, code int32, msg string) {
	t.Helper()
	wantDenied(t, err, msg)
	var st apierrors.APIStatus
	if !errors.As(err, &st) || st.Status().Code != code {
		t.Fatalf("error %v: want HTTP %d", err, code)
	}
}

func TestKueueJobRules(t *testing.T) {
	e := world(t)
	ctx := e2eenv.TestCtx(t, time.Minute)
	jobs := e.Client.BatchV1().Jobs(e.plain)
	spare := map[string]string{queueLabel: "spare"}
	for _, tc := range []struct {
		name string
		edit func(j *batchv1.Job)
		msg  string
	}{
		{"max-exec-time-seconds", func(j *batchv1.Job) { j.Labels["kueue.x-k8s.io/max-exec-time-seconds"] = "0" },
			`metadata.labels[kueue.x-k8s.io/max-exec-time-seconds]: Invalid value: 0: should be greater than 0`},
		{"job-min-parallelism", func(j *batchv1.Job) {
			j.Annotations = map[string]string{"kueue.x-k8s.io/job-min-parallelism": "5"}
			j.Spec.Parallelism, j.Spec.Completions = new(int32(4)), new(int32(6))
		}, `metadata.annotations[kueue.x-k8s.io/job-min-parallelism]: Invalid value: 5: should be between 0 and 3`},
		{"job-completions-equal-parallelism", func(j *batchv1.Job) {
			j.Annotations = map[string]string{"kueue.x-k8s.io/job-completions-equal-parallelism": "true"}
		}, `should not be enabled for NonIndexed jobs`},
		// A valid label value that is not a DNS-1123 subdomain reaches the
		// webhook (the API server checks only label syntax).
		{"queue-name DNS-1123", func(j *batchv1.Job) { j.Labels[queueLabel] = "Team_Q" },
			`metadata.labels[kueue.x-k8s.io/queue-name]: Invalid value: "Team_Q": a lowercase RFC 1123 subdomain`},
		{"deprecated queue-name annotation", func(j *batchv1.Job) {
			delete(j.Labels, queueLabel)
			j.Annotations = map[string]string{queueLabel: "bad name"}
		}, `metadata.annotations[kueue.x-k8s.io/queue-name]: Invalid value: "bad name"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := newJob("rules", map[string]string{queueLabel: "spare"}, 1, "100m")
			tc.edit(j)
			_, err := jobs.Create(ctx, j, dryRun)
			wantStatus(t, err, 403, tc.msg)
		})
	}
	got, err := jobs.Create(ctx, newJob("queued", spare, 1, "100m"), dryRun)
	if err != nil {
		t.Fatal(err)
	}
	if got.Spec.Suspend == nil || !*got.Spec.Suspend {
		t.Fatal("a job naming a queue is not created suspended")
	}
}

// TestKueueQueueChangeWhileSuspending: Kueue's immutability rule reads the
// new job only, so the update that suspends a running job may move it.
func TestKueueQueueChangeWhileSuspending(t *testing.T) {
	e := world(t)
	ctx := e2eenv.TestCtx(t, time.Minute)
	jobs := e.Client.BatchV1().Jobs(e.plain)
	j, err := jobs.Create(ctx, newJob("moves-back", map[string]string{queueLabel: "spare"}, 1, "100m"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	j.Spec.Suspend = new(false)
	if j, err = jobs.Update(ctx, j, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	j.Spec.Suspend = new(true)
	j.Labels[queueLabel] = "main"
	if _, err = jobs.Update(ctx, j, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("suspend and move in one update: %v", err)
	}
}

// TestKueueLocalQueueDefaulting: a namespace holding a LocalQueue named
// default gives its jobs that queue, once kadmit's informer has seen it.
func TestKueueLocalQueueDefaulting(t *testing.T) {
	e := world(t)
	ctx := e2eenv.TestCtx(t, time.Minute)
	ns := "lq-default-" + e.suffix
	if _, err := e.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	jobs := e.Client.BatchV1().Jobs(ns)
	before, err := jobs.Create(ctx, newJob("early", nil, 1, "100m"), dryRun)
	if err != nil || before.Labels[queueLabel] != "" || (before.Spec.Suspend != nil && *before.Spec.Suspend) {
		t.Fatalf("before the LocalQueue: %v %v", before.Labels, err)
	}
	lq := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue",
		"metadata": map[string]any{"name": "default"}, "spec": map[string]any{"clusterQueue": "cq"},
	}}
	if _, err := e.dyn.Resource(localQueueGVR).Namespace(ns).Create(ctx, lq, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := poll.Until(ctx, cacheWait, func(ctx context.Context) error {
		got, err := jobs.Create(ctx, newJob("late", nil, 1, "100m"), dryRun)
		if err != nil {
			return err
		}
		if got.Labels[queueLabel] != "default" || got.Spec.Suspend == nil || !*got.Spec.Suspend {
			return fmt.Errorf("job labels %v suspend %v", got.Labels, got.Spec.Suspend)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestKueueResourceFlavor: the finalizer is added; the webhook's rules
// answer 403; the CRD's rules (Kueue v0.13.0's own CRD is installed) answer
// 422 before the webhook; spec updates are allowed unless the old flavor
// has a topology.
func TestKueueResourceFlavor(t *testing.T) {
	e := world(t)
	ctx := e2eenv.TestCtx(t, time.Minute)
	rf := e.dyn.Resource(flavorGVR)
	flavor := func(name string, spec map[string]any) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ResourceFlavor",
			"metadata": map[string]any{"name": name + "-" + e.suffix}, "spec": spec,
		}}
	}
	created, err := rf.Create(ctx, flavor("spot", map[string]any{
		"nodeLabels":  map[string]any{"instance-type": "spot"},
		"nodeTaints":  []any{map[string]any{"key": "spot", "value": "true", "effect": "NoSchedule"}},
		"tolerations": []any{map[string]any{"key": "spot", "value": "true", "effect": "NoSchedule"}},
	}), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if f := created.GetFinalizers(); len(f) != 1 || f[0] != "kueue.x-k8s.io/resource-in-use" {
		t.Fatalf("finalizers %v", f)
	}
	if tols, _, _ := unstructured.NestedSlice(created.Object, "spec", "tolerations"); tols[0].(map[string]any)["operator"] != nil {
		t.Fatalf("toleration defaulted: %v", tols)
	}
	_, err = rf.Create(ctx, flavor("bad-label", map[string]any{"nodeLabels": map[string]any{"@abc": "v"}}), dryRun)
	wantStatus(t, err, 403, `spec.nodeLabels: Invalid value: "@abc"`)
	_, err = rf.Create(ctx, flavor("bad-tol", map[string]any{"tolerations": []any{map[string]any{"key": "@abc", "operator": "Exists"}}}), dryRun)
	wantStatus(t, err, 403, `spec.tolerations[0].key: Invalid value: "@abc"`)
	_, err = rf.Create(ctx, flavor("bad-taint", map[string]any{"nodeTaints": []any{map[string]any{"key": "k", "effect": "Never"}}}), dryRun)
	wantStatus(t, err, 422, "supported taint effect values")

	// Kueue lets the spec change (issue 12: kadmit refused it).
	changed := created.DeepCopy()
	_ = unstructured.SetNestedField(changed.Object, "on-demand", "spec", "nodeLabels", "instance-type")
	_ = unstructured.SetNestedSlice(changed.Object, nil, "spec", "nodeTaints")
	if _, err := rf.Update(ctx, changed, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("spec update refused: %v", err)
	}
	// ... except once a topology is set (the CRD's transition rule).
	topo, err := rf.Create(ctx, flavor("topo", map[string]any{"nodeLabels": map[string]any{"pool": "a"}, "topologyName": "t"}), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_ = unstructured.SetNestedField(topo.Object, "b", "spec", "nodeLabels", "pool")
	_, err = rf.Update(ctx, topo, metav1.UpdateOptions{})
	wantStatus(t, err, 422, "resourceFlavorSpec are immutable when topologyName is set")
}
