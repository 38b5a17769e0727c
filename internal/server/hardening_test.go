package server

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kadmit/kadmit/pkg/webhookcerts"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/testkit"
)

// dialTLS completes a handshake with the test server, or returns why not.
func (ts *testServer) dialTLS(cert *tls.Certificate) (*tls.Conn, error) {
	cfg := ts.client.Transport.(*http.Transport).TLSClientConfig.Clone()
	cfg.NextProtos = []string{"http/1.1"}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: wait}, "tcp", ts.Addr().String(), cfg)
	if err != nil {
		return nil, err
	}
	// TLS 1.3 reports a refused client certificate on the first read.
	_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if _, err := c.Read(make([]byte, 1)); err != nil && !os.IsTimeout(err) {
		c.Close()
		return nil, err
	}
	_ = c.SetReadDeadline(time.Time{})
	return c, nil
}

func metric(t *testing.T, ts *testServer, line string) bool {
	_, m := get(t, &http.Client{Timeout: wait}, ts.plainURL+"/metrics")
	return strings.Contains(m, line)
}

func TestConnectionLimit(t *testing.T) {
	ts := start(t, Options{MaxConnections: 3, Webhooks: []*admission.Webhook{webhook(t, "p", "/validate", allowAll)}}, true)
	var open []*tls.Conn
	for i := 0; i < 3; i++ {
		c, err := ts.dialTLS(nil)
		if err != nil {
			t.Fatalf("connection %d of 3: %v", i+1, err)
		}
		defer c.Close()
		open = append(open, c)
	}
	if c, err := ts.dialTLS(nil); err == nil {
		c.Close()
		t.Fatal("a fourth connection was served beyond MaxConnections 3")
	}
	testkit.Eventually(t, wait, "the refusal to be counted", func() bool { return metric(t, ts, `kadmit_server_refused_total{limit="connections"} 1`) })
	open[0].Close()
	testkit.Eventually(t, wait, "a freed slot", func() bool {
		c, err := ts.dialTLS(nil)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

func TestInFlightLimitAndAbandonedReviews(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	defer once.Do(func() { close(release) })
	// The policy ignores its context: every review is abandoned at its
	// deadline. The first gives its in-flight slot back at its answer
	// (MaxAbandonedReviews 1); the next three keep theirs until they
	// return.
	ts := start(t, Options{MaxInFlight: 3, MaxAbandonedReviews: 1, Webhooks: []*admission.Webhook{
		webhook(t, "stuck", "/stuck", func(context.Context, *admission.Request) admission.Verdict { <-release; return admission.Allow() }),
	}}, true)
	for i := 0; i < 4; i++ {
		resp, body, err := ts.post("/stuck?timeout=200ms", reviewBody(fmt.Sprint("u", i), "p"))
		if err != nil || resp.StatusCode != http.StatusInternalServerError || !strings.Contains(string(body), "no decision before the deadline") {
			t.Fatalf("review %d: %v %v %s", i, resp, err, body)
		}
	}
	if got, in := ts.limits.Abandoned(), ts.limits.InFlight(); got != 4 || in != 3 {
		t.Fatalf("abandoned reviews = %d, in flight %d, want 4 and 3", got, in)
	}
	resp, body, err := ts.post("/stuck?timeout=200ms", reviewBody("u4", "p"))
	if err != nil || resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "3 of them reviews still running past their deadline") {
		t.Fatalf("beyond MaxInFlight: %v %v %s", resp, err, body)
	}
	testkit.Eventually(t, wait, "metrics", func() bool {
		return metric(t, ts, `kadmit_server_refused_total{limit="in-flight"} 1`) && metric(t, ts, "kadmit_server_abandoned_reviews 4") &&
			metric(t, ts, "kadmit_server_abandoned_reviews_total 4")
	})
	once.Do(func() { close(release) })
	testkit.Eventually(t, wait, "the abandoned reviews to end", func() bool { return ts.limits.Abandoned() == 0 && ts.limits.InFlight() == 0 })
	if ts.limits.BodyBytes() != 0 || ts.limits.AbandonedBytes() != 0 {
		t.Fatalf("body bytes still reserved: %d, abandoned %d", ts.limits.BodyBytes(), ts.limits.AbandonedBytes())
	}
	testkit.Eventually(t, wait, "the time abandoned reviews ran", func() bool {
		return metric(t, ts, `kadmit_server_abandoned_review_seconds_count{webhook="/stuck"} 4`)
	})
	if resp, _, err := ts.post("/stuck", reviewBody("u5", "p")); err != nil || resp.StatusCode != 200 {
		t.Fatalf("after the abandoned reviews returned: %v %v", resp, err)
	}
}

func TestBodyBytesLimit(t *testing.T) {
	ts := start(t, Options{MaxBodyBytesInFlight: 48 << 10, Webhooks: []*admission.Webhook{webhook(t, "p", "/validate", allowAll)}}, true)
	// A holds 32 KiB of buffer (16 KiB grown once) with 20 KiB sent.
	a, err := ts.dialTLS(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	fmt.Fprintf(a, "POST /validate HTTP/1.1\r\nHost: k\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n%s", strings.Repeat(" ", 20<<10))
	testkit.Eventually(t, wait, "A's reservation", func() bool { return ts.limits.BodyBytes() == 32<<10 })
	// B fits its first 16 KiB, not the growth after it.
	b, err := ts.dialTLS(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	fmt.Fprintf(b, "POST /validate HTTP/1.1\r\nHost: k\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n%s", strings.Repeat(" ", 20<<10))
	_ = b.SetReadDeadline(time.Now().Add(wait))
	resp, err := http.ReadResponse(bufioReader(b), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "request bodies buffered at once") {
		t.Fatalf("B: %d %s", resp.StatusCode, body)
	}
	a.Close()
	testkit.Eventually(t, wait, "the budget to be returned", func() bool { return ts.limits.BodyBytes() == 0 })
	if resp, _, err := ts.post("/validate", reviewBody("u", "p")); err != nil || resp.StatusCode != 200 {
		t.Fatalf("after the budget was returned: %v %v", resp, err)
	}
}

// testCA is a client-certificate CA for the mutual TLS tests.
type testCA struct {
	cert *x509.Certificate
	key  any
	pem  []byte
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	cert, key, err := webhookcerts.NewCA(time.Now(), time.Hour, webhookcerts.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})}
}

func (ca *testCA) client(t *testing.T, cn string) *tls.Certificate {
	t.Helper()
	key, err := webhookcerts.GenerateKey(webhookcerts.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(der)
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
}

func TestClientCertificates(t *testing.T) {
	ca, other := newTestCA(t), newTestCA(t)
	caFile := filepath.Join(t.TempDir(), "client-ca.crt")
	if err := os.WriteFile(caFile, ca.pem, 0o600); err != nil {
		t.Fatal(err)
	}
	ts := start(t, Options{ClientCAFile: caFile, ClientAllowedNames: []string{"kube-apiserver"},
		Webhooks: []*admission.Webhook{webhook(t, "p", "/validate", allowAll)}}, true)
	for _, tc := range []struct {
		name string
		cert *tls.Certificate
		ok   bool
	}{
		{"no certificate", nil, false},
		{"another CA", other.client(t, "kube-apiserver"), false},
		{"name not allowed", ca.client(t, "system:anonymous"), false},
		{"the API server's certificate", ca.client(t, "kube-apiserver"), true},
	} {
		c, err := ts.dialTLS(tc.cert)
		if (err == nil) != tc.ok {
			t.Errorf("%s: handshake error %v, want success %v", tc.name, err, tc.ok)
		}
		if c != nil {
			c.Close()
		}
	}
	// Each refusal is counted with its reason.
	for _, reason := range []string{"no-certificate", "untrusted", "name-not-allowed"} {
		line := `kadmit_server_client_certificates_refused_total{reason="` + reason + `"} 1`
		testkit.Eventually(t, wait, line, func() bool { return metric(t, ts, line) })
	}
	// The metrics listener (kubelet probes) asks for no certificate.
	if code, _ := get(t, &http.Client{Timeout: wait}, ts.plainURL+"/readyz"); code != 200 {
		t.Fatalf("readyz: %d", code)
	}
	// A rotated CA file is picked up without a restart.
	if err := os.WriteFile(caFile, other.pem, 0o600); err != nil {
		t.Fatal(err)
	}
	future := time.Now().Add(time.Minute)
	_ = os.Chtimes(caFile, future, future)
	if c, err := ts.dialTLS(other.client(t, "kube-apiserver")); err != nil {
		t.Fatalf("after rotating the client CA: %v", err)
	} else {
		c.Close()
	}

	if _, err := New(Options{Certs: &webhookcerts.Holder{}, ClientCAFile: filepath.Join(t.TempDir(), "missing")}); err == nil {
		t.Fatal("New with a missing client CA file succeeded")
	}
	if _, err := New(Options{Certs: &webhookcerts.Holder{}, ClientAllowedNames: []string{"x"}}); err == nil {
		t.Fatal("New with allowed names and no client CA succeeded")
	}
}

// TestClientCertificatesWithoutAllowedNames: --client-ca-file alone still
// refuses a client without a certificate, or with one of another CA.
func TestClientCertificatesWithoutAllowedNames(t *testing.T) {
	ca, other := newTestCA(t), newTestCA(t)
	caFile := filepath.Join(t.TempDir(), "client-ca.crt")
	if err := os.WriteFile(caFile, ca.pem, 0o600); err != nil {
		t.Fatal(err)
	}
	ts := start(t, Options{ClientCAFile: caFile, Webhooks: []*admission.Webhook{webhook(t, "p", "/validate", allowAll)}}, true)
	for _, tc := range []struct {
		name string
		cert *tls.Certificate
		ok   bool
	}{
		{"no certificate", nil, false},
		{"another CA", other.client(t, "kube-apiserver"), false},
		{"any name from the CA", ca.client(t, "anyone"), true},
	} {
		c, err := ts.dialTLS(tc.cert)
		if (err == nil) != tc.ok {
			t.Errorf("%s: handshake error %v, want success %v", tc.name, err, tc.ok)
		}
		if c != nil {
			c.Close()
		}
	}
	// TLS 1.3 tells a client without a certificate why (the API server
	// shows it in its "failed calling webhook" error).
	if _, err := ts.dialTLS(nil); err == nil || !strings.Contains(err.Error(), "certificate required") {
		t.Errorf("client without a certificate: %v, want certificate required", err)
	}
	// A review from a client without a certificate is never answered.
	cfg := ts.client.Transport.(*http.Transport).TLSClientConfig.Clone()
	c := &http.Client{Timeout: wait, Transport: &http.Transport{TLSClientConfig: cfg}}
	resp, err := c.Post(ts.base+"/validate", "application/json", strings.NewReader(string(reviewBody("u", "p"))))
	if err == nil {
		resp.Body.Close()
		t.Fatalf("a client without a certificate got HTTP %d", resp.StatusCode)
	}
	line := `kadmit_server_client_certificates_refused_total{reason="no-certificate"} 3`
	testkit.Eventually(t, wait, line, func() bool { return metric(t, ts, line) })
}

// TestHTTP2OptIn: the admission listener offers h2 only when asked.
func TestHTTP2OptIn(t *testing.T) {
	for _, on := range []bool{false, true} {
		ts := start(t, Options{HTTP2: on, Webhooks: []*admission.Webhook{webhook(t, "p", "/validate", allowAll)}}, true)
		cfg := ts.client.Transport.(*http.Transport).TLSClientConfig.Clone()
		cfg.NextProtos = []string{"h2", "http/1.1"}
		c, err := tls.Dial("tcp", ts.Addr().String(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		got := c.ConnectionState().NegotiatedProtocol
		c.Close()
		if want := map[bool]string{false: "http/1.1", true: "h2"}[on]; got != want {
			t.Errorf("HTTP2=%v: negotiated %q, want %q", on, got, want)
		}
	}
}

func bufioReader(r io.Reader) *bufio.Reader { return bufio.NewReader(r) }

// dialFrom opens a TCP connection to addr from the loopback address src
// (Linux routes all of 127/8 on lo), so one test can play several hosts.
func dialFrom(t *testing.T, src, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{Timeout: wait, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial from %s: %v", src, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedSoon reports whether the server closes c within d.
func closedSoon(c net.Conn, d time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(d))
	_, err := c.Read(make([]byte, 1))
	return err != nil && !os.IsTimeout(err)
}

// TestMetricsConnectionLimit: the metrics/health listener holds at most
// MetricsMaxConnections; a flood of idle connections from one address
// cannot lock out another address's probe.
func TestMetricsConnectionLimit(t *testing.T) {
	ts := start(t, Options{MetricsMaxConnections: 4, Webhooks: []*admission.Webhook{webhook(t, "p", "/validate", allowAll)}}, true)
	addr := ts.MetricsAddr().String()
	var flood []net.Conn
	for i := 0; i < 4; i++ {
		flood = append(flood, dialFrom(t, "127.0.0.2", addr))
	}
	testkit.Eventually(t, wait, "4 open metrics connections", func() bool { return ts.metricsLn.open.Load() == 4 })
	// A fifth from the same address is closed: it would only evict its own.
	if c := dialFrom(t, "127.0.0.2", addr); !closedSoon(c, time.Second) {
		t.Fatal("a fifth connection from the flooding address was kept beyond the bound of 4")
	}
	// A probe from another address gets in; the flood's oldest idle
	// connection made room.
	tr := &http.Transport{DisableKeepAlives: true, DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.1")}}).DialContext}
	probe := &http.Client{Timeout: wait, Transport: tr}
	for i := 0; i < 3; i++ {
		if code, _ := get(t, probe, ts.plainURL+"/healthz"); code != 200 {
			t.Fatalf("probe %d during the flood: HTTP %d", i, code)
		}
	}
	if !closedSoon(flood[0], time.Second) {
		t.Fatal("the flood's oldest connection was not closed to make room for the probe")
	}
	if n := ts.metricsLn.open.Load(); n > 4 {
		t.Fatalf("%d metrics connections open, bound 4", n)
	}
	if !metric(t, ts, `kadmit_server_metrics_open_connections_limit 4`) {
		t.Fatal("no kadmit_server_metrics_open_connections_limit 4")
	}
	_, m := get(t, probe, ts.plainURL+"/metrics")
	if !strings.Contains(m, `kadmit_server_refused_total{limit="metrics-connections"}`) || strings.Contains(m, `kadmit_server_refused_total{limit="metrics-connections"} 0`) {
		t.Fatal("metrics connections closed by the bound were not counted")
	}
}
