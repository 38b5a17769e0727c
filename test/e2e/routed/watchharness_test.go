package routed

// The harness of the `kadmit watch` e2e (watch_test.go): the watch process,
// with a scraper of its /metrics and a recorder of the Events it writes
// (package watchprobe, shared with the real cluster's suite
// test/deploy/diagcluster).

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kadmit/kadmit/test/controlplane/kadmitproc"
	"github.com/kadmit/kadmit/test/netns"
	"github.com/kadmit/kadmit/test/watchprobe"
)

// kadmit watch's leader-election timings (its Lease): short, so that it
// leads soon after it starts.
const (
	watchLeaseDuration = 4 * time.Second
	watchRenewDeadline = 3 * time.Second
	watchRetryPeriod   = time.Second
)

// The watch's own address on lo inside the namespace, and its timings.
// --handshake-interval is 5s here (default 30s) so that the handshake-driven
// classes fit a test; --debounce is the default 500ms, spelled out.
//
// For the lead (issue 15): a fault that appears on an endpoint the watch has
// already handshaken (certificate swapped in place, as the othername and
// expired classes do) waits for the next periodic handshake plus the 2s
// confirmation, so at the default 30s interval its detection is up to ~32s
// (~36s for a hang, with the 3s handshake timeout twice): past the issue's
// 30s. New endpoints (the refused and timeout classes) are handshaken at
// once. Measured here at 5s: 7-10s.
const (
	watchIP                = "198.18.0.5"
	watchMetricsPort       = "8080"
	watchHandshakeInterval = 5 * time.Second
	watchDebounce          = 500 * time.Millisecond
	watchLeaseName         = "kadmit-watch"
	watchIdentity          = "watch-e2e-0"
)

// watchProc is one `kadmit watch` process with its scraper and Event
// recorder.
type watchProc struct {
	proc        *kadmitproc.Process
	metricsAddr string
	scr         *watchprobe.Scraper
	events      *watchprobe.EventRecorder
}

// startWatch starts `kadmit watch` against the routed cluster, waits for its
// /readyz and for it to hold the Lease (kadmit_watch_leader 1), and starts
// scraping and recording Events; everything ends with t.
func (e *env) startWatch(t *testing.T) *watchProc {
	t.Helper()
	if err := netns.AddLoopbackAddr(watchIP); err != nil {
		t.Fatal(err)
	}
	w := &watchProc{metricsAddr: net.JoinHostPort(watchIP, watchMetricsPort)}
	logFile, err := os.Create(filepath.Join(e.Tmp, "watch.log"))
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"watch",
		"--kubeconfig", e.Kubeconfig, "--namespace", systemNS, "--identity", watchIdentity,
		"--lease-name", watchLeaseName,
		"--lease-duration", watchLeaseDuration.String(), "--renew-deadline", watchRenewDeadline.String(), "--retry-period", watchRetryPeriod.String(),
		"--metrics-addr", w.metricsAddr,
		"--handshake-interval", watchHandshakeInterval.String(), "--debounce", watchDebounce.String(),
		"--log-format", "json",
	}
	// kadmitproc wants an admission address for its WebhookURL; the watch
	// has none, and nothing here uses it.
	w.proc, err = kadmitproc.Start(kadmitproc.Options{Binary: e.Binary, Addr: w.metricsAddr, MetricsAddr: w.metricsAddr, Args: args, Log: logFile})
	if err != nil {
		t.Fatal(err)
	}
	go func() { <-w.proc.Exited(); _ = logFile.Close() }()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kadmit watch's last log lines:\n%s", w.proc.Tail(40))
		}
		if _, _, err := w.proc.Terminate(15 * time.Second); err != nil {
			t.Errorf("stopping kadmit watch: %v", err)
		}
	})
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	if err := w.proc.WaitReady(ctx); err != nil {
		t.Fatalf("kadmit watch not ready: %v\n%s", err, w.proc.Tail(30))
	}
	w.events = watchprobe.StartEventRecorder(t, e.Client, "", 0)
	// The labels the chart's ServiceMonitor gives the watch's series.
	target := watchprobe.Target{URL: "http://" + w.metricsAddr + "/metrics", Labels: map[string]string{"job": "kadmit-watch-metrics",
		"service": "kadmit-watch-metrics", "namespace": systemNS, "pod": watchIdentity, "container": "watch", "endpoint": "metrics", "instance": w.metricsAddr}}
	w.scr = watchprobe.StartScraper(t, watchprobe.StaticTargets(target), watchprobe.ScraperOptions{})
	eventually(t, watchLeaseDuration+20*time.Second, "kadmit watch leads (kadmit_watch_leader 1)", func() error {
		s := w.scr.Latest()
		if s == nil || s.Err != nil {
			return fmt.Errorf("no scrape yet: %v", s)
		}
		if v, ok := s.Value("kadmit_watch_leader", nil); !ok || v != 1 {
			return fmt.Errorf("kadmit_watch_leader %v (present %v)", v, ok)
		}
		return nil
	})
	return w
}
