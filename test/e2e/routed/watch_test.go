package routed

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"

	"github.com/kadmit/kadmit/test/e2e/e2eenv"
	"github.com/kadmit/kadmit/test/netns"
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
	rules := loadAlertRules(t, e)
	pods := e.startPodMirror(t)
	eventually(t, 20*time.Second, "Pod objects for kadmit's replicas", pods.synced)
	w := e.startWatch(t)
	// The labels the chart's ServiceMonitor gives the watch's series.
	alerts := newAlertEvaluator(t, rules, map[string]string{"job": "kadmit-watch-metrics", "service": "kadmit-watch-metrics",
		"namespace": systemNS, "pod": watchIdentity, "container": "watch", "endpoint": "metrics", "instance": w.metricsAddr})
	w.scr.observe(alerts.add)

	begin := time.Now()
	t.Run("NoFalseAlarms", func(t *testing.T) { e.watchNoFalseAlarms(t, w, alerts, pods) })
	var rows []detection
	t.Run("Detection", func(t *testing.T) { rows = e.watchDetection(t, w, alerts) })
	// The faults were injected into other webhooks: kadmit's own stayed
	// healthy throughout.
	for _, ev := range w.events.matching(begin, onConfig(configName, "Warning", "")) {
		t.Errorf("Warning Event %s on %s/%s at %s: %s", ev.reason, ev.kind, ev.name, ev.at.Format("15:04:05.000"), ev.message)
	}
	if len(rows) > 0 {
		t.Logf("detection times, from injection (metric: kadmit_watch_findings; event: Warning <ID>; alert: expression true, for: ignored; resolved: Normal <ID>Resolved, cleared: finding and alert gone, both from the repair):\n%s", detectionTable(rows))
	}
}

// kadmitTracked fails until the watch reports kadmit's own webhooks with all
// their ready endpoints handshaken.
func kadmitTracked(w *watchProc, endpoints int) error {
	sc := w.scr.latest()
	if sc == nil || sc.err != nil {
		return fmt.Errorf("no scrape: %v", sc)
	}
	infos := sc.find("kadmit_watch_webhook_info", map[string]string{"configuration": configName})
	if len(infos) < 2 {
		return fmt.Errorf("%d kadmit_watch_webhook_info series for configuration %q; want kadmit's webhooks", len(infos), configName)
	}
	for _, info := range infos {
		wh := map[string]string{"configuration": configName, "webhook": info.labels["webhook"]}
		if v, ok := sc.value("kadmit_watch_ready_endpoints", wh); !ok || int(v) != endpoints {
			return fmt.Errorf("kadmit_watch_ready_endpoints%v = %v (present %v); want %d", wh, v, ok, endpoints)
		}
		if n := len(sc.find("kadmit_watch_serving_cert_expiry_timestamp_seconds", wh)); n != endpoints {
			return fmt.Errorf("%d serving-certificate expiry series for %v; want one per ready endpoint (%d)", n, wh, endpoints)
		}
	}
	return nil
}

// watchNoFalseAlarms: serving rotation, CA rotation, rolling restart.
func (e *env) watchNoFalseAlarms(t *testing.T, w *watchProc, alerts *alertEvaluator, pods *podMirror) {
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
			sc := w.scr.latest()
			if sc == nil || sc.err != nil {
				return fmt.Errorf("no scrape: %v", sc)
			}
			xs := sc.find("kadmit_watch_serving_cert_expiry_timestamp_seconds", map[string]string{"configuration": configName})
			if len(xs) == 0 {
				return errors.New("no serving-certificate expiry series for kadmit")
			}
			for _, x := range xs {
				if int64(x.value) != leaf.NotAfter.Unix() {
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

	scrapes := w.scr.between(start, end)
	if failed := w.scr.failedBetween(start, end); len(failed) > 0 {
		t.Errorf("%d scrapes of the watch's /metrics failed during the rotations and restart, first: %v", len(failed), failed[0])
	}
	if len(scrapes) < int(end.Sub(start)/scrapeInterval)/2 {
		t.Errorf("only %d scrapes of the watch's /metrics in %s", len(scrapes), end.Sub(start).Round(time.Second))
	}
	bad := 0
	for _, sc := range scrapes {
		if fs := findingsOf(sc, configName, "warning", "error"); len(fs) > 0 {
			if bad++; bad <= 5 {
				t.Errorf("false alarm at %s (%s into the rotations/restart): %v", sc.at.Format("15:04:05.000"), sc.at.Sub(start).Round(time.Millisecond), fs)
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d scrapes showed a warning or error finding on kadmit's healthy configurations", bad, len(scrapes))
	}
	if evs := w.events.matching(start, onConfig(configName, "Warning", "")); len(evs) > 0 {
		for _, ev := range evs {
			t.Errorf("false alarm: Warning Event %s on %s/%s at %s: %s", ev.reason, ev.kind, ev.name, ev.at.Format("15:04:05.000"), ev.message)
		}
	}
	// No alert expression may be true for kadmit's webhooks, nor may the
	// watch look down, at any scrape.
	fired := map[string]int{}
	for _, sc := range scrapes {
		for _, r := range alerts.rules {
			res, err := alerts.eval(r.expr, sc.at)
			if err != nil {
				t.Fatalf("alert %s: %v", r.name, err)
			}
			for _, l := range res {
				if cfg, ok := l["configuration"]; !ok || cfg == configName {
					if fired[r.name]++; fired[r.name] == 1 {
						t.Errorf("false alarm: alert %s true at %s for %v", r.name, sc.at.Format("15:04:05.000"), l)
					}
				}
			}
		}
	}
	t.Logf("no false alarm check: %d scrapes over %s (serving rotation, CA rotation, rolling restart), %d alert expressions each; alerts true: %v",
		len(scrapes), end.Sub(start).Round(time.Second), len(alerts.rules), fired)
}

// faultClass is one failure class: how to inject and repair it in a
// healthy backend, and what the watch must report.
type faultClass struct {
	name     string // for the table
	key      string // backend name suffix
	check    string // the finding's check ID
	alert    string // the alert expected true
	informer bool   // detection is informer-driven: limit 5s, else 30s
	// hsReason, when set, is the reason kadmit_watch_handshake_failures_total
	// must count for the class.
	hsReason string
	inject   func(ctx context.Context, t *testing.T, b *faultBackend) error
	repair   func(ctx context.Context, t *testing.T, b *faultBackend) error
}

// detection is one class's measured times from injection (and, for
// resolved, from the repair); zero when not seen.
type detection struct {
	class                  faultClass
	metric, event, alert   time.Duration
	severity               string
	resolved, alertCleared time.Duration
}

func (e *env) faultClasses() []faultClass {
	otherCA := func(t *testing.T) *testCA { return newTestCA(t) }
	return []faultClass{
		{name: "no endpoints", key: "noendpoints", check: "KD201", alert: "KadmitFailWebhookNoEndpoints", informer: true,
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
		{name: "endpoint refuses", key: "refused", check: "KD202", alert: "KadmitWebhookTLSBroken", hsReason: "refused",
			inject: func(ctx context.Context, t *testing.T, b *faultBackend) error {
				// A ready endpoint at an address on lo where nothing listens.
				ip := b.spareIP(8)
				if err := netns.AddLoopbackAddr(ip); err != nil {
					return err
				}
				return b.addEndpoint(ctx, ip, "z")
			},
			repair: func(ctx context.Context, _ *testing.T, b *faultBackend) error { return b.removeEndpoint(ctx, "z") }},
		{name: "selector collision", key: "collision", check: "KD301", alert: "KadmitWebhookSelectorCollision", informer: true,
			inject: func(ctx context.Context, _ *testing.T, b *faultBackend) error {
				// Another workload whose pods carry the Service's selector
				// labels: objects only, no containers run.
				lbls := map[string]string{"app": b.name, "component": "log-agent"}
				return createWorkloadHash(ctx, e, b.name+"-log-agent", lbls, otherTemplateHash, []string{b.name + "-log-agent-" + otherTemplateHash + "-x"}, []string{b.spareIP(7)})
			},
			repair: func(ctx context.Context, _ *testing.T, b *faultBackend) error {
				return deleteWorkloadHash(ctx, e, b.name+"-log-agent", otherTemplateHash, []string{b.name + "-log-agent-" + otherTemplateHash + "-x"})
			}},
		{name: "caBundle from another CA", key: "foreignca", check: "KD404", alert: "KadmitWebhookTLSBroken", informer: true,
			inject: func(ctx context.Context, t *testing.T, b *faultBackend) error {
				other := otherCA(t)
				return b.updateConfig(ctx, func(w *admissionregistrationv1.ValidatingWebhook) { w.ClientConfig.CABundle = other.pem })
			},
			repair: func(ctx context.Context, _ *testing.T, b *faultBackend) error {
				return b.updateConfig(ctx, func(w *admissionregistrationv1.ValidatingWebhook) { w.ClientConfig.CABundle = b.ca.pem })
			}},
		{name: "certificate for another Service", key: "othername", check: "KD405", alert: "KadmitWebhookTLSBroken", hsReason: "san_mismatch",
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
		{name: "expired certificate", key: "expired", check: "KD406", alert: "KadmitWebhookCertificateExpiringSoon", hsReason: "expired",
			inject: func(_ context.Context, t *testing.T, b *faultBackend) error {
				b.swapped = b.servers[0].cert.Load()
				b.servers[0].cert.Store(b.ca.issue(t, b.serverName(), time.Now().Add(-48*time.Hour), 24*time.Hour))
				return nil
			},
			repair: func(_ context.Context, _ *testing.T, b *faultBackend) error {
				b.servers[0].cert.Store(b.swapped)
				return nil
			}},
		{name: "self-interception", key: "selfintercept", check: "KD501", alert: "KadmitWebhookSelfInterception", informer: true,
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
		{name: "timeout", key: "timeout", check: "KD409", alert: "KadmitWebhookTLSBroken", hsReason: "timeout",
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

func (e *env) watchDetection(t *testing.T, w *watchProc, alerts *alertEvaluator) []detection {
	e.ensureFaultsNamespace(t)
	classes := e.faultClasses()
	backends := make([]*faultBackend, len(classes))
	for i, fc := range classes {
		backends[i] = e.newFaultBackend(t, fc.key, i+1)
	}
	// Every backend healthy in the watch's eyes: tracked, both endpoints
	// ready and handshaken, no warning or error finding.
	eventually(t, 45*time.Second, "fault backends healthy in the watch's metrics", func() error {
		sc := w.scr.latest()
		if sc == nil || sc.err != nil {
			return fmt.Errorf("no scrape: %v", sc)
		}
		for _, b := range backends {
			wh := map[string]string{"configuration": b.name, "webhook": b.webhook}
			if len(sc.find("kadmit_watch_webhook_info", wh)) != 1 {
				return fmt.Errorf("%s not tracked", b.name)
			}
			if v, ok := sc.value("kadmit_watch_ready_endpoints", wh); !ok || int(v) != faultReplicas {
				return fmt.Errorf("%s: ready endpoints %v (present %v)", b.name, v, ok)
			}
			if n := len(sc.find("kadmit_watch_serving_cert_expiry_timestamp_seconds", wh)); n != faultReplicas {
				return fmt.Errorf("%s: %d endpoints handshaken", b.name, n)
			}
			if fs := findingsOf(sc, b.name, "warning", "error"); len(fs) > 0 {
				return fmt.Errorf("%s not healthy: %v", b.name, fs)
			}
			for _, r := range alerts.rules {
				if alerts.firing(t, r.name, sc.at, b.name) {
					return fmt.Errorf("%s not healthy: alert %s true", b.name, r.name)
				}
			}
		}
		return nil
	})

	var rows []detection
	for i, fc := range classes {
		b := backends[i]
		t.Run(fc.key, func(t *testing.T) { rows = append(rows, e.measureClass(t, w, alerts, fc, b)) })
		b.delete(t)
	}
	return rows
}

// measureClass injects fc into the healthy backend b and measures, then
// repairs and waits for the Resolved event.
func (e *env) measureClass(t *testing.T, w *watchProc, alerts *alertEvaluator, fc faultClass, b *faultBackend) detection {
	ctx := e2eenv.TestCtx(t, 2*time.Minute)
	d := detection{class: fc}
	limit := 30 * time.Second
	if fc.informer {
		limit = 5 * time.Second
	}
	wh := map[string]string{"configuration": b.name, "webhook": b.webhook, "check": fc.check}
	hsFailures := func() float64 {
		v, _ := w.scr.latest().value("kadmit_watch_handshake_failures_total", map[string]string{"configuration": b.name, "webhook": b.webhook, "reason": fc.hsReason})
		return v
	}
	hsBefore := hsFailures()
	injectAt := time.Now()
	if err := fc.inject(ctx, t, b); err != nil {
		t.Fatalf("inject %s: %v", fc.name, err)
	}
	alertScan := injectAt
	err := pollFor(ctx, limit+detectWithin, func() bool {
		now := time.Now()
		if d.metric == 0 {
			for _, sc := range w.scr.between(injectAt, now) {
				if fs := findingsOf(sc, b.name, "warning", "error"); slices.ContainsFunc(fs, func(s series) bool { return s.has(wh) }) {
					d.metric = sc.at.Sub(injectAt)
					for _, s := range fs {
						if s.has(wh) {
							d.severity = s.labels["severity"]
						}
					}
					break
				}
			}
		}
		if d.event == 0 {
			if evs := w.events.matching(injectAt, onConfig(b.name, "Warning", fc.check)); len(evs) > 0 {
				d.event = evs[0].at.Sub(injectAt)
				if !strings.HasPrefix(evs[0].message, "webhook "+b.webhook+": ") {
					t.Errorf("Event message %q; want it to start with \"webhook %s: \"", evs[0].message, b.webhook)
				}
			}
		}
		if d.alert == 0 {
			for _, sc := range w.scr.between(alertScan, now) {
				alertScan = sc.at.Add(time.Nanosecond)
				if alerts.firing(t, fc.alert, sc.at, b.name) {
					d.alert = sc.at.Sub(injectAt)
					break
				}
			}
		}
		return d.metric > 0 && d.event > 0 && d.alert > 0
	})
	for what, v := range map[string]time.Duration{"metric kadmit_watch_findings{check=" + fc.check + "}": d.metric, "Warning Event " + fc.check: d.event, "alert " + fc.alert: d.alert} {
		switch {
		case v == 0:
			t.Errorf("%s: %s not seen within %s of the injection (%v)", fc.name, what, limit+detectWithin, err)
		case v > limit:
			t.Errorf("%s: %s after %s; want within %s", fc.name, what, v.Round(time.Millisecond), limit)
		}
	}
	if d.severity != "error" && d.severity != "" {
		t.Errorf("%s: finding %s has severity %q; want error", fc.name, fc.check, d.severity)
	}
	if fc.hsReason != "" {
		if after := hsFailures(); after <= hsBefore {
			t.Errorf("%s: kadmit_watch_handshake_failures_total{reason=%q} stayed at %v", fc.name, fc.hsReason, after)
		}
	}

	repairAt := time.Now()
	// Deduplicated: one Warning Event while the finding is active.
	if evs := w.events.matching(injectAt, onConfig(b.name, "Warning", fc.check)); len(evs) > 1 {
		t.Errorf("%s: %d Warning %s Events while the finding was active; want one", fc.name, len(evs), fc.check)
	}
	if err := fc.repair(ctx, t, b); err != nil {
		t.Fatalf("repair %s: %v", fc.name, err)
	}
	var cleared bool
	err = pollFor(ctx, limit+detectWithin, func() bool {
		if d.resolved == 0 {
			if evs := w.events.matching(repairAt, onConfig(b.name, "Normal", fc.check+"Resolved")); len(evs) > 0 {
				d.resolved = evs[0].at.Sub(repairAt)
			}
		}
		if !cleared {
			if sc := w.scr.latest(); sc != nil && sc.err == nil && sc.at.After(repairAt) {
				active := slices.ContainsFunc(findingsOf(sc, b.name, "warning", "error"), func(s series) bool { return s.has(wh) })
				if !active && !alerts.firing(t, fc.alert, sc.at, b.name) {
					cleared, d.alertCleared = true, sc.at.Sub(repairAt)
				}
			}
		}
		return d.resolved > 0 && cleared
	})
	if d.resolved == 0 {
		t.Errorf("%s: no Normal %sResolved Event within %s of the repair (%v)", fc.name, fc.check, limit+detectWithin, err)
	}
	if !cleared {
		t.Errorf("%s: finding or alert still active %s after the repair", fc.name, limit+detectWithin)
	}
	t.Logf("%s: metric %s, event %s, alert %s (limit %s); repaired: Resolved event %s, finding and alert cleared %s",
		fc.name, fmtDur(d.metric), fmtDur(d.event), fmtDur(d.alert), limit, fmtDur(d.resolved), fmtDur(d.alertCleared))
	return d
}

// pollFor calls cond every 100ms until it returns true or d passes.
func pollFor(ctx context.Context, d time.Duration, cond func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if cond() {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

func fmtDur(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	return d.Round(10 * time.Millisecond).String()
}

func detectionTable(rows []detection) string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "class\tcheck\tlimit\tmetric\tevent\talert\tresolved\tcleared\t")
	for _, r := range rows {
		limit := "30s"
		if r.class.informer {
			limit = "5s"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s (%s)\t%s\t%s\t\n", r.class.name, r.class.check, limit, fmtDur(r.metric), fmtDur(r.event), fmtDur(r.alert), r.class.alert, fmtDur(r.resolved), fmtDur(r.alertCleared))
	}
	_ = tw.Flush()
	return b.String()
}
