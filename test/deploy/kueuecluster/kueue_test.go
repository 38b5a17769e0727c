package kueuecluster

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kadmit/kadmit/test/cluster"
	"github.com/kadmit/kadmit/test/controlplane"
	"github.com/kadmit/kadmit/test/deploy/realcluster"
	"github.com/kadmit/kadmit/test/poll"
)

// The load and the time bounds. Every loop is bounded: the load by
// loadRate*bound creations and the scenario's bound, each wait by the
// scenario's context.
const (
	// loadRate is the steady rate of Job creations (server-side dry run).
	loadRate = 20
	// baseline is the load before a disruption, to show the steady state.
	baseline = 2 * time.Second
	// afterAvailable is how long the fresh install's load runs after the
	// Deployment turns Available: Kueue issue #13036 reports 10-30 s of
	// errors after Ready.
	afterAvailable = 45 * time.Second
	// settle is how long a disruption's load runs after it completed.
	settle = 20 * time.Second

	freshBound    = 6 * time.Minute
	restartBound  = 4 * time.Minute
	leaderBound   = 4 * time.Minute
	rotationBound = 6 * time.Minute
	// variantBound covers a cluster start, the image import and the four
	// scenarios.
	variantBound = 25 * time.Minute
)

// TestKueueCertificatesUnderLoad runs Kueue v0.17.0 with its Helm chart (2
// replicas, internal certificate management) on a fresh two-node cluster
// for each variant of the manager, Kueue's own (cert-controller) and ours
// (webhookcerts), and measures failed Job admissions under a steady load
// through a fresh install, a rollout restart, the leader pod's deletion
// and a forced CA rotation. The upstream variant's failures are the
// measurement, not a test failure; the library variant must have none
// once the Deployment is Available. Every scenario must complete in its
// bound. The markdown table is logged and written to $KADMIT_KUEUE_REPORT
// when set.
func TestKueueCertificatesUnderLoad(t *testing.T) {
	dir := Dir()
	results := Results{}
	began := time.Now()
	ran := 0
	for _, v := range Variants {
		t.Run(v.Name, func(t *testing.T) {
			if err := v.Check(dir); err != nil {
				if errors.Is(err, ErrMissing) && os.Getenv(cluster.EnvRequired) != "1" {
					t.Skipf("%v (%s=%s)", err, EnvDir, dir)
				}
				t.Fatalf("%v (%s=%s)", err, EnvDir, dir)
			}
			ran++
			runVariant(t, dir, v, results)
		})
	}
	if ran == 0 {
		return
	}
	header := fmt.Sprintf("Kueue %s, chart charts/kueue with 2 replicas and internal certificate management, on a fresh two-node cluster per variant; "+
		"load: %d Job creations/s (server-side dry run, label %s=%s in namespace %s), windows relative to each scenario's start (the fresh install: `helm install`; the others: the disruption), by the time the failed call was sent. Run took %s.",
		Version, loadRate, QueueNameLabel, LocalQueue, LoadNamespace, time.Since(began).Round(time.Second))
	header += fmt.Sprintf(" The library variant runs with the RBAC its change adds to the chart's (docs/library.md): patch on webhook configurations and CRDs, get on Services and list on EndpointSlices in %s.", Namespace)
	table := Table(results, header)
	t.Log("\n" + table)
	if p := os.Getenv(EnvReport); p != "" {
		if err := os.WriteFile(p, []byte(table), 0o644); err != nil {
			t.Errorf("write %s: %v", p, err)
		}
	}
}

// runVariant starts a cluster with the variant's image, installs the chart
// and runs the scenarios in order, recording each cell in results.
func runVariant(t *testing.T, dir string, v Variant, results Results) {
	ctx, cancel := context.WithTimeout(context.Background(), variantBound)
	defer cancel()
	archive, err := v.Image(dir, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c, err := cluster.Start(ctx, cluster.Options{Nodes: 2, Images: []string{archive}, Log: realcluster.TestLog(t)})
	if err != nil {
		if (errors.Is(err, cluster.ErrUnavailable) || errors.Is(err, controlplane.ErrBinariesMissing)) && os.Getenv(cluster.EnvRequired) != "1" {
			t.Skip(err)
		}
		t.Fatal(err)
	}
	defer c.Stop()
	if err := EnsureNamespaces(ctx, c); err != nil {
		t.Fatal(err)
	}
	if v.Library {
		t.Logf("granting the manager the library's RBAC beyond the chart's: patch on webhook configurations and CRDs, get Services and list EndpointSlices in %s (%s)", Namespace, LibraryRBACName)
		if err := GrantLibraryRBAC(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	tl := realcluster.StartTimeline(ctx, c, Namespace, Selector, ServiceName)
	stopObserve := Observe(ctx, c, tl)
	defer func() { stopObserve(); tl.Stop() }()

	r := &variantRun{t: t, c: c, v: v, tl: tl, results: results}
	if !r.fresh(ctx, dir) {
		return
	}
	r.logPods(ctx)
	r.disrupt(ctx, RolloutRestart, restartBound, func(ctx context.Context) (string, error) {
		if out, err := c.Kubectl(ctx, "-n", Namespace, "rollout", "restart", "deployment/"+DeploymentName); err != nil {
			return "", fmt.Errorf("%w: %s", err, out)
		}
		return "", nil
	}, func(ctx context.Context) error { return RolledOut(ctx, c) })

	var victim string
	r.disrupt(ctx, DeleteLeader, leaderBound, func(ctx context.Context) (string, error) {
		var err error
		if victim, err = Leader(ctx, c); err != nil {
			return "", err
		}
		if err := c.Client.CoreV1().Pods(Namespace).Delete(ctx, victim, metav1.DeleteOptions{}); err != nil {
			return "", err
		}
		return "leader " + victim + " deleted", nil
	}, func(ctx context.Context) error {
		if _, err := c.Client.CoreV1().Pods(Namespace).Get(ctx, victim, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("pod %s not gone (%v)", victim, err)
		}
		if err := RolledOut(ctx, c); err != nil {
			return err
		}
		leader, err := Leader(ctx, c)
		if err != nil {
			return err
		}
		if leader == victim {
			return fmt.Errorf("lease still held by %s", victim)
		}
		return nil
	})

	r.disrupt(ctx, CARotation, rotationBound, func(ctx context.Context) (string, error) {
		old, err := SecretCAs(ctx, c)
		if err != nil {
			return "", err
		}
		r.oldCAs = old
		if v.Library {
			return "annotated " + RotateAnnotation + "=ca", AnnotateRotate(ctx, c, "ca")
		}
		return "Secret data cleared", ClearSecret(ctx, c)
	}, func(ctx context.Context) error { return RotationDone(ctx, c, r.oldCAs) })
}

type variantRun struct {
	t       *testing.T
	c       *cluster.Cluster
	v       Variant
	tl      *realcluster.Timeline
	results Results
	oldCAs  []*x509.Certificate
}

// fresh installs the chart and loads it until afterAvailable past the
// Deployment's Available; it reports whether the release became
// Available (the other scenarios need it).
func (r *variantRun) fresh(ctx context.Context, dir string) bool {
	t, c := r.t, r.c
	ctx, cancel := context.WithTimeout(ctx, freshBound)
	defer cancel()
	start := time.Now()
	r.tl.Add("helm install")
	if err := Install(ctx, c, dir, r.v); err != nil {
		r.results.Set(r.v.Name, FreshBefore, Cell{Err: err})
		t.Errorf("%s: %v", FreshBefore, err)
		return false
	}
	installed := time.Since(start)
	load, err := StartLoad(ctx, c, LoadOptions{Rate: loadRate, Duration: freshBound})
	if err != nil {
		t.Fatal(err)
	}
	var available time.Time
	err = poll.Until(ctx, 0, func(ctx context.Context) error {
		d, err := Deployment(ctx, c)
		if err != nil {
			return err
		}
		if !Available(d) {
			return fmt.Errorf("deployment not Available: %d ready of %d", d.Status.ReadyReplicas, d.Status.Replicas)
		}
		available = time.Now()
		return nil
	})
	var routed time.Time
	if err == nil {
		r.tl.Add("Deployment Available")
		err = poll.Until(ctx, 0, func(ctx context.Context) error {
			if err := Routed(ctx, c); err != nil {
				return err
			}
			routed = time.Now()
			return nil
		})
	}
	if err == nil {
		r.tl.Add("Service routed")
		qctx, qcancel := context.WithTimeout(ctx, time.Minute)
		err = CreateQueues(qctx, c)
		qcancel()
	}
	if err == nil {
		err = poll.Until(ctx, 0, func(ctx context.Context) error { return RolledOut(ctx, c) })
	}
	if err == nil {
		select {
		case <-time.After(time.Until(available.Add(afterAvailable))):
		case <-ctx.Done():
			err = fmt.Errorf("bound %s reached: %w", freshBound, ctx.Err())
		}
	}
	calls := load.Stop()
	note := fmt.Sprintf("helm install returned at %s", Seconds(installed))
	if available.IsZero() {
		r.results.Set(r.v.Name, FreshBefore, Cell{Summary: Summarize(calls, start, start, time.Time{}), Note: note + "; never Available", Err: err})
		r.results.Set(r.v.Name, FreshAfter, Cell{Err: errors.New("the Deployment never turned Available")})
		t.Errorf("%s: %v", FreshBefore, err)
		r.explain(ctx, FreshBefore, start, calls, r.v.Library)
		return false
	}
	note += fmt.Sprintf("; Available at %s", Seconds(available.Sub(start)))
	if routed.IsZero() {
		routed = available
	} else {
		note += fmt.Sprintf("; the Service routes at %s", Seconds(routed.Sub(start)))
	}
	before := Summarize(calls, start, start, routed)
	after := Summarize(calls, start, routed, time.Time{})
	r.results.Set(r.v.Name, FreshBefore, Cell{Summary: before, Note: note})
	r.results.Set(r.v.Name, FreshAfter, Cell{Summary: after, Note: fmt.Sprintf("load until %s after Available", afterAvailable), Err: err})
	t.Logf("%s: %s\n%s", FreshBefore, note, before)
	t.Logf("%s: %s", FreshAfter, after)
	if err != nil {
		t.Errorf("%s: %v", FreshAfter, err)
	}
	if before.Failed > 0 || after.Failed > 0 {
		r.explain(ctx, "fresh install", start, calls, r.v.Library && after.Failed > 0)
	}
	if r.v.Library && after.Failed > 0 {
		t.Errorf("%s: %d failed admissions once the Service routed to a ready replica (target 0)", FreshAfter, after.Failed)
	}
	return err == nil
}

// disrupt runs one disruption under load: baseline seconds of load, act
// (the scenario's start), then done polled until it holds, then settle
// seconds of load; everything within bound.
func (r *variantRun) disrupt(ctx context.Context, name string, bound time.Duration, act func(context.Context) (string, error), done func(context.Context) error) {
	t, c := r.t, r.c
	if ctx.Err() != nil {
		r.results.Set(r.v.Name, name, Cell{Err: ctx.Err()})
		t.Errorf("%s: not run: %v", name, ctx.Err())
		return
	}
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	load, err := StartLoad(ctx, c, LoadOptions{Rate: loadRate, Duration: bound})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(baseline)
	start := time.Now()
	r.tl.Add("%s", name)
	note, err := act(ctx)
	var completed time.Duration
	if err == nil {
		err = poll.Until(ctx, 0, done)
		completed = time.Since(start)
	}
	if err == nil {
		r.tl.Add("%s completed", name)
		select {
		case <-time.After(settle):
		case <-ctx.Done():
			err = fmt.Errorf("bound %s reached: %w", bound, ctx.Err())
		}
	}
	calls := load.Stop()
	if err == nil {
		if note != "" {
			note += "; "
		}
		note += fmt.Sprintf("completed at %s, load until %s after", Seconds(completed), settle)
	}
	s := Summarize(calls, start, time.Time{}, time.Time{})
	r.results.Set(r.v.Name, name, Cell{Summary: s, Note: note, Err: err})
	t.Logf("%s: %s\n%s", name, note, s)
	if err != nil {
		t.Errorf("%s did not complete: %v", name, err)
	}
	if s.Failed > 0 || err != nil {
		r.explain(ctx, name, start, calls, r.v.Library)
	}
	if r.v.Library && s.Failed > 0 {
		t.Errorf("%s: %d failed admissions (target 0)", name, s.Failed)
	}
	r.logPods(ctx)
}

// explain logs what to line failures up against: the timeline (pods,
// endpoints, webhook configurations, the Secret) from the scenario's start
// to its last failure, the API server's log lines about Kueue's webhooks,
// and, for the library variant, the managers' logs.
func (r *variantRun) explain(ctx context.Context, name string, start time.Time, calls []Call, managerLogs bool) {
	t, c := r.t, r.c
	var first, last time.Time
	for _, call := range calls {
		if call.Err == "" {
			continue
		}
		if first.IsZero() {
			first = call.Sent
		}
		last = call.Sent.Add(call.Took)
	}
	if last.IsZero() { // no failure: explaining a scenario that did not complete
		first, last = start, time.Now()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s (%s), timeline from its start (%s) to its last failure (or its end):\n", name, r.v.Name, start.UTC().Format("15:04:05.000"))
	for _, e := range r.tl.Events() {
		if e.At.Before(start.Add(-baseline)) || e.At.After(last.Add(5*time.Second)) {
			continue
		}
		fmt.Fprintf(&b, "  %+6.1f s %s\n", e.At.Sub(start).Seconds(), e.What)
	}
	lines, err := realcluster.LogLines(c.APIServerLog(), "Failed calling webhook", first.Add(-time.Second), last.Add(time.Second), 10)
	if err != nil {
		fmt.Fprintf(&b, "kube-apiserver log: %v\n", err)
	}
	if len(lines) > 0 {
		fmt.Fprintf(&b, "kube-apiserver log (first lines about failed webhook calls):\n  %s\n", strings.Join(lines, "\n  "))
	}
	t.Log(b.String())
	if managerLogs {
		r.managerLogs()
	}
}

// managerLogs logs, for each manager pod, its state (restarts, why the
// last container ended) and the lines of its current and previous
// container's logs about certificates, errors and shutdowns.
func (r *variantRun) managerLogs() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pods, err := r.c.Client.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{LabelSelector: Selector})
	if err != nil {
		r.t.Logf("manager logs: %v", err)
		return
	}
	var b strings.Builder
	for _, p := range pods.Items {
		fmt.Fprintf(&b, "pod %s on %s, phase %s", p.Name, p.Spec.NodeName, p.Status.Phase)
		for _, cs := range p.Status.ContainerStatuses {
			fmt.Fprintf(&b, "; container %s ready=%v restarts=%d", cs.Name, cs.Ready, cs.RestartCount)
			if w := cs.State.Waiting; w != nil {
				fmt.Fprintf(&b, " waiting (%s)", w.Reason)
			}
			if l := cs.LastTerminationState.Terminated; l != nil {
				fmt.Fprintf(&b, ", last ended %s exit %d at %s", l.Reason, l.ExitCode, l.FinishedAt.UTC().Format("15:04:05"))
			}
		}
		b.WriteString("\n")
		seen := ""
		for _, prev := range []bool{true, false} {
			args := []string{"-n", Namespace, "logs", p.Name, "--all-containers", "--tail=-1"}
			which := "current container"
			if prev {
				args = append(args, "--previous")
				which = "previous container"
			}
			out, err := r.c.Kubectl(ctx, args...)
			if err != nil {
				if !prev {
					fmt.Fprintf(&b, "  %s: %v: %s\n", which, err, lastLines(out, 3))
				}
				continue
			}
			if out == seen { // a container waiting to restart shows its previous one's log
				continue
			}
			seen = out
			fmt.Fprintf(&b, "  %s (certificates, errors, shutdowns; the last 12 such lines):\n%s\n", which, indent(certLines(out, 12), "    "))
		}
	}
	r.t.Logf("manager pods and logs:\n%s", b.String())
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(l[max(0, len(l)-n):], " / ")
}

func indent(s, prefix string) string {
	if s == "" {
		return prefix + "(none)"
	}
	return prefix + strings.ReplaceAll(s, "\n", "\n"+prefix)
}

// logPods logs where the manager's pods run and which holds the lease.
func (r *variantRun) logPods(ctx context.Context) {
	pods, err := Pods(ctx, r.c)
	if err != nil {
		return
	}
	var s []string
	for _, p := range pods {
		s = append(s, fmt.Sprintf("%s on %s (%s)", p.Name, p.Spec.NodeName, p.Status.PodIP))
	}
	leader, _ := Leader(ctx, r.c)
	r.t.Logf("manager pods: %s; leader %s", strings.Join(s, ", "), leader)
}

// certLines keeps the lines of managers' logs about certificates
// (webhookcerts' logger, cert-controller's), errors, and shutdowns: at most
// max, the last ones.
func certLines(logs string, max int) string {
	var out []string
	for _, l := range strings.Split(logs, "\n") {
		for _, k := range []string{`"logger":"webhookcerts`, `cert-rotator`, `"level":"error"`, "hutdown", "Stopping and waiting", "signal"} {
			if strings.Contains(l, k) {
				if len(l) > 700 {
					l = l[:700] + "…"
				}
				out = append(out, l)
				break
			}
		}
	}
	if len(out) > max {
		out = out[len(out)-max:]
	}
	return strings.Join(out, "\n")
}
