package server

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/kadmit/kadmit/internal/admission"
)

// apiServerClient is an HTTP client built as the API server builds its
// webhook client (k8s.io/apiserver v0.37.1 pkg/util/webhook/client.go
// hookClientConfig → rest.UnversionedRESTClientFor): client-go's transport
// with its defaults (25 idle connections per host, 90s idle timeout,
// keep-alive), trusting caPEM.
func apiServerClient(t *testing.T, caPEM []byte) *http.Client {
	t.Helper()
	c, err := rest.HTTPClientFor(&rest.Config{Host: "https://127.0.0.1", TLSClientConfig: rest.TLSClientConfig{CAData: caPEM}, QPS: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

// TestOneConnectionServesManyReviews: 200 reviews written one after
// another on one TLS connection (HTTP/1.1 keep-alive, as the API server's
// webhook client sends them) are all answered on it, none with
// "Connection: close", and the connection is still open after the last.
func TestOneConnectionServesManyReviews(t *testing.T) {
	ts := start(t, Options{Webhooks: []*admission.Webhook{webhook(t, "allow", "/validate", allowAll)}}, true)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ts.caPEM)
	conn, err := tls.Dial("tcp", ts.Addr().String(), &tls.Config{RootCAs: roots, NextProtos: []string{"http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(wait))
	br := bufio.NewReader(conn)
	const reviews = 200
	for i := range reviews {
		req, err := http.NewRequest(http.MethodPost, ts.base+"/validate?timeout=10s", bytes.NewReader(reviewBody(fmt.Sprintf("uid-%d", i), "p")))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		if err := req.Write(conn); err != nil {
			t.Fatalf("review %d: write: %v", i, err)
		}
		resp, err := http.ReadResponse(br, req)
		if err != nil {
			t.Fatalf("review %d: read answer: %v", i, err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || resp.Close || !bytes.Contains(body, []byte(fmt.Sprintf(`"uid":"uid-%d"`, i))) {
			t.Fatalf("review %d: HTTP %d, Connection: close %v, body %s, error %v", i, resp.StatusCode, resp.Close, body, err)
		}
	}
	if open := ts.connLn.open.Load(); open != 1 {
		t.Fatalf("after %d reviews the server counts %d open connections, want 1", reviews, open)
	}
}

// TestAPIServerClientReusesConnections: the API server's webhook client
// (client-go's transport) sends kadmit reviews on few connections: one at
// a time they share one connection (net/http may dial one more when the
// next request starts before the previous connection is back in its idle
// pool), and from several goroutines at once every connection serves many
// reviews. No answer asks the client to close.
func TestAPIServerClientReusesConnections(t *testing.T) {
	ts := start(t, Options{Webhooks: []*admission.Webhook{webhook(t, "allow", "/validate", allowAll)}}, true)
	client := apiServerClient(t, ts.caPEM)
	var handshakes atomic.Int64
	trace := &httptrace.ClientTrace{TLSHandshakeDone: func(tls.ConnectionState, error) { handshakes.Add(1) }}
	review := func(i int) error {
		ctx := httptrace.WithClientTrace(context.Background(), trace)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, ts.base+"/validate?timeout=10s", bytes.NewReader(reviewBody(fmt.Sprintf("uid-%d", i), "p")))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		// rest.Request.Do reads the whole answer, which returns the
		// connection to the pool.
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK || resp.Close {
			return fmt.Errorf("review %d: HTTP %d, Connection: close %v", i, resp.StatusCode, resp.Close)
		}
		return nil
	}

	const sequential = 200
	for i := range sequential {
		if err := review(i); err != nil {
			t.Fatal(err)
		}
	}
	if h := handshakes.Load(); h > 3 {
		t.Fatalf("%d sequential reviews: %d TLS handshakes, want at most 3", sequential, h)
	}

	const concurrent, each = 8, 25
	var wg sync.WaitGroup
	errs := make(chan error, concurrent)
	for g := range concurrent {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if err := review(sequential + g*each + i); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if h := handshakes.Load(); h > concurrent*each/4 {
		t.Fatalf("%d reviews from %d goroutines: %d TLS handshakes in all, want each connection to serve at least 4", concurrent*each, concurrent, h)
	}
}

// TestIdleTimeoutOutlastsAPIServerClient: kadmit keeps an idle connection
// longer than the API server's webhook client does, so the client, not
// kadmit, closes it (see IdleTimeout).
func TestIdleTimeoutOutlastsAPIServerClient(t *testing.T) {
	ts := start(t, Options{}, true)
	tr, ok := apiServerClient(t, ts.caPEM).Transport.(interface{ WrappedRoundTripper() http.RoundTripper })
	var clientIdle = http.DefaultTransport.(*http.Transport).IdleConnTimeout
	if ok {
		if h, ok := tr.WrappedRoundTripper().(*http.Transport); ok {
			clientIdle = h.IdleConnTimeout
		}
	}
	if clientIdle <= 0 || ts.https.IdleTimeout <= clientIdle {
		t.Fatalf("kadmit idle timeout %v, API server client's %v: kadmit's must be longer", ts.https.IdleTimeout, clientIdle)
	}
}
