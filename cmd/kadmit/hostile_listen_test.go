package main

// Issue 20, point 4: the metrics/health listener had no connection bound;
// 8,650 idle unauthenticated TLS connections in 11 s took kadmit to its
// OOM kill. This runs that flood, bounded (cap+200 connections, under
// 20 s), against a real `kadmit serve --metrics-secure` and asserts the
// bound: connections beyond --metrics-max-connections are closed, RSS stays
// flat, and the kubelet's probe (another address) answers during the flood
// and after it.

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"testing"
	"time"
)

// startSecureMetrics runs kadmit with --metrics-secure and ours; the
// kubeconfig points at a closed port: metrics authentication builds its
// client at start but calls the API server only for /metrics, which this
// test never requests.
func startSecureMetrics(t *testing.T, ours ...string) *kadmitProc {
	t.Helper()
	return startWith(t, true, nil, ours)
}

// startWith runs kadmit serve with a 1s shutdown grace, the metrics
// listener secure or plain, the flags common to every binary and, for
// this one, ours (see startServe).
func startWith(t *testing.T, secure bool, common, ours []string) *kadmitProc {
	t.Helper()
	return startServe(t, serveOptions{grace: time.Second, secure: secure, common: common, ours: ours})
}

// probeClient probes as the kubelet does (k8s.io/kubernetes pkg/probe/http:
// a fresh connection per probe, certificate not verified), from the
// loopback address src.
func probeClient(src string) func(url string) (int, error) {
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // the kubelet's probes do not verify either
		DialContext:       (&net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}).DialContext,
	}}
	return func(url string) (int, error) {
		resp, err := c.Get(url)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
}

func TestHostileMetricsConnectionFlood(t *testing.T) {
	const limit = 64
	p := startSecureMetrics(t, fmt.Sprintf("--metrics-max-connections=%d", limit))
	probe := probeClient("127.0.0.1")
	base := p.rssBytes()

	// The attacker, from 127.0.0.2: limit+200 idle TLS connections, each
	// handshaken and then silent, as fast as it can for at most 15 s.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}},
		Config: &tls.Config{InsecureSkipVerify: true}} //nolint:gosec // an attacker verifies nothing
	var flood []net.Conn
	defer func() {
		for _, c := range flood {
			c.Close()
		}
	}()
	probesDuring, probeFailures := 0, 0
	var peak int64
	start := time.Now()
	for i := 0; i < limit+200 && ctx.Err() == nil; i++ {
		if c, err := d.DialContext(ctx, "tcp", p.metrics); err == nil {
			flood = append(flood, c)
		}
		if i%40 == 39 {
			probesDuring++
			if code, err := probe("https://" + p.metrics + "/healthz"); err != nil || code != 200 {
				probeFailures++
				t.Logf("probe during the flood (%d connections opened): %d %v", len(flood), code, err)
			}
			peak = max(peak, p.rssBytes())
		}
	}
	t.Logf("flood: %d of %d TLS handshakes completed in %s", len(flood), limit+200, time.Since(start).Round(time.Millisecond))
	peak = max(peak, p.peakRSS(time.Second))

	// Connections beyond the bound were closed: at most limit of the
	// flood's are still open (a read blocks instead of ending).
	open := 0
	for _, c := range flood {
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		if _, err := c.Read(make([]byte, 1)); err != nil && os.IsTimeout(err) {
			open++
		}
	}
	t.Logf("flood connections still open: %d (bound %d); RSS %d MiB before, peak %d MiB; %d of %d probes during the flood failed",
		open, limit, base>>20, peak>>20, probeFailures, probesDuring)
	if open > limit {
		t.Errorf("%d flood connections open, more than --metrics-max-connections=%d", open, limit)
	}
	if probeFailures > 0 {
		t.Errorf("%d of %d /healthz probes from another address failed during the flood", probeFailures, probesDuring)
	}
	// 64 idle TLS connections cost about 2 MiB; 264 unbounded ones about
	// 8 MiB, and the attack only stops at the OOM kill. Allow 16 MiB for the
	// runtime's own growth (goroutines, handshake garbage).
	if grow := peak - base; grow > 16<<20 {
		t.Errorf("RSS grew %d MiB under the flood", grow>>20)
	}

	// The flood stops; the probe answers, the process lives.
	for _, c := range flood {
		c.Close()
	}
	flood = nil
	if code, err := probe("https://" + p.metrics + "/healthz"); err != nil || code != 200 {
		t.Fatalf("/healthz after the flood: %d %v", code, err)
	}
	if code, err := probe("https://" + p.metrics + "/readyz"); err != nil || code != 200 {
		t.Fatalf("/readyz after the flood: %d %v", code, err)
	}
	select {
	case <-p.done:
		t.Fatalf("kadmit exited: %v", p.err)
	default:
	}
}
