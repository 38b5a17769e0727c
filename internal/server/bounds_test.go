package server

// Tests for the fixed bounds of docs/security.md's "Bounds" table that no
// other test pins: header size, handshake and header timeouts, the
// metrics listener's read timeout, and the HTTP/2 settings kadmit
// advertises.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/jsonedit"
	"github.com/kadmit/kadmit/internal/testkit"
)

// rawRequest sends a request with one header of n bytes on a fresh
// connection and returns the status code kadmit answers.
func rawRequest(t *testing.T, c net.Conn, method, path string, n int) int {
	t.Helper()
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(wait))
	fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: k\r\nX-Big: %s\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", method, path, strings.Repeat("a", n))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("%s with a %d-byte header: %v", path, n, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestHeaderBytesBound: both listeners answer 431 to request headers
// beyond 64 KiB (net/http allows 4 KiB of slack over MaxHeaderBytes), and
// read headers up to that.
func TestHeaderBytesBound(t *testing.T) {
	ts := start(t, Options{Webhooks: []*admission.Webhook{webhook(t, "p", "/validate", allowAll)}}, true)
	dialWebhook := func() net.Conn {
		c, err := ts.dialTLS(nil)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	dialMetrics := func() net.Conn {
		c, err := net.DialTimeout("tcp", ts.MetricsAddr().String(), wait)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	for _, l := range []struct {
		name, method, path string
		dial               func() net.Conn
	}{{"webhook", "POST", "/validate", dialWebhook}, {"metrics", "GET", "/healthz", dialMetrics}} {
		// 56 KiB of headers are read (the request itself may be refused:
		// the webhook answers 400 to an empty body).
		if code := rawRequest(t, l.dial(), l.method, l.path, 56<<10); code == http.StatusRequestHeaderFieldsTooLarge {
			t.Errorf("%s: 56 KiB of headers answered 431, bound 64 KiB", l.name)
		}
		if code := rawRequest(t, l.dial(), l.method, l.path, 72<<10); code != http.StatusRequestHeaderFieldsTooLarge {
			t.Errorf("%s: 72 KiB of headers answered %d, want 431 (bound 64 KiB)", l.name, code)
		}
	}
}

// closedWithin waits for the server to close c and returns when it did,
// or -1 if c is still open at limit.
func closedWithin(c net.Conn, start time.Time, limit time.Duration) time.Duration {
	_ = c.SetReadDeadline(start.Add(limit))
	_, err := io.Copy(io.Discard, c)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return -1
	}
	return time.Since(start)
}

// TestHandshakeHeaderAndMetricsReadTimeouts: with a 60 s read timeout, a
// connection that never completes its TLS handshake or its request
// headers is closed after 10 s, on the webhook listener and on the
// metrics/health listener; a metrics request whose body stalls is closed
// after the metrics listener's 10 s read timeout.
func TestHandshakeHeaderAndMetricsReadTimeouts(t *testing.T) {
	ts := start(t, Options{ReadTimeout: time.Minute, Webhooks: []*admission.Webhook{webhook(t, "p", "/validate", allowAll)}}, true)
	dial := func(addr string) net.Conn {
		c, err := net.DialTimeout("tcp", addr, wait)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	start := time.Now()
	conns := map[string]net.Conn{}
	conns["webhook: no TLS handshake"] = dial(ts.Addr().String())
	tc, err := ts.dialTLS(nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tc.Close() })
	fmt.Fprint(tc, "POST /validate HTTP/1.1\r\nHost: k\r\n")
	conns["webhook: half-sent headers"] = tc
	conns["metrics: no request"] = dial(ts.MetricsAddr().String())
	mh := dial(ts.MetricsAddr().String())
	fmt.Fprint(mh, "GET /healthz HTTP/1.1\r\nHost: k\r\n")
	conns["metrics: half-sent headers"] = mh
	// Headers complete, 100 body bytes declared, none sent: the answer is
	// written, then reading the rest of the body waits for the read
	// timeout, not for ever.
	mb := dial(ts.MetricsAddr().String())
	fmt.Fprint(mb, "GET /healthz HTTP/1.1\r\nHost: k\r\nContent-Length: 100\r\n\r\n")
	conns["metrics: stalled body"] = mb

	const bound, margin = 10 * time.Second, 4 * time.Second
	var mu sync.Mutex
	closed := map[string]time.Duration{}
	var wg sync.WaitGroup
	for name, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := closedWithin(c, start, bound+margin)
			mu.Lock()
			closed[name] = d
			mu.Unlock()
		}()
	}
	wg.Wait()
	for name, d := range closed {
		switch {
		case d < 0:
			t.Errorf("%s: still open %s after it started, bound %s", name, bound+margin, bound)
		case d < bound-time.Second:
			t.Errorf("%s: closed after %s, before the %s bound", name, d.Round(10*time.Millisecond), bound)
		default:
			t.Logf("%s: closed after %s", name, d.Round(10*time.Millisecond))
		}
	}
}

// TestHTTP2Settings: with HTTP2 on, the server advertises 100 streams per
// connection, 16 KiB frames, a 64 KiB receive window per stream and per
// connection and 4 KiB header tables.
func TestHTTP2Settings(t *testing.T) {
	ts := start(t, Options{HTTP2: true, Webhooks: []*admission.Webhook{webhook(t, "p", "/validate", allowAll)}}, true)
	cfg := ts.client.Transport.(*http.Transport).TLSClientConfig.Clone()
	cfg.NextProtos = []string{"h2"}
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: wait}, "tcp", ts.Addr().String(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(wait))
	// The client preface and an empty SETTINGS frame (RFC 9113, 3.4).
	if _, err := c.Write(append([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), 0, 0, 0, 0x4, 0, 0, 0, 0, 0)); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	settings := map[uint16]uint32{}
	connWindow := uint32(65535) // RFC 9113, 6.9.2
	// The server's SETTINGS frame comes first, then its ACK of ours and,
	// with a connection window above the initial 65,535, a WINDOW_UPDATE
	// on stream 0 (in no fixed order): read frames until the server has
	// been quiet for 500 ms after its ACK.
	for seenSettings, acked := false, false; ; {
		if acked {
			_ = c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		}
		var h [9]byte
		if _, err := io.ReadFull(r, h[:]); err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() && acked && r.Buffered() == 0 {
				break
			}
			t.Fatalf("reading frames: %v", err)
		}
		n := int(h[0])<<16 | int(h[1])<<8 | int(h[2])
		typ, flags, stream := h[3], h[4], binary.BigEndian.Uint32(h[5:])&0x7fffffff
		payload := make([]byte, n)
		if _, err := io.ReadFull(r, payload); err != nil {
			t.Fatal(err)
		}
		switch {
		case typ == 0x4 && flags&0x1 == 0: // SETTINGS
			for i := 0; i+6 <= n; i += 6 {
				settings[binary.BigEndian.Uint16(payload[i:])] = binary.BigEndian.Uint32(payload[i+2:])
			}
			seenSettings = true
		case typ == 0x8 && stream == 0: // WINDOW_UPDATE for the connection
			connWindow += binary.BigEndian.Uint32(payload) & 0x7fffffff
		case typ == 0x4: // the ACK of our SETTINGS
			if !seenSettings {
				t.Fatal("ACK before the server's SETTINGS")
			}
			acked = true
		}
	}
	const (
		headerTableSize      = 0x1
		maxConcurrentStreams = 0x3
		initialWindowSize    = 0x4
		maxFrameSize         = 0x5
	)
	for id, want := range map[uint16]uint32{maxConcurrentStreams: 100, maxFrameSize: 16 << 10, initialWindowSize: 64 << 10, headerTableSize: 4 << 10} {
		got, ok := settings[id]
		if id == maxFrameSize && !ok {
			got = 16 << 10 // RFC 9113's default, which Go's server does not repeat
		}
		if id == headerTableSize && !ok {
			got = 4 << 10 // the default
		}
		if got != want {
			t.Errorf("SETTINGS 0x%x = %d, want %d (all: %v)", id, got, want, settings)
		}
	}
	// 64 KiB is one byte over HTTP/2's initial 65,535; Go's server batches
	// window updates that small away, so either is the bound.
	if connWindow != 64<<10 && connWindow != 65535 {
		t.Errorf("connection receive window %d, want 64 KiB", connWindow)
	}
}

// TestWriteTimeout: an answer the client does not read is given up on
// after the read timeout plus 5 s, and the connection closed; the writing
// goroutine and the answer's bytes do not wait for the client for ever.
func TestWriteTimeout(t *testing.T) {
	// A 12 MB patch: far more than the loopback socket buffers hold
	// between a server and a client with a 4 KiB receive buffer.
	big := jsonedit.Op{Op: "add", Path: "/metadata/annotations", Value: json.RawMessage(`{"a":"` + strings.Repeat("x", 12<<20) + `"}`)}
	whs, err := admission.NewWebhooks([]admission.Hook{{Policy: "big", Path: "/mutate", Type: admission.Mutating, Rules: podRules,
		Mutator: admission.MutatorFunc(func(context.Context, *admission.Request) ([]jsonedit.Op, admission.Verdict) {
			return []jsonedit.Op{big}, admission.Allow()
		})}})
	if err != nil {
		t.Fatal(err)
	}
	const readTimeout = time.Second
	ts := start(t, Options{ReadTimeout: readTimeout, Webhooks: whs}, true)
	cfg := ts.client.Transport.(*http.Transport).TLSClientConfig.Clone()
	cfg.NextProtos = []string{"http/1.1"}
	d := &net.Dialer{Timeout: wait, Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4<<10) }); err != nil {
			return err
		}
		return serr
	}}
	c, err := tls.DialWithDialer(d, "tcp", ts.Addr().String(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body := reviewBody("u", "p")
	sent := time.Now()
	fmt.Fprintf(c, "POST /mutate HTTP/1.1\r\nHost: k\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	// Read nothing for longer than the write timeout, then everything.
	writeTimeout := readTimeout + 5*time.Second
	time.Sleep(writeTimeout + 2*time.Second)
	_ = c.SetReadDeadline(time.Now().Add(wait))
	n, err := io.Copy(io.Discard, c)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("the whole answer (%d bytes) waited %s for a client that did not read; write timeout %s", n, time.Since(sent).Round(time.Second), writeTimeout)
	}
	if n >= 12<<20 {
		t.Fatalf("%d bytes delivered after the write timeout, the whole answer", n)
	}
	t.Logf("connection closed with %d bytes of the answer delivered (%v)", n, err)
}

// TestMetricsListenerTimeouts pins the metrics/health listener's fixed
// write and idle timeouts (60 s: a default 30 s CPU profile fits; 90 s
// idle), which a test would otherwise wait a minute or more for.
func TestMetricsListenerTimeouts(t *testing.T) {
	ts := start(t, Options{}, true)
	if ts.plain.WriteTimeout != 60*time.Second || ts.plain.IdleTimeout != 90*time.Second {
		t.Fatalf("metrics listener write timeout %s, idle %s; docs/security.md says 60s and 90s", ts.plain.WriteTimeout, ts.plain.IdleTimeout)
	}
}

// TestLogThrottle: client-caused log lines are written 20 at once, then 10
// a second; the next line written carries the count dropped.
func TestLogThrottle(t *testing.T) {
	var buf bytes.Buffer
	l := slog.New(slog.NewTextHandler(&buf, nil))
	th := newThrottle()
	for i := 0; i < 100; i++ {
		th.log(context.Background(), l, slog.LevelWarn, "bad request")
	}
	if n := strings.Count(buf.String(), "\n"); n > 21 || n < 20 {
		t.Fatalf("%d lines of 100 at once, want the burst of 20", n)
	}
	buf.Reset()
	time.Sleep(time.Second)
	for i := 0; i < 100; i++ {
		th.log(context.Background(), l, slog.LevelWarn, "bad request")
	}
	out := buf.String()
	if n := strings.Count(out, "\n"); n > 15 || n < 9 { // a late wake-up adds a few
		t.Fatalf("%d lines of 100 a second later, want about 10", n)
	}
	if !strings.Contains(strings.SplitN(out, "\n", 2)[0], "suppressed=") {
		t.Fatalf("the first line after drops does not count them: %q", strings.SplitN(out, "\n", 2)[0])
	}
}

// TestStalledBodyAnswered408: a body that stalls past the read timeout is
// answered 408 when the client still reads, then the connection closed.
func TestStalledBodyAnswered408(t *testing.T) {
	ts := start(t, Options{ReadTimeout: time.Second, Webhooks: []*admission.Webhook{webhook(t, "p", "/validate", allowAll)}}, true)
	// net/http counts the read timeout from the end of the handshake (of
	// the previous request), before the request's first byte.
	start := time.Now()
	c, err := ts.dialTLS(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprint(c, "POST /validate HTTP/1.1\r\nHost: k\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n{\"apiVersion\":")
	_ = c.SetReadDeadline(time.Now().Add(wait))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer to a stalled body: %v", err)
	}
	resp.Body.Close()
	if took := time.Since(start); resp.StatusCode != http.StatusRequestTimeout || took < 900*time.Millisecond || took > 6*time.Second {
		t.Fatalf("stalled body: HTTP %d after %s, want 408 after the 1s read timeout", resp.StatusCode, took)
	}
}

// TestHTTP2StreamTakesInFlightSlot: with HTTP/2, every stream is a
// request held to --max-in-flight like an HTTP/1.1 request.
func TestHTTP2StreamTakesInFlightSlot(t *testing.T) {
	ts := start(t, Options{HTTP2: true, MaxInFlight: 2, ReadTimeout: 20 * time.Second, Webhooks: []*admission.Webhook{webhook(t, "p", "/validate", allowAll)}}, true)
	var protos http.Protocols
	protos.SetHTTP2(true)
	tr := &http.Transport{TLSClientConfig: ts.client.Transport.(*http.Transport).TLSClientConfig.Clone(), Protocols: &protos}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	// Two streams on one connection send a first byte of their body and stall.
	for i := 0; i < 2; i++ {
		pr, pw := io.Pipe()
		wg.Add(2)
		go func() { defer wg.Done(); _, _ = pw.Write([]byte("{")); <-ctx.Done(); pw.CloseWithError(ctx.Err()) }()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ts.base+"/validate", pr)
		req.ContentLength = 5000
		req.Header.Set("Content-Type", "application/json")
		go func() {
			defer wg.Done()
			if resp, err := tr.RoundTrip(req); err == nil {
				resp.Body.Close()
			}
		}()
	}
	testkit.Eventually(t, wait, "two streams in flight", func() bool { return ts.limits.InFlight() == 2 })
	req, _ := http.NewRequest(http.MethodPost, ts.base+"/validate", bytes.NewReader(reviewBody("u", "p")))
	req.Header.Set("Content-Type", "application/json")
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.ProtoMajor != 2 || resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("a third stream beyond --max-in-flight 2: HTTP/%d %d %s", resp.ProtoMajor, resp.StatusCode, body)
	}
}
