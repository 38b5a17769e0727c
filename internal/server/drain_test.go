package server

import (
	"crypto/tls"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kadmit/kadmit/pkg/webhookcerts"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/testkit"
)

// TestShutdownDrain: for Options.Drain after shutdown starts, the server
// fails /readyz but keeps answering, on pooled connections and on new ones
// (kube-proxy still routes here while every replica terminates), and each
// HTTP/1 answer closes its connection, so a client never writes a review
// into a connection the server is closing; then the listener closes and
// Serve returns nil. Without the drain the first POST after cancel fails
// (EOF, refused), which is what a real cluster showed during rollouts.
func TestShutdownDrain(t *testing.T) {
	const drain = 1500 * time.Millisecond
	ts := start(t, Options{Webhooks: []*admission.Webhook{webhook(t, "test", "/validate", allowAll)}, ShutdownGrace: wait, Drain: drain}, true)
	// A pooled connection, as the API server keeps one.
	if resp, _, err := ts.post("/validate", reviewBody("u0", "p")); err != nil || resp.StatusCode != 200 || resp.Close {
		t.Fatalf("before shutdown: %v %+v", err, resp)
	}
	began := time.Now()
	ts.cancel()
	testkit.Eventually(t, wait, "not ready", func() bool { return ts.Ready() != nil })
	if err := ts.Ready(); err.Error() != "shutting down" {
		t.Fatalf("Ready while draining: %v", err)
	}
	resp, _, err := ts.post("/validate", reviewBody("u1", "p"))
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("a review on the pooled connection while draining: %v %+v", err, resp)
	}
	// net/http's client turns "Connection: close" into resp.Close (and
	// drops the header).
	if !resp.Close {
		t.Error("answer while draining does not close its connection")
	}
	// A new connection, from a new client, is accepted and answered too.
	fresh := &http.Client{Timeout: wait, Transport: &http.Transport{TLSClientConfig: ts.client.Transport.(*http.Transport).TLSClientConfig.Clone(), DisableKeepAlives: false}}
	defer fresh.CloseIdleConnections()
	resp2, err := fresh.Post(ts.base+"/validate", "application/json", strings.NewReader(string(reviewBody("u2", "p"))))
	if err != nil || resp2.StatusCode != 200 {
		t.Fatalf("a new connection while draining: %v %+v", err, resp2)
	}
	resp2.Body.Close()
	if !resp2.Close {
		t.Error("answer on a new connection while draining does not close it")
	}
	if time.Since(began) >= drain {
		t.Fatalf("the checks above took %s, longer than the drain: the test proves nothing on this machine", time.Since(began))
	}
	// After the drain the listener closes and Serve returns.
	testkit.Eventually(t, wait, "the admission listener to close", func() bool {
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", ts.Addr().String(), &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // only whether it accepts
		if err != nil {
			return true
		}
		c.Close()
		return false
	})
	if took := time.Since(began); took < drain {
		t.Errorf("listener closed %s after shutdown began, before the %s drain", took, drain)
	}
	select {
	case err := <-ts.done:
		if err != nil {
			t.Fatalf("Serve = %v", err)
		}
		ts.done <- nil
	case <-time.After(wait):
		t.Fatal("Serve did not return after the drain")
	}
}

// TestDrainBounds: a drain must be shorter than the grace it counts against.
func TestDrainBounds(t *testing.T) {
	for _, d := range []time.Duration{-time.Second, 30 * time.Second, time.Minute} {
		_, err := New(Options{Certs: &webhookcerts.Holder{}, ShutdownGrace: 30 * time.Second, Drain: d})
		if err == nil || !strings.Contains(err.Error(), "drain") {
			t.Errorf("Drain %s with a 30s grace: %v, want the drain refused", d, err)
		}
	}
}

// TestDrainAllowed: a drain shorter than the grace builds a server.
func TestDrainAllowed(t *testing.T) {
	if _, err := New(Options{Certs: &webhookcerts.Holder{}, ShutdownGrace: 30 * time.Second, Drain: 12 * time.Second}); err != nil {
		t.Fatal(err)
	}
}
