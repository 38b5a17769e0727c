package routed

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"

	"github.com/kadmit/kadmit/test/e2e/e2eenv"
	"github.com/kadmit/kadmit/test/netns"
	"github.com/kadmit/kadmit/test/watchprobe"
)

// TestWatch runs `kadmit watch` (issue 15) next to the three routed
// replicas and checks, against its /metrics, its Events and the alert
// expressions of the chart's PrometheusRule:
//
//   - NoFalseAlarms: a serving-certificate rotation, a CA rotation and a
//     rolling restart of the replicas raise no finding of warning or error
//     severity, no Warning Event on kadmit's configurations and no alert;
//   - Detection: each failure class, injected into a healthy webhook of its
//     own, shows as the finding's metric, a Warning Event (reason = check ID)
//     and the alert expression true (for: ignored) within 30s (5s for the
//     informer-driven classes), and clears (Normal <ID>Resolved) on repair.
//
// The watch runs with --handshake-interval 5s (default 30s) so that the
// handshake-driven classes fit the test, and the default --debounce 500ms;
// probes are off (the default).
func TestWatch(t *testing.T) {
	e := world(t)
	e.ensureInstalled(t)
	alerts := newAlertEvaluator(t, e)
	pods := e.startPodMirror(t)
	eventually(t, 20*time.Second, "Pod objects for kadmit's replicas", pods.synced)
	w := e.startWatch(t)
	w.scr.Observe(alerts.Add)
	probe := &watchprobe.Probe{Scraper: w.scr, Events: w.events, Alerts: alerts, DetectWithin: detectWithin}

	begin := time.Now()
	t.Run("NoFalseAlarms", func(t *testing.T) { e.watchNoFalseAlarms(t, w, alerts, pods) })
	var rows []watchprobe.Detection
	t.Run("Detection", func(t *testing.T) { rows = e.watchDetection(t, w, probe) })
	// The faults were injected into other webhooks: kadmit's own stayed
	// healthy throughout.
	for _, ev := range w.events.Matching(begin, watchprobe.OnConfig(configName, "Warning", "")) {
		t.Errorf("Warning Event %s", ev)
	}
	if len(rows) > 0 {
		t.Logf("detection times, from injection (metric: kadmit_watch_findings; event: Warning <ID>; alert: expression true, for: ignored; resolved: Normal <ID>Resolved, cleared: finding and alert gone, both from the repair):\n%s", watchprobe.Table(rows))
	}
}

// kadmitTracked fails until the watch reports kadmit's own webhooks with all
// their ready endpoints handshaken.
func kadmitTracked(w *watchProc, endpoints int) error {
	sc := w.scr.Latest()
	if sc == nil || sc.Err != nil {
		return fmt.Errorf("no scrape: %v", sc)
	}
	infos := sc.Find("kadmit_watch_webhook_info", map[string]string{"configuration": configName})
	if len(infos) < 2 {
		return fmt.Errorf("%d kadmit_watch_webhook_info series for configuration %q; want kadmit's webhooks", len(infos), configName)
	}
	for _, info := range infos {
		wh := map[string]string{"configuration": configName, "webhook": info.Labels["webhook"]}
		if v, ok := sc.Value("kadmit_watch_ready_endpoints", wh); !ok || int(v) != endpoints {
			return fmt.Errorf("kadmit_watch_ready_endpoints%v = %v (present %v); want %d", wh, v, ok, endpoints)
		}
		if n := len(sc.Find("kadmit_watch_serving_cert_expiry_timestamp_seconds", wh)); n != endpoints {
			return fmt.Errorf("%d serving-certificate expiry series for %v; want one per ready endpoint (%d)", n, wh, endpoints)
		}
	}
	return nil
}

// watchNoFalseAlarms: serving rotation, CA rotation, rolling restart.
func (e *env) watchNoFalseAlarms(t *testing.T, w *watchProc, alerts *watchprobe.Evaluator, pods *podMirror) {
	ctx := e2eenv.TestCtx(t, 3*time.Minute)
	c := e.cluster
	eventually(t, 30*time.Second, "kadmit's webhooks tracked by the watch", func() error { return kadmitTracked(w, 3) })
	start := time.Now()
	// settle waits until the watch has handshaken every endpoint after a
	// step (the expiry it reports is the Secret's serving certificate's),
	// then lets one more periodic handshake pass, so that a false alarm
	// would show.
	settle := func(step string) {
		_, leaf, _, err := e.secretMaterial(ctx)
		if err != nil {
			t.Fatal(err)
		}
		eventually(t, 3*watchHandshakeInterval, "the watch reports the serving certificate in use after the "+step, func() error {
			sc := w.scr.Latest()
			if sc == nil || sc.Err != nil {
				return fmt.Errorf("no scrape: %v", sc)
			}
			xs := sc.Find("kadmit_watch_serving_cert_expiry_timestamp_seconds", map[string]string{"configuration": configName})
			if len(xs) == 0 {
				return errors.New("no serving-certificate expiry series for kadmit")
			}
			for _, x := range xs {
				if int64(x.Value) != leaf.NotAfter.Unix() {
					return fmt.Errorf("%s; the Secret's serving certificate expires at %d", x, leaf.NotAfter.Unix())
				}
			}
			return nil
		})
		time.Sleep(watchHandshakeInterval + time.Second)
	}

	_, origLeaf, _, err := e.secretMaterial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	took := e.rotateServing(ctx, t, "serving rotation", origLeaf)
	t.Logf("serving rotation: every replica served the new certificate %s after the annotation", took.Round(time.Millisecond))
	settle("serving rotation")

	origCAs, _, _, err := e.secretMaterial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.annotateRotate(ctx, "ca"); err != nil {
		t.Fatal(err)
	}
	took = eventually(t, 60*time.Second, "CA rotation", func() error {
		cas, leaf, s, err := e.secretMaterial(ctx)
		if err != nil {
			return err
		}
		if _, ok := s.Annotations["kadmit.io/rotate"]; ok {
			return errors.New("annotation still set")
		}
		if len(cas) != 1 || cas[0].Equal(origCAs[0]) {
			return fmt.Errorf("ca.crt holds %d CAs", len(cas))
		}
		if err := verifyAgainst(leaf, cas[0]); err != nil {
			return err
		}
		if err := e.bundlesAre(ctx, cas); err != nil {
			return err
		}
		return e.everyReplicaServes(func(l *x509.Certificate) error { return verifyAgainst(l, cas[0]) })
	})
	t.Logf("CA rotation: only the new CA in ca.crt and every caBundle, served by every replica, %s after the annotation", took.Round(time.Millisecond))
	settle("CA rotation")

	// Rolling restart, as a Deployment rollout with maxSurge 1 and
	// maxUnavailable 0: a new ReplicaSet; a new replica (pod), ready and
	// published, then the oldest one removed; three times.
	restartAt := time.Now()
	if err := pods.rollout(ctx, "8d6f5b7c2"); err != nil {
		t.Fatal(err)
	}
	for _, old := range c.live() {
		nr := c.startReplica(t, nil)
		eventually(t, 60*time.Second, nr.name+" ready and published", func() error {
			if ok, answer := nr.state(); !ok {
				return fmt.Errorf("not ready: %s", answer)
			}
			if !c.published(nr.name) {
				return errors.New("not yet published")
			}
			return nil
		})
		if err := c.remove(old); err != nil {
			t.Errorf("removing %s: %v", old.name, err)
		}
	}
	eventually(t, 30*time.Second, "three replicas ready after the restart", func() error { return e.allReady(3) })
	t.Logf("rolling restart of the replicas took %s", time.Since(restartAt).Round(time.Millisecond))
	eventually(t, 30*time.Second, "kadmit's webhooks tracked after the restart", func() error { return kadmitTracked(w, 3) })
	settle("rolling restart")
	end := time.Now()

	scrapes := w.scr.Between(start, end)
	if failed := w.scr.FailedBetween(start, end); len(failed) > 0 {
		t.Errorf("%d scrapes of the watch's /metrics failed during the rotations and restart, first: %v", len(failed), failed[0])
	}
	if len(scrapes) < int(end.Sub(start)/watchprobe.DefaultScrapeInterval)/2 {
		t.Errorf("only %d scrapes of the watch's /metrics in %s", len(scrapes), end.Sub(start).Round(time.Second))
	}
	bad := 0
	for _, sc := range scrapes {
		if fs := watchprobe.Findings(sc, configName, "warning", "error"); len(fs) > 0 {
			if bad++; bad <= 5 {
				t.Errorf("false alarm at %s (%s into the rotations/restart): %v", sc.At.Format("15:04:05.000"), sc.At.Sub(start).Round(time.Millisecond), fs)
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d scrapes showed a warning or error finding on kadmit's healthy configurations", bad, len(scrapes))
	}
	for _, ev := range w.events.Matching(start, watchprobe.OnConfig(configName, "Warning", "")) {
		t.Errorf("false alarm: Warning Event %s", ev)
	}
	// No alert expression may be true for kadmit's webhooks, nor may the
	// watch look down, at any scrape.
	fired := map[string]int{}
	for _, sc := range scrapes {
		for _, r := range alerts.Rules {
			res, err := alerts.Eval(r.Expr, sc.At)
			if err != nil {
				t.Fatalf("alert %s: %v", r.Name, err)
			}
			for _, l := range res {
				if cfg, ok := l["configuration"]; !ok || cfg == configName {
					if fired[r.Name]++; fired[r.Name] == 1 {
						t.Errorf("false alarm: alert %s true at %s for %v", r.Name, sc.At.Format("15:04:05.000"), l)
					}
				}
			}
		}
	}
	t.Logf("no false alarm check: %d scrapes over %s (serving rotation, CA rotation, rolling restart), %d alert expressions each; alerts true: %v",
		len(scrapes), end.Sub(start).Round(time.Second), len(alerts.Rules), fired)
}

// faultClass is one failure class: what the watch must report
// (watchprobe.Class; Key names the backend), and how to inject and repair
// it in a healthy backend.
type faultClass struct {
	watchprobe.Class
	inject func(ctx context.Context, t *testing.T, b *faultBackend) error
	repair func(ctx context.Context, t *testing.T, b *faultBackend) error
}

func (e *env) faultClasses() []faultClass {
	otherCA := func(t *testing.T) *testCA { return newTestCA(t) }
	return []faultClass{
		{Class: watchprobe.Class{Name: "no endpoints", Key: "noendpoints", Check: "KD201", Alert: "KadmitFailWebhookNoEndpoints", Informer: true},
			inject: func(ctx context.Context, _ *testing.T, b *faultBackend) error {
				for i := range b.endpoints {
					b.endpoints[i].ready = false
				}
				return b.writeSlice(ctx)
			},
			repair: func(ctx context.Context, _ *testing.T, b *faultBackend) error {
				for i := range b.endpoints {
					b.endpoints[i].ready = true
				}
				return b.writeSlice(ctx)
			}},
		{Class: watchprobe.Class{Name: "endpoint refuses", Key: "refused", Check: "KD202", Alert: "KadmitWebhookTLSBroken", HSReason: "refused"},
			inject: func(ctx context.Context, t *testing.T, b *faultBackend) error {
				// A ready endpoint at an address on lo where nothing listens.
				ip := b.spareIP(8)
				if err := netns.AddLoopbackAddr(ip); err != nil {
					return err
				}
				return b.addEndpoint(ctx, ip, "z")
			},
			repair: func(ctx context.Context, _ *testing.T, b *faultBackend) error { return b.removeEndpoint(ctx, "z") }},
		{Class: watchprobe.Class{Name: "selector collision", Key: "collision", Check: "KD301", Alert: "KadmitWebhookSelectorCollision", Informer: true},
			inject: func(ctx context.Context, _ *testing.T, b *faultBackend) error {
				// Another workload whose pods carry the Service's selector
				// labels: objects only, no containers run.
				lbls := map[string]string{"app": b.name, "component": "log-agent"}
				return createWorkloadHash(ctx, e, b.name+"-log-agent", lbls, otherTemplateHash, []string{b.name + "-log-agent-" + otherTemplateHash + "-x"}, []string{b.spareIP(7)})
			},
			repair: func(ctx context.Context, _ *testing.T, b *faultBackend) error {
				return deleteWorkloadHash(ctx, e, b.name+"-log-agent", otherTemplateHash, []string{b.name + "-log-agent-" + otherTemplateHash + "-x"})
			}},
		{Class: watchprobe.Class{Name: "caBundle from another CA", Key: "foreignca", Check: "KD404", Alert: "KadmitWebhookTLSBroken", Informer: true},
			inject: func(ctx context.Context, t *testing.T, b *faultBackend) error {
				other := otherCA(t)
				return b.updateConfig(ctx, func(w *admissionregistrationv1.ValidatingWebhook) { w.ClientConfig.CABundle = other.pem })
			},
			repair: func(ctx context.Context, _ *testing.T, b *faultBackend) error {
				return b.updateConfig(ctx, func(w *admissionregistrationv1.ValidatingWebhook) { w.ClientConfig.CABundle = b.ca.pem })
			}},
		{Class: watchprobe.Class{Name: "certificate for another Service", Key: "othername", Check: "KD405", Alert: "KadmitWebhookTLSBroken", HSReason: "san_mismatch"},
			inject: func(_ context.Context, t *testing.T, b *faultBackend) error {
				b.swapped = b.servers[0].cert.Load()
				b.servers[0].cert.Store(b.ca.issue(t, "other."+systemNS+".svc", time.Now(), healthyValidity))
				return nil
			},
			repair: func(_ context.Context, _ *testing.T, b *faultBackend) error {
				b.servers[0].cert.Store(b.swapped)
				return nil
			}},
		// The expiry alert is true before the KD406 finding: the watch sets
		// kadmit_watch_serving_cert_expiry_timestamp_seconds from the first
		// handshake, while the finding waits for the confirming one (2s).
		{Class: watchprobe.Class{Name: "expired certificate", Key: "expired", Check: "KD406", Alert: "KadmitWebhookCertificateExpiringSoon", HSReason: "expired"},
			inject: func(_ context.Context, t *testing.T, b *faultBackend) error {
				b.swapped = b.servers[0].cert.Load()
				b.servers[0].cert.Store(b.ca.issue(t, b.serverName(), time.Now().Add(-48*time.Hour), 24*time.Hour))
				return nil
			},
			repair: func(_ context.Context, _ *testing.T, b *faultBackend) error {
				b.servers[0].cert.Store(b.swapped)
				return nil
			}},
		{Class: watchprobe.Class{Name: "self-interception", Key: "selfintercept", Check: "KD501", Alert: "KadmitWebhookSelfInterception", Informer: true},
			inject: func(ctx context.Context, _ *testing.T, b *faultBackend) error {
				// Pod creations in the backend's own namespace, Fail.
				return b.updateConfig(ctx, func(w *admissionregistrationv1.ValidatingWebhook) {
					w.Rules = []admissionregistrationv1.RuleWithOperations{podCreate}
				})
			},
			repair: func(ctx context.Context, _ *testing.T, b *faultBackend) error {
				return b.updateConfig(ctx, func(w *admissionregistrationv1.ValidatingWebhook) {
					w.Rules = []admissionregistrationv1.RuleWithOperations{configMapCreate}
				})
			}},
		{Class: watchprobe.Class{Name: "timeout", Key: "timeout", Check: "KD409", Alert: "KadmitWebhookTLSBroken", HSReason: "timeout"},
			inject: func(ctx context.Context, t *testing.T, b *faultBackend) error {
				// A ready endpoint that accepts TCP and never answers.
				ip := b.spareIP(8)
				startStallListener(t, ip)
				return b.addEndpoint(ctx, ip, "z")
			},
			repair: func(ctx context.Context, _ *testing.T, b *faultBackend) error { return b.removeEndpoint(ctx, "z") }},
	}
}

// detectWithin is how long a signal is waited for past its limit before the
// class is reported as missed.
const detectWithin = 40 * time.Second

func (e *env) watchDetection(t *testing.T, w *watchProc, probe *watchprobe.Probe) []watchprobe.Detection {
	e.ensureFaultsNamespace(t)
	classes := e.faultClasses()
	backends := make([]*faultBackend, len(classes))
	for i, fc := range classes {
		backends[i] = e.newFaultBackend(t, fc.Key, i+1)
	}
	// Every backend healthy in the watch's eyes: tracked, both endpoints
	// ready and handshaken, no warning or error finding.
	eventually(t, 45*time.Second, "fault backends healthy in the watch's metrics", func() error {
		sc := w.scr.Latest()
		if sc == nil || sc.Err != nil {
			return fmt.Errorf("no scrape: %v", sc)
		}
		for _, b := range backends {
			wh := map[string]string{"configuration": b.name, "webhook": b.webhook}
			if len(sc.Find("kadmit_watch_webhook_info", wh)) != 1 {
				return fmt.Errorf("%s not tracked", b.name)
			}
			if v, ok := sc.Value("kadmit_watch_ready_endpoints", wh); !ok || int(v) != faultReplicas {
				return fmt.Errorf("%s: ready endpoints %v (present %v)", b.name, v, ok)
			}
			if n := len(sc.Find("kadmit_watch_serving_cert_expiry_timestamp_seconds", wh)); n != faultReplicas {
				return fmt.Errorf("%s: %d endpoints handshaken", b.name, n)
			}
			if fs := watchprobe.Findings(sc, b.name, "warning", "error"); len(fs) > 0 {
				return fmt.Errorf("%s not healthy: %v", b.name, fs)
			}
			for _, r := range probe.Alerts.Rules {
				if probe.Alerts.Firing(t, r.Name, sc.At, b.name) {
					return fmt.Errorf("%s not healthy: alert %s true", b.name, r.Name)
				}
			}
		}
		return nil
	})

	var rows []watchprobe.Detection
	for i, fc := range classes {
		b := backends[i]
		t.Run(fc.Key, func(t *testing.T) {
			ctx := e2eenv.TestCtx(t, 2*time.Minute)
			rows = append(rows, probe.Measure(ctx, t, fc.Class, watchprobe.Fault{
				Subjects: []watchprobe.Subject{{Configuration: b.name, Webhook: b.webhook}},
				Inject:   func(ctx context.Context) (time.Time, error) { return time.Time{}, fc.inject(ctx, t, b) },
				Repair:   func(ctx context.Context) error { return fc.repair(ctx, t, b) },
			}))
		})
		b.delete(t)
	}
	return rows
}
