package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/kadmit/kadmit/test/cluster"
	"github.com/kadmit/kadmit/test/deploy/chart"
	"github.com/kadmit/kadmit/test/seed"

	"github.com/kadmit/kadmit/test/poll"
)

// run is the demo inside the private namespaces; it returns the exit code.
func run(o options) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	d := &demo{o: o, began: time.Now()}
	err := d.run(ctx)
	if d.c != nil {
		stopped := time.Now()
		d.c.Stop()
		d.say("Stopped the cluster (every process ended by PID, the namespaces gone) in %s.", time.Since(stopped).Round(100*time.Millisecond))
	}
	if err != nil {
		d.say("\ndemo-cluster: %v", err)
		return 1
	}
	if d.failed > 0 {
		d.say("\n%d step(s) did not show what they should (above). Whole run %s.", d.failed, time.Since(d.began).Round(time.Second))
		return 1
	}
	d.say("\nEvery step showed what it should. Whole run (inside the namespaces) %s.", time.Since(d.began).Round(time.Second))
	return 0
}

type demo struct {
	o      options
	began  time.Time
	c      *cluster.Cluster
	failed int
}

func (d *demo) say(format string, args ...any) { fmt.Printf(format+"\n", args...) }

// section starts a part of the demo with the time since the start.
func (d *demo) section(format string, args ...any) {
	fmt.Printf("\n[%3.0fs] "+format+"\n", append([]any{time.Since(d.began).Seconds()}, args...)...)
}

// check reports one expectation; a miss is counted, not fatal, so the demo
// shows everything it can.
func (d *demo) check(ok bool, format string, args ...any) {
	if ok {
		d.say("  OK    "+format, args...)
		return
	}
	d.failed++
	d.say("  MISS  "+format, args...)
}

func (d *demo) run(ctx context.Context) error {
	kadmitArchive, foreignArchive, err := archives()
	if err != nil {
		return err
	}
	d.section("Starting a real cluster: kube-apiserver, etcd, controller-manager and scheduler, and two nodes each with")
	d.say("a kubelet, kube-proxy (iptables) and containerd + runc, in private namespaces on this machine ...")
	opts := cluster.Options{Nodes: 2, Images: []string{kadmitArchive, foreignArchive}, Timeout: 2 * time.Minute}
	if d.o.verbose {
		opts.Log = lineWriter{}
	}
	started := time.Now()
	if d.c, err = cluster.Start(ctx, opts); err != nil {
		return err
	}
	d.say("  %d nodes Ready in %s; API server %s", len(d.c.Nodes), time.Since(started).Round(100*time.Millisecond), d.c.Config.Host)
	if os.Getenv(cluster.EnvKeep) == "1" {
		d.say("  work directory (kept, %s=1): %s; kubectl --kubeconfig %s (from inside the namespace only)", cluster.EnvKeep, d.c.WorkDir, d.c.Kubeconfig)
	}
	d.kubectl(ctx, "get", "nodes", "-o", "wide")

	if err := d.install(ctx); err != nil {
		return err
	}
	if err := d.seedTable(ctx); err != nil {
		return err
	}
	if err := d.runningPod(ctx); err != nil {
		return err
	}
	if err := d.realNodes(ctx); err != nil {
		return err
	}
	if err := d.selfInterception(ctx); err != nil {
		return err
	}
	if err := d.kadmitRestarts(ctx); err != nil {
		return err
	}
	if err := d.selectorCollision(ctx); err != nil {
		return err
	}
	return nil
}

// kubectl prints the cluster's kubectl output, indented.
func (d *demo) kubectl(ctx context.Context, args ...string) string {
	d.say("  $ kubectl %s", strings.Join(args, " "))
	out, err := d.c.Kubectl(ctx, args...)
	d.say("%s", indent(out, "    "))
	if err != nil {
		d.say("    (kubectl: %v)", err)
	}
	return out
}

// seedTable runs examples/seed through the chart's kadmit, as make demo does
// against the apiserver-only control plane.
func (d *demo) seedTable(ctx context.Context) error {
	root, err := chart.RepoRoot()
	if err != nil {
		return err
	}
	d.section("The seed manifests (examples/seed) through the chart's kadmit, as `make demo` applies them (the rows")
	d.say("that create a Node without a kubelet and post its status by hand are left out: here real kubelets post")
	d.say("their nodes' status through kadmit, shown below, and the node lifecycle controller would race the hand-made one):")
	var rows [][]string
	var nodes []string
	// A client of its own so that the API server's warnings (which carry
	// kadmit's) are printed after the table rather than logged.
	warnings := &warningLog{}
	cfg := rest.CopyConfig(d.c.Config)
	cfg.WarningHandler = warnings
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	env := &seed.Env{Client: client, Dir: seed.Dir(root), Namespace: metav1.NamespaceDefault, Created: func(kind, _, name string) {
		if kind == "Node" {
			nodes = append(nodes, name)
		}
	}}
	for _, sc := range seed.Scenarios() {
		if !strings.HasPrefix(sc.Name, "create pod") && !strings.Contains(sc.Name, "bad-ratio") {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		r := sc.Run(sctx, env)
		cancel()
		verdict := "MATCH"
		if !r.Matched() {
			verdict = "MISMATCH"
			d.failed++
		}
		rows = append(rows, []string{sc.Name, sc.Expected, oneLine(r.Got, 70), verdict})
		for _, p := range r.Problems {
			rows = append(rows, []string{"", "", "  " + oneLine(p, 90), ""})
		}
	}
	// A Node object without a kubelet would take pods the scheduler
	// places (bad-ratio is denied, so this is a safety net).
	for _, n := range nodes {
		_ = d.c.Client.CoreV1().Nodes().Delete(ctx, n, metav1.DeleteOptions{})
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  STEP\tEXPECTED\tAPI SERVER ANSWERED\tRESULT")
	for _, r := range rows {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", r[0], r[1], r[2], r[3])
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, w := range warnings.list() {
		d.say("  warning kadmit sent back through the API server: %s", w)
	}
	return nil
}

// warningLog collects the Warning headers the API server returns.
type warningLog struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warningLog) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, text)
}

func (w *warningLog) list() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.msgs...)
}

// realNodes shows node-overcommit on the kubelets' own status updates:
// each kubelet sends its raw status, kadmit doubles the allocatable CPU
// and keeps the raw values in an annotation.
func (d *demo) realNodes(ctx context.Context) error {
	d.section("node-overcommit on the real kubelets' status updates: the nodes registered before kadmit was installed, and a")
	d.say("kubelet posts its full status only when it changes or every 5 minutes; restarting each kubelet (as an upgrade")
	d.say("would) makes it post its raw status at once, through kadmit:")
	for _, n := range d.c.Nodes {
		if err := n.RestartKubelet(ctx); err != nil {
			return fmt.Errorf("restart %s's kubelet: %w", n.Name, err)
		}
	}
	err := waitFor(ctx, 45*time.Second, func() (bool, error) {
		for _, n := range d.c.Nodes {
			node, err := d.c.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			if node.Annotations[seed.AnnotationRaw] == "" {
				return false, fmt.Errorf("%s has no %s annotation yet", n.Name, seed.AnnotationRaw)
			}
		}
		return true, nil
	})
	d.check(err == nil, "every node's status went through kadmit (%v)", errOr(err, seed.AnnotationRaw+" set"))
	d.kubectl(ctx, "get", "nodes", "-o", `custom-columns=NAME:.metadata.name,CPU-CAPACITY:.status.capacity.cpu,CPU-ALLOCATABLE:.status.allocatable.cpu,RAW:.metadata.annotations.kadmit\.io/raw-allocatable`)
	return nil
}

// runningPod shows a mutated pod that really runs: kadmit's lifespan policy
// gives it its tolerations at admission, then a kubelet starts it.
func (d *demo) runningPod(ctx context.Context) error {
	d.section("A pod that really runs (pause image, imported into both nodes' containerd), admitted and mutated by kadmit:")
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "lifespan-running", Namespace: "default", Labels: map[string]string{seed.LifespanLabel: "10"}},
		Spec: corev1.PodSpec{
			Containers:                    []corev1.Container{{Name: "pause", Image: cluster.PauseRef, ImagePullPolicy: corev1.PullNever}},
			TerminationGracePeriodSeconds: ptr.To[int64](1),
		},
	}
	created, err := d.c.Client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create pod lifespan-running: %w", err)
	}
	n := 0
	for _, t := range created.Spec.Tolerations {
		if t.Key == seed.LifespanKey {
			n++
		}
	}
	d.check(n == 5, "kadmit added %d %s tolerations (asked for 10 days: 10..14)", n, seed.LifespanKey)
	err = waitFor(ctx, 60*time.Second, func() (bool, error) {
		p, err := d.c.Client.CoreV1().Pods("default").Get(ctx, "lifespan-running", metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodRunning, err
	})
	d.check(err == nil, "the pod is Running on a real node (%v)", errOr(err, "kubelet started it"))
	d.kubectl(ctx, "get", "pod", "lifespan-running", "-o", "wide")
	return nil
}

// waitFor waits (test/poll, the one poller) until fn returns true, for
// at most limit; the error names the last condition fn reported.
func waitFor(parent context.Context, limit time.Duration, fn func() (bool, error)) error {
	err := poll.Until(parent, limit, func(context.Context) error {
		ok, err := fn()
		switch {
		case ok:
			return nil
		case err == nil:
			return errors.New("not yet")
		}
		return err
	})
	if err != nil && parent.Err() != nil {
		return fmt.Errorf("interrupted or out of time (--timeout): %w", err)
	}
	return err
}

func errOr(err error, ok string) string {
	if err != nil {
		return err.Error()
	}
	return ok
}

func indent(s, prefix string) string {
	s = strings.TrimRight(s, "\n")
	if s == "" {
		return prefix + "(no output)"
	}
	return prefix + strings.ReplaceAll(s, "\n", "\n"+prefix)
}

// oneLine keeps a table cell on one line and at most n runes.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}
