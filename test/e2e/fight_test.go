package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kadmit/kadmit/internal/certs"
	"github.com/kadmit/kadmit/internal/registration"
	"github.com/kadmit/kadmit/test/controlplane/kadmitproc"
	"github.com/kadmit/kadmit/test/e2e/e2eenv"
	"github.com/kadmit/kadmit/test/poll"
)

const (
	// fightManager is the second writer's field manager: Argo CD's
	// application controller's.
	fightManager = "argocd-controller"
	// fightWindow is how long the second writer resets the caBundle, once
	// per fightPeriod: at most fightWindow/fightPeriod writes.
	fightWindow = 30 * time.Second
	fightPeriod = time.Second
	// fightRepairSlack is how long after its backoff kadmit may take to
	// repair once the second writer stopped: the informer's delivery, the
	// registrar's retry tick (registration.RetryInterval) and the write.
	fightRepairSlack = 3 * time.Second
)

// maxFightRepairs bounds kadmit's repairs over fightWindow against a
// writer that reverts every fightPeriod: ContestFreeRepairs at once, then
// waits of 1s, 2s, 4s, ... (each after the writer's next reset) fit at
// most log2(window/1s)+1 more; without the backoff it would be one per
// period, about 30.
func maxFightRepairs() int {
	n, sum := registration.ContestFreeRepairs, time.Duration(0)
	for b := registration.ContestInitialBackoff; sum < fightWindow; b = min(2*b, registration.ContestMaxBackoff) {
		sum += b
		n++
	}
	return n + 1
}

// TestCABundleFightBacksOff runs a second install (--tls=files --register,
// its own --webhook-config-name, so the shared kadmit is never touched) and
// a second writer with its own field manager, argocd-controller, that
// resets the ValidatingWebhookConfiguration's caBundle to another CA with
// an Update every second for 30 seconds, as Argo CD with Replace=true or a
// chart rendering its own CA does. kadmit must repair the first few at
// once and then back off (its repairs, counted in a watch on the API
// server, fewer than maxFightRepairs; the gaps growing), name the other
// manager in a Warning Event, in its metrics and in /readyz, and, once the
// writer stops, repair the caBundle within its backoff.
func TestCABundleFightBacksOff(t *testing.T) {
	e := world(t)
	ctx := e2eenv.TestCtx(t, 5*time.Minute)
	const name = "kadmit-fight"
	p, ca, metricsAddr := startFilesInstall(t, ctx, e, name)
	stale, err := certs.NewSelfSigned(certs.SelfSignedOptions{DNSNames: []string{"localhost"}})
	if err != nil {
		t.Fatal(err)
	}

	// The writer's own client: no client-side throttling between it and
	// the API server, and its own field manager.
	cfg := rest.CopyConfig(e.Config)
	cfg.QPS, cfg.Burst, cfg.UserAgent = 1000, 1000, fightManager
	writer, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	vwcs := writer.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	v, err := vwcs.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := vwcs.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name, ResourceVersion: v.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	writesBefore := metricValue(t, ctx, metricsAddr, "kadmit_registration_writes_total", "kind", "ValidatingWebhookConfiguration")

	// The watch: every change of the caBundle back to kadmit's CA is one
	// of kadmit's repairs.
	var mu sync.Mutex
	var repairs []time.Time
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		held := true // registered with kadmit's CA
		for ev := range w.ResultChan() {
			obj, ok := ev.Object.(*admissionregistrationv1.ValidatingWebhookConfiguration)
			if !ok || ev.Type != watch.Modified {
				continue
			}
			full := allBundles(nil, obj, ca)
			if full && !held {
				mu.Lock()
				repairs = append(repairs, time.Now())
				mu.Unlock()
			}
			held = full
		}
	}()
	repairsSince := func(from time.Time) []time.Time {
		mu.Lock()
		defer mu.Unlock()
		var out []time.Time
		for _, r := range repairs {
			if !r.Before(from) {
				out = append(out, r)
			}
		}
		return out
	}

	// The second writer: bounded by count and time.
	start := time.Now()
	var lastWrite time.Time
	updates, writes := 0, 0
	tick := time.NewTicker(fightPeriod)
	for i := 0; i < int(fightWindow/fightPeriod) && ctx.Err() == nil; i++ {
		cur, err := vwcs.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for j := range cur.Webhooks {
			cur.Webhooks[j].ClientConfig.CABundle = stale.CACert
		}
		out, err := vwcs.Update(ctx, cur, metav1.UpdateOptions{FieldManager: fightManager})
		updates++
		switch {
		case err == nil && out.ResourceVersion != cur.ResourceVersion:
			writes++
			lastWrite = time.Now()
		case err != nil && !strings.Contains(err.Error(), "the object has been modified"):
			t.Fatalf("writer: %v", err)
		}
		<-tick.C
	}
	tick.Stop()
	window := repairsSince(start)
	t.Logf("over %s the writer's %d updates reset the caBundle %d times (the others found it reset already); kadmit repaired it %d times, at %s",
		time.Since(start).Round(time.Millisecond), updates, writes, len(window), offsets(start, window))

	// Backed off: far fewer repairs than reverts, the later ones further
	// apart.
	if limit := maxFightRepairs(); len(window) > limit {
		t.Errorf("kadmit repaired %d times in %s; with its backoff at most %d", len(window), fightWindow, limit)
	}
	if len(window) < registration.ContestFreeRepairs+2 {
		t.Fatalf("kadmit repaired only %d times; the first %d reverts are repaired at once, then after 1s", len(window), registration.ContestFreeRepairs)
	}
	if gap := window[len(window)-1].Sub(window[len(window)-2]); gap < 4*registration.ContestInitialBackoff {
		t.Errorf("the last two repairs are %s apart; the backoff should have grown past %s", gap, 4*registration.ContestInitialBackoff)
	}
	if got := metricValue(t, ctx, metricsAddr, "kadmit_registration_writes_total", "kind", "ValidatingWebhookConfiguration") - writesBefore; int(got) != len(window) {
		t.Errorf("kadmit_registration_writes_total grew by %v, the watch saw %d repairs", got, len(window))
	}

	// The metrics and the Event name the other manager.
	if got := metricValue(t, ctx, metricsAddr, "kadmit_registration_ca_bundle_contested",
		"configuration", name, "kind", "ValidatingWebhookConfiguration", "manager", fightManager); got != 1 {
		t.Errorf("kadmit_registration_ca_bundle_contested{manager=%q} = %v, want 1", fightManager, got)
	}
	backoff := time.Duration(metricValue(t, ctx, metricsAddr, "kadmit_registration_repair_backoff_seconds", "kind", "ValidatingWebhookConfiguration") * float64(time.Second))
	if backoff < 4*registration.ContestInitialBackoff || backoff > registration.ContestMaxBackoff {
		t.Errorf("backoff %s after the fight; want between %s and %s", backoff, 4*registration.ContestInitialBackoff, registration.ContestMaxBackoff)
	}
	contestedEvent(t, ctx, e, name)

	// Readiness names the fight whichever bundle is in place: 503 with
	// the other side's, 200 and degraded with kadmit's.
	if code, body := readyz(t, ctx, metricsAddr); !strings.Contains(body, fightManager) {
		t.Errorf("/readyz = %d %q; want it to name %s", code, body, fightManager)
	}

	// The writer stopped: kadmit repairs within its backoff.
	if err := poll.Until(ctx, max(time.Until(lastWrite.Add(backoff+fightRepairSlack)), poll.Interval), func(context.Context) error {
		if len(repairsSince(lastWrite)) == 0 {
			return errors.New("no repair since the writer's last reset")
		}
		return nil
	}); err != nil {
		t.Fatalf("not repaired within %s of the writer's last reset (backoff %s + %s): %v\n%s", time.Since(lastWrite).Round(time.Millisecond), backoff, fightRepairSlack, err, p.Tail(20))
	}
	after := repairsSince(lastWrite)[0].Sub(lastWrite)
	t.Logf("the writer stopped; kadmit repaired the caBundle %s after its last reset (backoff %s)", after.Round(time.Millisecond), backoff)
	if err := p.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if code, body := readyz(t, ctx, metricsAddr); code != http.StatusOK || !strings.Contains(body, "degraded: caBundleContested") || !strings.Contains(body, fightManager) {
		t.Errorf("/readyz after the repair = %d %q; want 200, degraded, naming %s", code, body, fightManager)
	}
	w.Stop()
	<-watched
}

// startFilesInstall starts `kadmit serve --tls=files --register` with a
// fresh CA under the configuration name name (cleaned up with the
// process), waits until both configurations carry its CA, and returns the
// process, the CA and the metrics address.
func startFilesInstall(t *testing.T, ctx context.Context, e *env, name string) (*kadmitproc.Process, []byte, string) {
	t.Helper()
	dir := t.TempDir()
	b, err := certs.NewSelfSigned(certs.SelfSignedOptions{DNSNames: []string{"localhost"}})
	if err != nil {
		t.Fatal(err)
	}
	for file, data := range map[string][]byte{"tls.crt": b.ServerCert, "tls.key": b.ServerKey, "ca.crt": b.CACert} {
		if err := os.WriteFile(filepath.Join(dir, file), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	addr, metricsAddr, err := e2eenv.FreeAddrs()
	if err != nil {
		t.Fatal(err)
	}
	reg := e.Client.AdmissionregistrationV1()
	// Cleanups run last-first: stop kadmit (it would repair a deletion),
	// then delete its configurations so no webhook outlives it.
	t.Cleanup(func() {
		bg := context.Background()
		_ = reg.MutatingWebhookConfigurations().Delete(bg, name, metav1.DeleteOptions{})
		_ = reg.ValidatingWebhookConfigurations().Delete(bg, name, metav1.DeleteOptions{})
	})
	p, err := kadmitproc.Start(kadmitproc.Options{
		Binary: e.Binary, Addr: addr, MetricsAddr: metricsAddr,
		Args: []string{"serve", "--tls=files", "--cert-dir", dir, "--ca-bundle-file", filepath.Join(dir, "ca.crt"),
			"--register", "--webhook-config-name", name, "--webhook-url", "https://localhost:" + strings.Split(addr, ":")[1],
			"--kubeconfig", e.Kubeconfig, "--addr", addr, "--metrics-addr", metricsAddr, "--log-format", "json"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _, _ = p.Terminate(10 * time.Second) })
	if err := p.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if err := poll.Until(ctx, 30*time.Second, func(context.Context) error {
		m, mErr := reg.MutatingWebhookConfigurations().Get(ctx, name, metav1.GetOptions{})
		v, vErr := reg.ValidatingWebhookConfigurations().Get(ctx, name, metav1.GetOptions{})
		if err := errors.Join(mErr, vErr); err != nil {
			return err
		}
		if !allBundles(m, v, b.CACert) {
			return errors.New("a caBundle is not the CA's")
		}
		return nil
	}); err != nil {
		t.Fatalf("configurations %s not registered with the CA: %v\n%s", name, err, p.Tail(20))
	}
	return p, b.CACert, metricsAddr
}

// contestedEvent checks that a Warning CABundleContested Event on the
// ValidatingWebhookConfiguration name (in namespace default: it is
// cluster-scoped) names fightManager; the recorder writes it
// asynchronously, so it is waited for.
func contestedEvent(t *testing.T, ctx context.Context, e *env, name string) {
	t.Helper()
	sel := "involvedObject.kind=ValidatingWebhookConfiguration,involvedObject.name=" + name + ",reason=" + registration.ReasonCABundleContested
	var seen []string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		evs, err := e.Client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			t.Fatal(err)
		}
		seen = seen[:0]
		for _, ev := range evs.Items {
			seen = append(seen, ev.Type+" "+ev.Message)
			if ev.Type == "Warning" && strings.Contains(ev.Message, strconv.Quote(fightManager)) {
				t.Logf("Event %s (count %d): %s", ev.Reason, ev.Count, ev.Message)
				return
			}
		}
	}
	t.Errorf("no Warning %s Event naming %s on %s; seen: %q", registration.ReasonCABundleContested, fightManager, name, seen)
}

// metricValue is the value of the first series of metric on kadmit's
// /metrics whose labels include every name, value pair of labels; the
// test fails when there is none.
func metricValue(t *testing.T, ctx context.Context, metricsAddr, metric string, labels ...string) float64 {
	t.Helper()
	body := scrape(ctx, t, metricsAddr, "/metrics")
next:
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, metric+"{") {
			continue
		}
		for i := 0; i+1 < len(labels); i += 2 {
			if !strings.Contains(line, labels[i]+"="+strconv.Quote(labels[i+1])) {
				continue next
			}
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		return v
	}
	t.Fatalf("no %s%q on /metrics", metric, labels)
	return 0
}

// readyz returns kadmit's /readyz status and body.
func readyz(t *testing.T, ctx context.Context, metricsAddr string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+metricsAddr+"/readyz", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, string(b)
}

// offsets lists ts as offsets from start, for the log.
func offsets(start time.Time, ts []time.Time) string {
	var out []string
	for _, ts := range ts {
		out = append(out, fmt.Sprintf("+%.1fs", ts.Sub(start).Seconds()))
	}
	return strings.Join(out, " ")
}
