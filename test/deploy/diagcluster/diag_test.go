package diagcluster

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kadmit/kadmit/pkg/webhookcerts"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kadmit/kadmit/test/cluster"
	"github.com/kadmit/kadmit/test/deploy/realcluster"
	"github.com/kadmit/kadmit/test/poll"
	"github.com/kadmit/kadmit/test/watchprobe"
)

// env is the cluster with everything the two parts share.
type env struct {
	c        *cluster.Cluster
	rel      *realcluster.Release
	probe    *watchprobe.Probe
	classes  []diagClass
	backends []*backend
	products *products
	argo     *argo
}

// TestWatchOnRealCluster: one cluster, kadmit's chart with the watch,
// the healthy controllers and one backend per failure class; first the
// false-alarm run, then the detection of each class.
func TestWatchOnRealCluster(t *testing.T) {
	e := setup(t)
	begin := time.Now()
	t.Run("NoFalseAlarms", func(t *testing.T) { e.noFalseAlarms(t) })
	// The injectors and Argo have done their part; the detection run
	// measures the watch alone.
	e.argo.l.stop()
	e.products.certCtl.stop()
	e.products.injector.stop()
	var rows []watchprobe.Detection
	t.Run("Detection", func(t *testing.T) { rows = e.detection(t) })
	// The faults were injected into other webhooks: kadmit's own stayed
	// healthy throughout.
	for _, ev := range e.probe.Events.Matching(begin, watchprobe.OnConfig(e.rel.FullName, "Warning", "")) {
		t.Errorf("Warning Event on kadmit's configuration: %s", ev)
	}
	if len(rows) > 0 {
		t.Logf("detection on the real cluster, from the fault in effect (rollout: from the injecting call to the first faulty pod a ready endpoint; metric: kadmit_watch_findings; event: Warning <ID>; alert: the chart's expression true, for: ignored; resolved: Normal <ID>Resolved, cleared: finding and alert gone, both from the repair):\n%s", watchprobe.Table(rows))
	}
}

// setup starts the cluster and, at once, kadmit's install and every
// fixture; it returns when the watch leads and reports every webhook
// healthy.
func setup(t *testing.T) *env {
	began := time.Now()
	c := startCluster(t)
	ctx := ctxFor(t, 8*time.Minute)
	e := &env{c: c}
	events := watchprobe.StartEventRecorder(t, c.Client, "default", 0)
	// The chart's Role for the Secrets the watch may read (KD411) goes
	// into lwsNS: it must exist before the install.
	if err := ensureNamespace(ctx, c, lwsNS, ignored); err != nil {
		t.Fatal(err)
	}
	var (
		installErr error
		installed  = make(chan struct{})
	)
	go func() {
		defer close(installed)
		e.rel, installErr = realcluster.Install(ctx, c, realcluster.InstallOptions{Values: watchValues(), Timeout: 5 * time.Minute})
	}()
	var err error
	if e.products, err = createProducts(ctx, t, c); err != nil {
		t.Fatal(err)
	}
	km, kv := kueueConfigs()
	var ms []argoManifest
	for _, o := range []any{km, kv, lwsConfig()} {
		m, err := manifestOf(o)
		if err != nil {
			t.Fatal(err)
		}
		ms = append(ms, m)
	}
	e.argo = startArgo(t, c, ms...)
	e.products.startInjectors(t)
	e.classes = e.faultClasses()
	e.backends = make([]*backend, len(e.classes))
	for i, dc := range e.classes {
		if !dc.onNode2 {
			e.backends[i] = e.makeBackend(ctx, t, dc, c.Nodes[0].Name)
		}
	}
	<-installed
	if installErr != nil {
		t.Fatalf("%v\n%s", installErr, podsDump(c))
	}
	t.Logf("kadmit installed with the watch, Ready %s after the start", time.Since(began).Round(time.Millisecond))
	if err := waitBackendsReady(ctx, c, e.backends); err != nil {
		t.Fatalf("%v\n%s", err, podsDump(c))
	}
	for _, d := range [][2]string{{kueueNS, "kueue-controller-manager"}, {lwsNS, "lws-controller-manager"}} {
		if err := waitRolledOut(ctx, c, d[0], d[1], 3*time.Minute); err != nil {
			t.Fatalf("%v\n%s", err, podsDump(c))
		}
	}
	// kadmit's configurations, as its registrar wrote them, join Argo's
	// repository: a platform that manages everything from Git.
	for _, get := range []func() (any, error){
		func() (any, error) {
			o, err := c.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, e.rel.FullName, metav1.GetOptions{})
			if o != nil {
				o.APIVersion, o.Kind = "admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration"
			}
			return o, err
		},
		func() (any, error) {
			o, err := c.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, e.rel.FullName, metav1.GetOptions{})
			if o != nil {
				o.APIVersion, o.Kind = "admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration"
			}
			return o, err
		},
	} {
		o, err := get()
		if err != nil {
			t.Fatal(err)
		}
		m, err := manifestOf(o)
		if err != nil {
			t.Fatal(err)
		}
		e.argo.add(m)
	}

	rules, err := chartRules(watchValues())
	if err != nil {
		t.Fatal(err)
	}
	alerts, err := watchprobe.NewEvaluator(rules, watchprobe.EvaluatorOptions{})
	if err != nil {
		t.Fatal(err)
	}
	scr := watchprobe.StartScraper(t, watchTargets(c, e.rel), watchprobe.ScraperOptions{})
	scr.Observe(alerts.Add)
	e.probe = &watchprobe.Probe{Scraper: scr, Events: events, Alerts: alerts, Explain: e.doctor}
	t.Logf("alert expressions of the chart's PrometheusRule (group %s): %d rules", watchprobe.AlertGroup, len(rules))

	// Every webhook healthy in the watch's eyes.
	err = poll.Until(ctx, 2*time.Minute, func(context.Context) error { return e.allHealthy(t) })
	if err != nil {
		t.Fatalf("webhooks healthy in the watch's metrics: %v\n%s", err, podsDump(c))
	}
	t.Logf("setup: kadmit, the Kueue-like and LWS-like controllers and the fault backends on node1 healthy in the watch's metrics %s after the start",
		time.Since(began).Round(time.Millisecond))
	return e
}

// makeBackend creates the healthy backend of class dc on node.
func (e *env) makeBackend(ctx context.Context, t *testing.T, dc diagClass, node string) *backend {
	t.Helper()
	b := newBackend(e.c, t, dc.Key, node)
	if err := b.create(ctx, t); err != nil {
		t.Fatal(err)
	}
	if dc.prepare != nil {
		if err := dc.prepare(ctx, t, b); err != nil {
			t.Fatalf("%s: %v", dc.Key, err)
		}
	}
	return b
}

// doctor runs `kadmit doctor` on the subjects' configurations in a watch
// pod (kadmit's image, the watch's read-only ServiceAccount), for a class
// the watch missed: doctor's one-shot verdict next to the watch's.
func (e *env) doctor(ctx context.Context, subjects []watchprobe.Subject) string {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pods, err := e.c.Client.CoreV1().Pods(e.rel.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=kadmit-watch"})
	if err != nil {
		return fmt.Sprintf("kadmit doctor: list watch pods: %v", err)
	}
	pod := ""
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil && podReady(&p) {
			pod = p.Name
		}
	}
	if pod == "" {
		return "kadmit doctor: no ready watch pod"
	}
	args := []string{"-n", e.rel.Namespace, "exec", pod, "--", "/kadmit", "doctor"}
	seen := map[string]bool{}
	for _, s := range subjects {
		if !seen[s.Configuration] {
			seen[s.Configuration] = true
			args = append(args, s.Configuration)
		}
	}
	out, err := e.c.Kubectl(ctx, args...)
	const maxOut = 8 << 10
	if len(out) > maxOut {
		out = out[:maxOut] + "\n[truncated]"
	}
	return fmt.Sprintf("kadmit doctor in pod %s (exit: %v):\n%s", pod, err, out)
}

// allHealthy: every configuration of the cluster tracked with all its
// ready endpoints handshaken, no warning or error finding, no alert.
func (e *env) allHealthy(t *testing.T) error {
	var errs []error
	add := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	add(healthy(t, e.probe, e.rel.FullName, 2, 3))
	add(healthy(t, e.probe, kueueMCfg, 1, kueueReplica))
	add(healthy(t, e.probe, kueueVCfg, 1, kueueReplica))
	add(healthy(t, e.probe, lwsVCfg, 1, lwsReplicas))
	for _, b := range e.backends {
		if b != nil {
			add(healthy(t, e.probe, b.name, 1, backendReplicas))
		}
	}
	return errors.Join(errs...)
}

// ---------------------------------------------------------------------------
// NoFalseAlarms.

// churnCycles is how often the churn cycle runs.
const churnCycles = 3

// noFalseAlarms runs the churn and checks every scrape, Event and alert
// expression of its window.
//
// What it compresses: a busy platform's half hour sees its GitOps
// controller reconcile every configuration about 10 times (Argo CD's
// default 3-minute period), a deploy of each controller (rolling
// restarts), a node upgrade (a drain) and, at worst, certificate renewals.
// One cycle here is that half hour: kadmit's serving rotation, its CA
// rotation, rolling restarts of kadmit, the Kueue-like and LWS-like
// controllers and the watch, and a drain of node2, back to back, while Argo
// re-applies every 2 s (90 times faster: each 2 s stands for 3 minutes) and
// the injectors re-check every second. churnCycles cycles: at least 30
// minutes each; the log says how many simulated minutes the re-applies
// amount to.
func (e *env) noFalseAlarms(t *testing.T) {
	ctx := ctxFor(t, 8*time.Minute)
	c, rel := e.c, e.rel
	argoBefore, certBefore, injBefore := e.argo.l.runs.Load(), e.products.certCtl.writes.Load(), e.products.injector.writes.Load()
	start := time.Now()
	step := func(what string, f func() error) {
		t.Helper()
		at := time.Now()
		if err := f(); err != nil {
			t.Fatalf("%s: %v\n%s", what, err, podsDump(c))
		}
		t.Logf("%s: %s", what, time.Since(at).Round(time.Millisecond))
	}
	for cycle := range churnCycles {
		step(fmt.Sprintf("cycle %d: kadmit serving-certificate rotation", cycle+1), func() error { return rotate(ctx, c, rel, "serving") })
		step(fmt.Sprintf("cycle %d: kadmit CA rotation", cycle+1), func() error { return rotate(ctx, c, rel, "ca") })
		step(fmt.Sprintf("cycle %d: rolling restart of kadmit", cycle+1), func() error {
			if out, err := c.Kubectl(ctx, "-n", rel.Namespace, "rollout", "restart", "deployment/"+rel.FullName); err != nil {
				return fmt.Errorf("%w: %s", err, out)
			}
			time.Sleep(time.Second) // the new generation observed
			return rel.WaitReady(ctx)
		})
		// The controllers and the watch itself: a restart also spreads
		// the pods over both nodes again after the previous drain (the
		// watch's leader hands over, the next drain evicts pods again).
		for _, d := range [][2]string{{kueueNS, "kueue-controller-manager"}, {lwsNS, "lws-controller-manager"}, {rel.Namespace, rel.FullName + "-watch"}} {
			step(fmt.Sprintf("cycle %d: rolling restart of %s/%s", cycle+1, d[0], d[1]), func() error {
				if out, err := c.Kubectl(ctx, "-n", d[0], "rollout", "restart", "deployment/"+d[1]); err != nil {
					return fmt.Errorf("%w: %s", err, out)
				}
				time.Sleep(time.Second) // the new generation observed
				return waitRolledOut(ctx, c, d[0], d[1], 3*time.Minute)
			})
		}
		step(fmt.Sprintf("cycle %d: drain of node2 (cordon, evict every pod, uncordon)", cycle+1), func() error { return e.drain(ctx, t, c.Nodes[1].Name) })
	}
	step("settle: every webhook healthy again, then one more handshake round", func() error {
		if err := poll.Until(ctx, 2*time.Minute, func(context.Context) error { return e.allHealthy(t) }); err != nil {
			return err
		}
		time.Sleep(watchHandshakeInterval + time.Second)
		return nil
	})
	end := time.Now()
	e.checkQuiet(t, start, end)

	argoRuns := e.argo.l.runs.Load() - argoBefore
	t.Logf("churn: %s; Argo re-applied the %d configurations %d times (at Argo CD's 3-minute period: %d simulated minutes); %s; %s; %s",
		end.Sub(start).Round(time.Second), len(e.argo.manifests), argoRuns, argoRuns*3, e.argo.l, e.products.certCtl, e.products.injector)
	if n := e.argo.l.errs.Load(); n > 0 {
		t.Errorf("Argo's server-side apply (field manager %s, no force) failed %d times: %v", argoManager, n, e.argo.l.firstErr())
	}
	if argoRuns*3 < 30*churnCycles {
		t.Errorf("Argo re-applied %d times: fewer than %d simulated minutes", argoRuns, 30*churnCycles)
	}
	// The re-applies never touched a caBundle: the injectors had nothing
	// to repair during the churn.
	if n := e.products.certCtl.writes.Load() - certBefore; n > 0 {
		t.Errorf("the Kueue-like certificate controller re-injected a caBundle %d times during the churn", n)
	}
	if n := e.products.injector.writes.Load() - injBefore; n > 0 {
		t.Errorf("cainjector re-injected a caBundle %d times during the churn", n)
	}
	e.checkOwners(ctx, t)
}

// checkQuiet fails t for every warning or error finding, Warning Event on
// a webhook configuration and alert in [start, end]: a per-webhook alert's
// expression true at any scrape, a cluster-wide one (the watch down)
// firing by its for:.
func (e *env) checkQuiet(t *testing.T, start, end time.Time) {
	scrapes := e.probe.Scraper.AllBetween(start, end)
	if len(scrapes) < int(end.Sub(start)/watchprobe.DefaultScrapeInterval)/2 {
		t.Errorf("only %d scrapes of the watch in %s", len(scrapes), end.Sub(start).Round(time.Second))
	}
	bad, failed, noLeader := 0, 0, 0
	var gap, longest time.Duration
	var gapFrom time.Time
	var times []time.Time
	for _, sc := range scrapes {
		if sc.Err != nil {
			failed++
		}
		if leaders(sc) != 1 {
			noLeader++
			if gapFrom.IsZero() {
				gapFrom = sc.At
			}
			gap = sc.At.Sub(gapFrom)
		} else {
			gapFrom = time.Time{}
			gap = 0
		}
		longest = max(longest, gap)
		// The alerts are evaluated at every scrape with an answer (a
		// scrape without one adds no sample).
		if slices.ContainsFunc(sc.Targets, func(ts watchprobe.TargetScrape) bool { return ts.Err == nil }) {
			times = append(times, sc.At)
		}
		if fs := watchprobe.Findings(sc, "", "warning", "error"); len(fs) > 0 {
			if bad++; bad <= 5 {
				t.Errorf("false alarm at %s (%s into the churn): %v", sc.At.Format("15:04:05.000"), sc.At.Sub(start).Round(time.Millisecond), fs)
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d scrapes showed a warning or error finding on the healthy cluster", bad, len(scrapes))
	}
	// A leader handover (a drain evicting the leader) leaves no leader for
	// about the lease's duration; more is the watch not leading.
	if longest > 3*watchLeaseDuration {
		t.Errorf("no watch replica led for %s (longest stretch); the lease is %s", longest.Round(time.Millisecond), watchLeaseDuration)
	}
	for _, ev := range e.probe.Events.Matching(start, watchprobe.OnConfig("", "Warning", "")) {
		if ev.At.After(end) {
			continue
		}
		t.Errorf("false alarm: Warning Event %s", ev)
	}
	fired := map[string]string{}
	for _, r := range e.probe.Alerts.Rules {
		st, err := e.probe.Alerts.Stretches(r, times)
		if err != nil {
			t.Fatal(err)
		}
		var longestTrue time.Duration
		for _, s := range st {
			d := s.To.Sub(s.From)
			longestTrue = max(longestTrue, d)
			_, perWebhook := s.Labels["configuration"]
			switch {
			case perWebhook:
				t.Errorf("false alarm: alert %s true from %s to %s for %v", r.Name, s.From.Format("15:04:05.000"), s.To.Format("15:04:05.000"), s.Labels)
			case s.Fires(r):
				t.Errorf("false alarm: alert %s fired (true %s, for: %s) from %s", r.Name, d.Round(time.Millisecond), r.For, s.From.Format("15:04:05.000"))
			}
		}
		if len(st) > 0 {
			fired[r.Name] = fmt.Sprintf("true %d times, longest %s (for: %s)", len(st), longestTrue.Round(time.Millisecond), r.For)
		}
	}
	t.Logf("no false alarm check: %d scrapes over %s (%d with a target failing, %d without a leader, longest %s), %d alert expressions evaluated at each; expressions true: %v",
		len(scrapes), end.Sub(start).Round(time.Second), failed, noLeader, longest.Round(time.Millisecond), len(e.probe.Alerts.Rules), fired)
}

// checkOwners: after the churn, no configuration's caBundle is owned by
// Argo's field manager, and each has the owners expected.
func (e *env) checkOwners(ctx context.Context, t *testing.T) {
	reg := e.c.Client.AdmissionregistrationV1()
	check := func(kind, name string, mf []metav1.ManagedFieldsEntry, want string) {
		owners := caBundleOwners(mf)
		names := slices.Sorted(maps.Keys(owners))
		t.Logf("%s %s: caBundle owned by %v", kind, name, names)
		if owners[argoManager] {
			t.Errorf("%s %s: %s owns caBundle", kind, name, argoManager)
		}
		if want != "" && !owners[want] {
			t.Errorf("%s %s: caBundle not owned by %s (owners %v)", kind, name, want, names)
		}
	}
	for _, n := range []string{e.rel.FullName, kueueMCfg} {
		m, err := reg.MutatingWebhookConfigurations().Get(ctx, n, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		want := kueueManager
		if n == e.rel.FullName {
			want = ""
		}
		check("MutatingWebhookConfiguration", n, m.ManagedFields, want)
	}
	for _, n := range []string{e.rel.FullName, kueueVCfg, lwsVCfg} {
		v, err := reg.ValidatingWebhookConfigurations().Get(ctx, n, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]string{kueueVCfg: kueueManager, lwsVCfg: cainjectorManager}[n]
		check("ValidatingWebhookConfiguration", n, v.ManagedFields, want)
	}
}

// drain cordons node, evicts every pod on it (kubectl drain: the
// Eviction API, honouring PodDisruptionBudgets), uncordons it and waits
// until every Deployment is whole again.
func (e *env) drain(ctx context.Context, t *testing.T, node string) error {
	pods, err := e.c.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return err
	}
	per := map[string]int{}
	for _, p := range pods.Items {
		per[p.Namespace]++
	}
	t.Logf("pods on %s before the drain, by namespace: %v", node, per)
	out, err := e.c.Kubectl(ctx, "drain", node, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=180s")
	if uout, uerr := e.c.Kubectl(context.Background(), "uncordon", node); uerr != nil {
		return fmt.Errorf("uncordon %s: %w: %s", node, uerr, uout)
	}
	if err != nil {
		return fmt.Errorf("drain %s: %w: %s", node, err, out)
	}
	if err := e.rel.WaitReady(ctx); err != nil {
		return err
	}
	for _, d := range [][2]string{{kueueNS, "kueue-controller-manager"}, {lwsNS, "lws-controller-manager"}} {
		if err := waitRolledOut(ctx, e.c, d[0], d[1], 3*time.Minute); err != nil {
			return err
		}
	}
	return nil
}

// rotate asks kadmit for a rotation (the kadmit.io/rotate annotation on its
// Secret) and waits, at most 90 s, until it is complete as the API server
// sees it: the annotation consumed, a new serving certificate, for "ca" a
// new CA alone in ca.crt and in every caBundle, and every ready replica
// serving the Secret's certificate, verified against ca.crt.
func rotate(ctx context.Context, c *cluster.Cluster, rel *realcluster.Release, kind string) error {
	secrets := c.Client.CoreV1().Secrets(rel.Namespace)
	name := rel.FullName + "-tls"
	s, err := secrets.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	origCA, origCrt := s.Data["ca.crt"], s.Data[corev1.TLSCertKey]
	patch := fmt.Appendf(nil, `{"metadata":{"annotations":{"kadmit.io/rotate":%q}}}`, kind)
	if _, err := secrets.Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return err
	}
	return poll.Until(ctx, 90*time.Second, func(ctx context.Context) error {
		s, err := secrets.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if _, ok := s.Annotations["kadmit.io/rotate"]; ok {
			return errors.New("annotation still set")
		}
		if bytes.Equal(s.Data[corev1.TLSCertKey], origCrt) {
			return errors.New("tls.crt unchanged")
		}
		cas, err := webhookcerts.ParseCertificates(s.Data["ca.crt"])
		if err != nil {
			return err
		}
		if kind == "ca" {
			if len(cas) != 1 || bytes.Contains(origCA, webhookcerts.EncodeCertificates(cas[0])) {
				return fmt.Errorf("ca.crt holds %d CAs, the original among them", len(cas))
			}
			if err := bundlesAre(ctx, c, rel, s.Data["ca.crt"]); err != nil {
				return err
			}
		}
		leaf, err := webhookcerts.ParseCertificates(s.Data[corev1.TLSCertKey])
		if err != nil {
			return err
		}
		return everyReplicaServes(ctx, rel, leaf[0], cas)
	})
}

// bundlesAre checks every webhook of kadmit's configurations has caBundle
// want.
func bundlesAre(ctx context.Context, c *cluster.Cluster, rel *realcluster.Release, want []byte) error {
	reg := c.Client.AdmissionregistrationV1()
	m, err := reg.MutatingWebhookConfigurations().Get(ctx, rel.FullName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	v, err := reg.ValidatingWebhookConfigurations().Get(ctx, rel.FullName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	for _, w := range m.Webhooks {
		if !bytes.Equal(w.ClientConfig.CABundle, want) {
			return fmt.Errorf("%s: caBundle is not ca.crt yet", w.Name)
		}
	}
	for _, w := range v.Webhooks {
		if !bytes.Equal(w.ClientConfig.CABundle, want) {
			return fmt.Errorf("%s: caBundle is not ca.crt yet", w.Name)
		}
	}
	return nil
}

// everyReplicaServes handshakes with every ready pod of the release as the
// API server would (SNI <svc>.<ns>.svc) and checks it serves leaf, valid
// for cas.
func everyReplicaServes(ctx context.Context, rel *realcluster.Release, leaf *x509.Certificate, cas []*x509.Certificate) error {
	pods, err := rel.Pods(ctx)
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	for _, ca := range cas {
		pool.AddCert(ca)
	}
	serverName := rel.FullName + "." + rel.Namespace + ".svc"
	for _, p := range pods {
		if !podReady(&p) || p.Status.PodIP == "" {
			continue
		}
		dctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		d := tls.Dialer{Config: &tls.Config{ServerName: serverName, InsecureSkipVerify: true}} //nolint:gosec // verified below against ca.crt
		conn, err := d.DialContext(dctx, "tcp", net.JoinHostPort(p.Status.PodIP, "9443"))
		cancel()
		if err != nil {
			return fmt.Errorf("pod %s: %w", p.Name, err)
		}
		st := conn.(*tls.Conn).ConnectionState()
		_ = conn.Close()
		if len(st.PeerCertificates) == 0 || !st.PeerCertificates[0].Equal(leaf) {
			return fmt.Errorf("pod %s does not serve the Secret's certificate yet", p.Name)
		}
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: serverName}); err != nil {
			return fmt.Errorf("pod %s: %w", p.Name, err)
		}
	}
	return nil
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// ---------------------------------------------------------------------------
// Detection.

// detectionConcurrency: classes measured at once. Each has its own backend
// and configuration, and the watch evaluates all of them in every pass, so
// measuring several at once changes little but the wall clock: node1 runs
// concurrent rollouts (the rollout column includes them), and the watch's
// Events share one token bucket (1/s, burst 20: internal/watch
// DefaultEventQPS), which more classes at once would drain.
const detectionConcurrency = 3

func (e *env) detection(t *testing.T) []watchprobe.Detection {
	ctx := ctxFor(t, 2*time.Minute)
	for i, dc := range e.classes {
		if dc.onNode2 {
			e.backends[i] = e.makeBackend(ctx, t, dc, e.c.Nodes[1].Name)
		}
	}
	if err := waitBackendsReady(ctx, e.c, e.backends); err != nil {
		t.Fatalf("%v\n%s", err, podsDump(e.c))
	}
	if err := poll.Until(ctx, time.Minute, func(context.Context) error { return e.allHealthy(t) }); err != nil {
		t.Fatalf("backends healthy before the injections: %v", err)
	}
	rows := make([]watchprobe.Detection, len(e.classes))
	sem := make(chan struct{}, detectionConcurrency)
	var wg sync.WaitGroup
	for i, dc := range e.classes {
		b := e.backends[i]
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			t.Run(dc.Key, func(t *testing.T) {
				ctx := ctxFor(t, 3*time.Minute)
				rows[i] = e.probe.Measure(ctx, t, dc.Class, dc.fault(t, b))
			})
		}()
	}
	wg.Wait()
	var out []watchprobe.Detection
	for _, r := range rows {
		if !r.InjectAt.IsZero() {
			out = append(out, r)
		}
	}
	return out
}
