package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kadmit/kadmit/pkg/webhookcerts"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/certs"
	"github.com/kadmit/kadmit/internal/testkit"
)

// wait bounds every poll in these tests; nothing is expected to take long.
const wait = 10 * time.Second

var podRules = []admissionregistrationv1.RuleWithOperations{{
	Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
	Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
}}

func webhook(t *testing.T, policy, path string, v func(context.Context, *admission.Request) admission.Verdict) *admission.Webhook {
	t.Helper()
	whs, err := admission.NewWebhooks([]admission.Hook{{Policy: policy, Path: path, Type: admission.Validating, Rules: podRules, Validator: admission.ValidatorFunc(v)}})
	if err != nil {
		t.Fatal(err)
	}
	return whs[0]
}

func allowAll(context.Context, *admission.Request) admission.Verdict { return admission.Allow() }

type testServer struct {
	*Server
	holder   *webhookcerts.Holder
	cert     *tls.Certificate
	caPEM    []byte       // the test CA
	client   *http.Client // HTTPS, trusts the test CA
	cancel   context.CancelFunc
	done     chan error
	base     string // https://127.0.0.1:port
	plainURL string // http://127.0.0.1:port
}

// start runs a Server on loopback with a self-signed certificate. With
// loadCert false the holder stays empty.
func start(t *testing.T, opts Options, loadCert bool) *testServer {
	t.Helper()
	b, err := certs.NewSelfSigned(certs.SelfSignedOptions{IPs: []net.IP{net.ParseIP("127.0.0.1")}})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := b.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	holder := &webhookcerts.Holder{}
	if loadCert {
		holder.Set(cert)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(b.CACert) {
		t.Fatal("bad CA PEM")
	}
	opts.Addr, opts.Certs = "127.0.0.1:0", holder
	if opts.MetricsAddr == "" {
		opts.MetricsAddr = "127.0.0.1:0"
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ts := &testServer{
		Server: s, holder: holder, cert: cert, caPEM: b.CACert, cancel: cancel, done: make(chan error, 1),
		client: &http.Client{Timeout: wait, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}},
		base:   "https://" + s.Addr().String(),
	}
	if a := s.MetricsAddr(); a != nil {
		ts.plainURL = "http://" + a.String()
	}
	go func() { ts.done <- s.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-ts.done:
		case <-time.After(wait):
			t.Error("Serve did not return after cancel")
		}
		ts.client.CloseIdleConnections()
	})
	// Serve marks the server serving right after it starts; wait for it.
	testkit.Eventually(t, wait, "the server to start serving", s.serving.Load)
	return ts
}

// reviewBody is an AdmissionReview v1 CREATE of pod default/name.
func reviewBody(uid, name string) []byte {
	pod := fmt.Sprintf(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":%q,"namespace":"default"}}`, name)
	return testkit.ReviewBody(testkit.PodRequest(admissionv1.Create, pod, "",
		testkit.UID(types.UID(uid)), testkit.Namespace("default"), testkit.Name(name)))
}

func (ts *testServer) post(path string, body []byte) (*http.Response, []byte, error) {
	resp, err := ts.client.Post(ts.base+path, "application/json", bytes.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, b, err
}

func get(t *testing.T, c *http.Client, url string) (int, string) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func TestServeAdmissionAndHealth(t *testing.T) {
	ts := start(t, Options{Webhooks: []*admission.Webhook{
		webhook(t, "test", "/validate", func(_ context.Context, req *admission.Request) admission.Verdict {
			if strings.Contains(req.Name, "bad") {
				return admission.Deny("name %s is bad", req.Name)
			}
			return admission.Allow()
		}),
	}}, true)

	resp, body, err := ts.post("/validate", reviewBody("uid-1", "good"))
	if err != nil {
		t.Fatal(err)
	}
	var rev admission.Review
	if resp.StatusCode != 200 || json.Unmarshal(body, &rev) != nil || rev.Response == nil || string(rev.Response.UID) != "uid-1" || !rev.Response.Allowed {
		t.Fatalf("status %d body %s", resp.StatusCode, body)
	}
	if resp.TLS == nil || resp.TLS.Version < tls.VersionTLS12 {
		t.Fatalf("TLS state %+v", resp.TLS)
	}
	resp, body, err = ts.post("/validate", reviewBody("uid-2", "bad-pod"))
	if err != nil {
		t.Fatal(err)
	}
	rev = admission.Review{}
	if resp.StatusCode != 200 || json.Unmarshal(body, &rev) != nil || rev.Response.Allowed || rev.Response.Result.Code != 403 || rev.Response.Result.Message != "name bad-pod is bad" {
		t.Fatalf("denial: status %d body %s", resp.StatusCode, body)
	}

	plain := &http.Client{Timeout: wait}
	for _, u := range []string{ts.base, ts.plainURL} {
		c := ts.client
		if strings.HasPrefix(u, "http:") {
			c = plain
		}
		for _, p := range []string{"/healthz", "/readyz"} {
			if code, body := get(t, c, u+p); code != 200 || body != "ok\n" {
				t.Errorf("GET %s%s: %d %q", u, p, code, body)
			}
		}
	}
	if err := ts.Ready(); err != nil {
		t.Fatalf("Ready: %v", err)
	}
	// The admission port does not serve metrics.
	if code, _ := get(t, ts.client, ts.base+"/metrics"); code != http.StatusNotFound {
		t.Errorf("GET /metrics on the admission port: %d", code)
	}
	// Bad input is counted too.
	resp, err = ts.client.Post(ts.base+"/validate", "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnsupportedMediaType {
		t.Fatalf("text/plain: %d", resp.StatusCode)
	}

	for _, want := range []string{
		`kadmit_admission_requests_total{allowed="true",code="200",operation="CREATE",webhook="/validate"} 1`,
		`kadmit_admission_requests_total{allowed="false",code="200",operation="CREATE",webhook="/validate"} 1`,
		`kadmit_admission_requests_total{allowed="",code="415",operation="",webhook="/validate"} 1`,
		`kadmit_admission_duration_seconds_count{operation="CREATE",webhook="/validate"} 2`,
		`kadmit_admission_in_flight_requests{webhook="/validate"} 0`,
		"go_goroutines ",
	} {
		testkit.Eventually(t, wait, want, func() bool {
			_, m := get(t, plain, ts.plainURL+"/metrics")
			return strings.Contains(m, want)
		})
	}
}

func TestPanicMetrics(t *testing.T) {
	ts := start(t, Options{Webhooks: []*admission.Webhook{
		webhook(t, "panicky", "/panic", func(context.Context, *admission.Request) admission.Verdict { panic("boom") }),
	}}, true)
	resp, body, err := ts.post("/panic", reviewBody("uid-p", "p"))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusInternalServerError || !strings.Contains(string(body), "policy panicky panicked: boom") {
		t.Fatalf("status %d body %q", resp.StatusCode, body)
	}
	plain := &http.Client{Timeout: wait}
	for _, want := range []string{
		`kadmit_admission_panics_total{policy="panicky",webhook="/panic"} 1`,
		`kadmit_admission_requests_total{allowed="",code="500",operation="CREATE",webhook="/panic"} 1`,
	} {
		testkit.Eventually(t, wait, want, func() bool {
			_, m := get(t, plain, ts.plainURL+"/metrics")
			return strings.Contains(m, want)
		})
	}
	// The server keeps serving after a panic.
	if code, _ := get(t, ts.client, ts.base+"/healthz"); code != 200 {
		t.Fatalf("healthz after panic: %d", code)
	}
}

func TestReadyzWithoutCertificate(t *testing.T) {
	// Options.Ready is the whole condition, as the daemon composes it: here
	// the certificate check plus one more.
	var extra atomic.Pointer[error]
	var holder atomic.Pointer[webhookcerts.Holder]
	ts := start(t, Options{
		Webhooks: []*admission.Webhook{webhook(t, "test", "/validate", allowAll)},
		Ready: func() error {
			if err := holder.Load().Check(time.Now()); err != nil {
				return err
			}
			if e := extra.Load(); e != nil {
				return *e
			}
			return nil
		},
	}, false)
	holder.Store(ts.holder)
	plain := &http.Client{Timeout: wait}
	code, body := get(t, plain, ts.plainURL+"/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, webhookcerts.ErrNoCertificate.Error()) {
		t.Fatalf("readyz without certificate: %d %q", code, body)
	}
	if code, _ := get(t, plain, ts.plainURL+"/healthz"); code != 200 {
		t.Fatalf("healthz without certificate: %d", code)
	}
	// No certificate, no handshake.
	if _, _, err := ts.post("/validate", reviewBody("u", "p")); err == nil {
		t.Fatal("HTTPS request succeeded without a certificate")
	}

	ts.holder.Set(ts.cert)
	if code, body := get(t, plain, ts.plainURL+"/readyz"); code != 200 {
		t.Fatalf("readyz after loading the certificate: %d %q", code, body)
	}
	if resp, _, err := ts.post("/validate", reviewBody("u", "p")); err != nil || resp.StatusCode != 200 {
		t.Fatalf("after loading the certificate: %v", err)
	}
	notSynced := errors.New("informer not synced")
	extra.Store(&notSynced)
	if code, body := get(t, plain, ts.plainURL+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "informer not synced") {
		t.Fatalf("readyz with a failing check: %d %q", code, body)
	}
}

func TestTLS11Refused(t *testing.T) {
	ts := start(t, Options{Webhooks: []*admission.Webhook{webhook(t, "test", "/validate", allowAll)}}, true)
	roots := ts.client.Transport.(*http.Transport).TLSClientConfig.RootCAs
	dialer := &net.Dialer{Timeout: wait}
	conn, err := tls.DialWithDialer(dialer, "tcp", ts.Addr().String(), &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS10, MaxVersion: tls.VersionTLS11})
	if err == nil {
		v := conn.ConnectionState().Version
		conn.Close()
		t.Fatalf("TLS handshake with MaxVersion 1.1 succeeded (version %x)", v)
	}
	// The server refuses the version (alert protocol_version), not the client.
	if !strings.Contains(err.Error(), "protocol version") {
		t.Fatalf("TLS 1.1 handshake failed for another reason: %v", err)
	}
	conn, err = tls.DialWithDialer(dialer, "tcp", ts.Addr().String(), &tls.Config{RootCAs: roots, MaxVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatalf("TLS 1.2: %v", err)
	}
	if v := conn.ConnectionState().Version; v != tls.VersionTLS12 {
		t.Fatalf("negotiated %x", v)
	}
	conn.Close()
}

func TestGracefulShutdown(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	ts := start(t, Options{Webhooks: []*admission.Webhook{
		webhook(t, "slow", "/slow", func(context.Context, *admission.Request) admission.Verdict {
			close(entered)
			<-release
			return admission.Allow()
		}),
	}, ShutdownGrace: wait}, true)
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()

	type result struct {
		code int
		body []byte
		err  error
	}
	inflight := make(chan result, 1)
	go func() {
		resp, body, err := ts.post("/slow", reviewBody("uid-slow", "p"))
		if err != nil {
			inflight <- result{err: err}
			return
		}
		inflight <- result{code: resp.StatusCode, body: body}
	}()
	select {
	case <-entered:
	case <-time.After(wait):
		t.Fatal("the slow request never reached the policy")
	}

	ts.cancel()
	// The admission listener closes: new connections are refused.
	testkit.Eventually(t, wait, "the admission listener to close", func() bool {
		c, err := net.DialTimeout("tcp", ts.Addr().String(), time.Second)
		if err != nil {
			return true
		}
		c.Close()
		return false
	})
	// While draining, the server reports not ready.
	if err := ts.Ready(); err == nil || err.Error() != "shutting down" {
		t.Fatalf("Ready while draining: %v", err)
	}
	select {
	case err := <-ts.done:
		t.Fatalf("Serve returned %v with a request in flight", err)
	case r := <-inflight:
		t.Fatalf("in-flight request ended before its policy was released: %+v", r)
	default:
	}

	close(release)
	select {
	case r := <-inflight:
		var rev admission.Review
		if r.err != nil || r.code != 200 || json.Unmarshal(r.body, &rev) != nil || string(rev.Response.UID) != "uid-slow" || !rev.Response.Allowed {
			t.Fatalf("in-flight request: %+v (%s)", r, r.body)
		}
	case <-time.After(wait):
		t.Fatal("in-flight request did not complete")
	}
	select {
	case err := <-ts.done:
		if err != nil {
			t.Fatalf("Serve = %v, want nil", err)
		}
		ts.done <- nil // for the cleanup
	case <-time.After(wait):
		t.Fatal("Serve did not return")
	}
}

func TestShutdownGraceExceeded(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	defer close(release)
	ts := start(t, Options{Webhooks: []*admission.Webhook{
		webhook(t, "stuck", "/stuck", func(context.Context, *admission.Request) admission.Verdict {
			close(entered)
			<-release
			return admission.Allow()
		}),
	}, ShutdownGrace: 100 * time.Millisecond}, true)
	inflight := make(chan error, 1)
	go func() {
		_, _, err := ts.post("/stuck", reviewBody("uid-stuck", "p"))
		inflight <- err
	}()
	select {
	case <-entered:
	case <-time.After(wait):
		t.Fatal("the request never reached the policy")
	}
	// A metrics client in the middle of sending a request keeps its
	// connection active on the plain listener.
	half, err := net.DialTimeout("tcp", strings.TrimPrefix(ts.plainURL, "http://"), wait)
	if err != nil {
		t.Fatal(err)
	}
	defer half.Close()
	if _, err := half.Write([]byte("GET /healthz HTTP/1.1\r\n")); err != nil {
		t.Fatal(err)
	}
	ts.cancel()
	select {
	case err := <-ts.done:
		if err == nil || !strings.Contains(err.Error(), "outlived the 100ms grace period") || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Serve = %v, want the grace period error", err)
		}
		ts.done <- err
	case <-time.After(wait):
		t.Fatal("Serve did not return after the grace period")
	}
	// Once Serve has returned nothing is served any more: the half-sent
	// metrics request is cut off too, well before the server's 10s
	// ReadHeaderTimeout would have ended it.
	_ = half.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := half.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("metrics connection still open after Serve returned: read %d, %v", n, err)
	}
	// The connection was cut off: the client sees an error, not an answer.
	select {
	case err := <-inflight:
		if err == nil {
			t.Fatal("the cut-off request got an answer")
		}
	case <-time.After(wait):
		t.Fatal("the cut-off request did not end")
	}
}

func TestNewAndListenErrors(t *testing.T) {
	if _, err := New(Options{}); err == nil {
		t.Fatal("New without a certificate holder succeeded")
	}
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	s, err := New(Options{Addr: busy.Addr().String(), MetricsAddr: "0", Certs: &webhookcerts.Holder{}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen(); err == nil || !strings.Contains(err.Error(), busy.Addr().String()) {
		t.Fatalf("Listen on a busy port: %v", err)
	}
	// Serve reports the bind error too.
	if err := s.Serve(context.Background()); err == nil {
		t.Fatal("Serve on a busy port succeeded")
	}
	// A busy metrics port fails Listen and releases the admission port.
	s, err = New(Options{Addr: "127.0.0.1:0", MetricsAddr: busy.Addr().String(), Certs: &webhookcerts.Holder{}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen(); err == nil || !strings.Contains(err.Error(), busy.Addr().String()) {
		t.Fatalf("Listen with a busy metrics port: %v", err)
	}
	// Two servers cannot share one registry.
	ts := start(t, Options{MetricsAddr: "0"}, true)
	if ts.MetricsAddr() != nil || ts.plainURL != "" {
		t.Fatalf("metrics listener not disabled: %v", ts.MetricsAddr())
	}
	if _, err := New(Options{Certs: &webhookcerts.Holder{}, Registry: ts.opts.Registry}); err == nil {
		t.Fatal("second server on one registry succeeded")
	}
}

// TestPprofOptIn checks that /debug/pprof/ is served only with Pprof, only on
// the plain-HTTP metrics listener, and never on the admission listener.
func TestPprofOptIn(t *testing.T) {
	plain := &http.Client{Timeout: wait}
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("pprof=%v", on), func(t *testing.T) {
			ts := start(t, Options{Pprof: on, Webhooks: []*admission.Webhook{webhook(t, "p", "/validate-pod", allowAll)}}, true)
			want := http.StatusNotFound
			if on {
				want = http.StatusOK
			}
			for _, p := range []string{"/debug/pprof/", "/debug/pprof/heap?debug=1", "/debug/pprof/cmdline"} {
				if code, body := get(t, plain, ts.plainURL+p); code != want {
					t.Errorf("metrics listener GET %s: HTTP %d, want %d: %.200s", p, code, want, body)
				}
				if code, _ := get(t, ts.client, ts.base+p); code != http.StatusNotFound {
					t.Errorf("admission listener GET %s: HTTP %d, want 404", p, code)
				}
			}
			// The admission path still works next to it.
			resp, _, err := ts.post("/validate-pod", reviewBody("u1", "p"))
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("admission POST: %v %v", resp, err)
			}
		})
	}
}
