package seedcluster_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kadmit/kadmit/internal/doctor"
	"github.com/kadmit/kadmit/test/cluster"
	"github.com/kadmit/kadmit/test/deploy/realcluster"
	"github.com/kadmit/kadmit/test/deploy/seedcluster"
	"github.com/kadmit/kadmit/test/poll"
)

// loadNamespace is where kadmit's admissions are made: a namespace without
// labels, so kadmit's webhooks match it.
const loadNamespace = "seed-load"

// kadmitAdmits dry-run creates the load's pod in loadNamespace and reports
// whether kadmit mutated it (false: the pod bypassed kadmit).
func kadmitAdmits(c *cluster.Cluster) func(context.Context) (bool, error) {
	return func(ctx context.Context) (bool, error) {
		p, err := c.Client.CoreV1().Pods(loadNamespace).Create(ctx, realcluster.LoadPod(loadNamespace), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			return false, err
		}
		return realcluster.Mutated(p), nil
	}
}

// TestSeed001SelectorCollision: in kadmit's namespace, Kueue and LWS with
// LWS's Service selecting control-plane: controller-manager only. Calls to
// LWS's webhook fail intermittently with the seed's x509 message through
// kube-proxy; kadmit's never fail (its Service selects its release's name
// and instance); doctor and watch name the collision and the fix.
func TestSeed001SelectorCollision(t *testing.T) {
	c := startCluster(t)
	rel := install(t, c, nil)
	ctx := ctxFor(t, 4*time.Minute)
	if err := seedcluster.EnsureNamespace(ctx, c.Client, loadNamespace, nil); err != nil {
		t.Fatal(err)
	}
	s := setUpSeed001(ctx, t, c, rel.Namespace)
	r := s.batches(ctx, t, 12, 4, 6, kadmitAdmits(c))
	t.Logf("seed 001: API server message (verbatim):\n%s", r.FirstX509)
	t.Logf("seed 001: %d batches on new connections: LWS %d calls, %d admitted, %d x509 (in %d batches), %d other errors; kadmit %d calls, %d failed, %d bypassed",
		r.Batches, r.LWSCalls, r.LWSOK, r.LWSX509, r.BatchesWithX509, r.LWSOther, r.KadmitCalls, r.KadmitFailed, r.KadmitBypassed)
	if r.LWSX509 == 0 || r.LWSOK == 0 {
		t.Errorf("LWS: %d x509 failures, %d admitted; want both (an intermittent failure)", r.LWSX509, r.LWSOK)
	}
	if r.LWSOther > 0 {
		t.Errorf("LWS: %d failures other than the seed's: %q", r.LWSOther, r.OtherErrors)
	}
	want := fmt.Sprintf(`failed calling webhook "%s": failed to call webhook: Post "https://%s:443/validate-leaderworkerset-x-k8s-io-v1-leaderworkerset?timeout=10s": tls: failed to verify certificate: x509: certificate is valid for %s, not %s`,
		lwsWebhook, s.lws.Host(), s.kueue.Host(), s.lws.Host())
	if !strings.Contains(r.FirstX509, want) {
		t.Errorf("API server message %q: want %q", r.FirstX509, want)
	}
	if r.KadmitFailed > 0 || r.KadmitBypassed > 0 {
		t.Errorf("kadmit: %d of %d calls failed, %d bypassed; want 0 and 0: %q", r.KadmitFailed, r.KadmitCalls, r.KadmitBypassed, r.KadmitErrors)
	}
	s.doctorNamesCollision(ctx, t)
	s.watchNamesCollision(ctx, t)
}

// TestSeed004SelfInterception: OpenKruise's failure for real, then kadmit's
// chart with default values through what triggers it: scaled to 0 and
// back, every pod deleted, each node's kubelet restarted. Its pods come
// back Ready every time (its webhooks exclude its own namespace), and
// doctor finds no self-interception on them.
func TestSeed004SelfInterception(t *testing.T) {
	c := startCluster(t)
	seed004Foreign(t, c)
	rel := install(t, c, nil)
	kadmitComesBack(t, c, rel, true)
}

// TestSeed004KadmitPrecreatedNamespace: the seed's trigger applied to
// kadmit: its namespace created beforehand without any label
// (namespace.create false), the rest default. Its webhooks exclude their
// own namespace by name (kubernetes.io/metadata.name, set by the API
// server), so scaling to 0 and back and deleting every pod still works.
func TestSeed004KadmitPrecreatedNamespace(t *testing.T) {
	c := startCluster(t)
	if err := seedcluster.EnsureNamespace(ctxFor(t, time.Minute), c.Client, realcluster.Namespace, nil); err != nil {
		t.Fatal(err)
	}
	rel := install(t, c, map[string]any{"namespace": map[string]any{"create": false}})
	ns, err := c.Client.CoreV1().Namespaces().Get(ctxFor(t, time.Minute), rel.Namespace, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kadmit's namespace %s, created beforehand, labels %v", ns.Name, ns.Labels)
	kadmitComesBack(t, c, rel, false)
}

// kadmitComesBack scales rel to 0 (every pod gone) and back, deletes every
// pod, and (kubelets) restarts each node's kubelet, checking each time
// that the pods come back Ready and kadmit admits again, that its
// ReplicaSets never report FailedCreate, and that doctor finds no
// self-interception on its webhooks.
func kadmitComesBack(t *testing.T, c *cluster.Cluster, rel *realcluster.Release, kubelets bool) {
	t.Helper()
	ctx := ctxFor(t, 4*time.Minute)
	if err := seedcluster.EnsureNamespace(ctx, c.Client, loadNamespace, nil); err != nil {
		t.Fatal(err)
	}
	d, err := rel.Deployment(ctx)
	if err != nil {
		t.Fatal(err)
	}
	replicas := *d.Spec.Replicas
	deps := c.Client.AppsV1().Deployments(rel.Namespace)
	scale := func(n int32) {
		t.Helper()
		patch := fmt.Sprintf(`{"spec":{"replicas":%d}}`, n)
		if _, err := deps.Patch(ctx, rel.FullName, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// allPods lists the release's pods, terminating ones included.
	allPods := func(ctx context.Context) ([]corev1.Pod, error) {
		l, err := c.Client.CoreV1().Pods(rel.Namespace).List(ctx, metav1.ListOptions{LabelSelector: rel.Selector()})
		if err != nil {
			return nil, err
		}
		return l.Items, nil
	}
	podNames := func() map[string]bool {
		t.Helper()
		pods, err := allPods(ctx)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]bool{}
		for _, p := range pods {
			out[p.Name] = true
		}
		return out
	}
	// comesBack waits until replicas pods, none of them in replaced, are
	// Ready, the release is rolled out and registered, and kadmit admits.
	comesBack := func(what string, since time.Time, replaced map[string]bool) {
		t.Helper()
		err := poll.Until(ctx, 2*time.Minute, func(ctx context.Context) error {
			pods, err := rel.Pods(ctx)
			if err != nil {
				return err
			}
			ready := 0
			for _, p := range pods {
				if replaced[p.Name] {
					return fmt.Errorf("pod %s not replaced yet", p.Name)
				}
				for _, cond := range p.Status.Conditions {
					if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
						ready++
					}
				}
			}
			if ready != int(replicas) {
				return fmt.Errorf("%d of %d pods Ready", ready, replicas)
			}
			return rel.WaitReady(ctx)
		})
		if err != nil {
			t.Fatalf("%s: kadmit not back: %v\n%s", what, err, podsDump(c))
		}
		ready := time.Since(since)
		// Between Ready and admitting: the EndpointSlice update and
		// kube-proxy's rule sync; what the API server said meanwhile is
		// logged.
		failed, firstErr := 0, ""
		if err := poll.Until(ctx, 30*time.Second, func(ctx context.Context) error {
			ok, err := kadmitAdmits(c)(ctx)
			if err == nil && !ok {
				err = fmt.Errorf("pod admitted without kadmit's mutation")
			}
			if err != nil {
				failed++
				if firstErr == "" {
					firstErr = err.Error()
				}
			}
			return err
		}); err != nil {
			t.Fatalf("%s: kadmit does not admit: %v", what, err)
		}
		t.Logf("seed 004, kadmit: %s: %d pods Ready %.1fs later, admitting %.1fs later (%d creations failed after Ready, first: %q)",
			what, replicas, ready.Seconds(), time.Since(since).Seconds(), failed, firstErr)
	}
	noPods := func() error {
		return poll.Until(ctx, 90*time.Second, func(ctx context.Context) error {
			pods, err := allPods(ctx)
			if err != nil {
				return err
			}
			if len(pods) > 0 {
				return fmt.Errorf("%d kadmit pods left (terminating included)", len(pods))
			}
			return nil
		})
	}
	// kubeletBack waits until the restarted kubelet of node has renewed
	// its Lease (so a new kubelet runs, not the old one's status).
	kubeletBack := func(node string, since time.Time) error {
		return poll.Until(ctx, time.Minute, func(ctx context.Context) error {
			l, err := c.Client.CoordinationV1().Leases("kube-node-lease").Get(ctx, node, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if l.Spec.RenewTime == nil || l.Spec.RenewTime.Time.Before(since) {
				return fmt.Errorf("%s's Lease not renewed since the restart", node)
			}
			return nil
		})
	}

	scale(0)
	if err := noPods(); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	scale(replicas)
	comesBack(fmt.Sprintf("scaled to 0 (every pod gone) and back to %d", replicas), began, nil)

	old := podNames()
	began = time.Now()
	if err := c.Client.CoreV1().Pods(rel.Namespace).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: rel.Selector()}); err != nil {
		t.Fatal(err)
	}
	comesBack("every pod deleted", began, old)

	for _, n := range c.Nodes {
		if !kubelets {
			break
		}
		began = time.Now()
		if err := n.RestartKubelet(ctx); err != nil {
			t.Fatalf("restart %s's kubelet: %v", n.Name, err)
		}
		if err := kubeletBack(n.Name, began); err != nil {
			t.Fatal(err)
		}
		if err := c.WaitNodesReady(ctx); err != nil {
			t.Fatal(err)
		}
		comesBack(n.Name+"'s kubelet restarted", began, nil)
	}

	evs, err := replicaSetEvents(ctx, c.Client, rel.Namespace, rel.FullName)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs {
		if strings.HasPrefix(e, "FailedCreate") {
			t.Errorf("kadmit's ReplicaSet: %s", e)
		}
	}
	if msg, err := replicaFailure(ctx, c.Client, rel.Namespace, rel.FullName); err != nil || msg != "" {
		t.Errorf("kadmit's ReplicaSet ReplicaFailure: %q %v", msg, err)
	}
	rep := doctorJSON(ctx, t, c, "doctor", rel.FullName)
	if len(rep.Webhooks) == 0 {
		t.Fatalf("doctor %s: no webhook reported", rel.FullName)
	}
	for _, w := range rep.Webhooks {
		if w.Has(doctor.IDSelfInterception) {
			t.Errorf("doctor: kadmit's %s intercepts its own pods: %+v", w.Webhook, w.ByID(doctor.IDSelfInterception))
		}
	}
}

// TestSeed000RegisteredBeforeReady: Kueue's failure for real, then kadmit
// installed under a load started at the same moment: no creation fails
// while its pods start (it registers only once the API server can call
// it), and the time from helm install to the first pod it admits.
func TestSeed000RegisteredBeforeReady(t *testing.T) {
	c := startCluster(t)
	seed000Foreign(t, c)
	ctx := ctxFor(t, 4*time.Minute)
	if err := seedcluster.EnsureNamespace(ctx, c.Client, loadNamespace, nil); err != nil {
		t.Fatal(err)
	}
	load, err := realcluster.StartLoad(ctx, c, realcluster.LoadOptions{Namespace: loadNamespace, Rate: 10, Duration: 3 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer load.Stop()
	began := time.Now()
	// The first admitted pod, seen by a prober of its own (every 100 ms,
	// at most 3 min): the load counts, this one times.
	type first struct {
		at     time.Duration
		failed int
		errs   []string
	}
	firstc := make(chan first, 1)
	go func() {
		var f first
		admits := kadmitAdmits(c)
		for time.Since(began) < 3*time.Minute {
			ok, err := admits(ctx)
			if err != nil {
				f.failed++
				if len(f.errs) < 5 {
					f.errs = append(f.errs, err.Error())
				}
			} else if ok {
				f.at = time.Since(began)
				break
			}
			if ctx.Err() != nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		firstc <- f
	}()
	rel, err := realcluster.Install(ctx, c, realcluster.InstallOptions{})
	if err != nil {
		t.Fatalf("%v\n%s", err, podsDump(c))
	}
	readyAt := time.Since(began)
	f := <-firstc
	if f.at == 0 {
		t.Fatalf("no pod admitted by kadmit within 3 min of helm install (%d prober failures: %q)", f.failed, f.errs)
	}
	during := load.Stop()
	// After the first admission every pod goes through kadmit.
	after, err := realcluster.StartLoad(ctx, c, realcluster.LoadOptions{Namespace: loadNamespace, Rate: 10, Duration: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	<-after.Done()
	steady := after.Result()
	pods, err := rel.Pods(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("seed 000, kadmit: helm install -> first admitted pod %.1fs; -> release Ready and registered %.1fs (%d pods)", f.at.Seconds(), readyAt.Seconds(), len(pods))
	t.Logf("seed 000, kadmit: load from helm install on: %s", during)
	t.Logf("seed 000, kadmit: prober from helm install on: %d failed", f.failed)
	t.Logf("seed 000, kadmit: load after the first admission: %s", steady)
	// Registered only once a pod was Ready (both times have one-second
	// resolution in the API, so equal passes).
	mwc, err := c.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, rel.FullName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var firstReady time.Time
	for _, p := range pods {
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue && (firstReady.IsZero() || cond.LastTransitionTime.Time.Before(firstReady)) {
				firstReady = cond.LastTransitionTime.Time
			}
		}
	}
	t.Logf("seed 000, kadmit: first pod Ready %s, MutatingWebhookConfiguration %s created %s", firstReady.UTC().Format(time.RFC3339), mwc.Name, mwc.CreationTimestamp.UTC().Format(time.RFC3339))
	if firstReady.IsZero() || mwc.CreationTimestamp.Time.Before(firstReady) {
		t.Errorf("kadmit registered at %s, before any of its pods was Ready (%s)", mwc.CreationTimestamp.UTC().Format(time.RFC3339), firstReady.UTC().Format(time.RFC3339))
	}
	if during.Failed > 0 || f.failed > 0 {
		t.Errorf("%d load creations and %d probes failed while kadmit started; want 0 (%q)", during.Failed, f.failed, f.errs)
	}
	if steady.Failed > 0 || steady.Bypassed > 0 || steady.Total == 0 {
		t.Errorf("after the first admission: %s; want every pod admitted by kadmit", steady)
	}
	if during.Total == 0 {
		t.Errorf("the load made no creation while kadmit started")
	}
}
