package bench

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"log"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"

	"github.com/kadmit/kadmit/internal/admission"
)

// testServer answers AdmissionReviews the way answer says, after decoding
// them with kadmit's own codec (so the bench's bodies are known to be valid).
type testServer struct {
	*httptest.Server
	mu     sync.Mutex
	uids   map[string]bool
	protos map[string]int
	spans  map[int64]*connSpan // by connection, in order of acceptance
	count  atomic.Int64
}

// connSpan is the time from the start of the first request a connection
// carried to the end of its last one, as the server saw it.
type connSpan struct {
	first, last time.Time
	requests    int
}

type connIDKey struct{}

// answer returns the HTTP status and body for request n (0-based) with uid.
type answer func(n int64, apiVersion, uid string) (int, []byte)

func newTestServer(t testing.TB, h2 bool, ans answer) *testServer {
	t.Helper()
	ts := &testServer{uids: map[string]bool{}, protos: map[string]int{}, spans: map[int64]*connSpan{}}
	ts.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		defer ts.recordSpan(r, start)
		n := ts.count.Add(1) - 1
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		rev, err := admission.DecodeReview(body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		ts.mu.Lock()
		ts.uids[string(rev.Request.UID)] = true
		ts.protos[r.Proto]++
		ts.mu.Unlock()
		code, out := ans(n, rev.APIVersion, string(rev.Request.UID))
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_, _ = w.Write(out)
	}))
	// A connection id of our own: the client's address may be reused by a
	// later connection.
	var connIDs atomic.Int64
	ts.Config.ConnContext = func(ctx context.Context, _ net.Conn) context.Context {
		return context.WithValue(ctx, connIDKey{}, connIDs.Add(1))
	}
	ts.EnableHTTP2 = h2
	ts.Config.ErrorLog = log.New(io.Discard, "", 0) // handshake failures are expected in some tests
	ts.StartTLS()
	t.Cleanup(ts.Close)
	return ts
}

func (ts *testServer) recordSpan(r *http.Request, start time.Time) {
	end := time.Now()
	id, _ := r.Context().Value(connIDKey{}).(int64)
	ts.mu.Lock()
	defer ts.mu.Unlock()
	sp := ts.spans[id]
	if sp == nil {
		sp = &connSpan{first: start}
		ts.spans[id] = sp
	}
	sp.last, sp.requests = end, sp.requests+1
}

// maxConcurrentConns is the largest number of connections whose spans
// overlap: how many connections were carrying requests at once.
func (ts *testServer) maxConcurrentConns() int {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	type edge struct {
		at    time.Time
		delta int
	}
	var edges []edge
	for _, sp := range ts.spans {
		edges = append(edges, edge{sp.first, +1}, edge{sp.last, -1})
	}
	// At equal times count the end first: a span that ends as another
	// begins does not overlap it.
	slices.SortFunc(edges, func(a, b edge) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.delta - b.delta
	})
	open, peak := 0, 0
	for _, e := range edges {
		open += e.delta
		peak = max(peak, open)
	}
	return peak
}

func (ts *testServer) options() Options {
	pool := ts.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	return Options{URL: ts.URL + "/mutate-pod", RootCAs: pool, Concurrency: 4, Requests: 100}
}

var testPatch = base64.StdEncoding.EncodeToString([]byte(`[{"op":"add","path":"/metadata/labels/x","value":"y"}]`))

func reviewJSON(apiVersion string, resp map[string]any) []byte {
	b, _ := json.Marshal(map[string]any{"apiVersion": apiVersion, "kind": "AdmissionReview", "response": resp})
	return b
}

// allowPatch answers every request correctly, with a patch.
func allowPatch(_ int64, apiVersion, uid string) (int, []byte) {
	return 200, reviewJSON(apiVersion, map[string]any{"uid": uid, "allowed": true, "patchType": "JSONPatch", "patch": testPatch})
}

func TestRunCountsExactlyAndChecksAnswers(t *testing.T) {
	ts := newTestServer(t, false, allowPatch)
	o := ts.options()
	o.Requests, o.Concurrency = 1000, 8
	rep, err := Run(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Requests != 1000 || ts.count.Load() != 1000 {
		t.Errorf("requests: report %d, server %d; want 1000", rep.Requests, ts.count.Load())
	}
	if len(rep.Errors) != 0 {
		t.Errorf("errors: %v", rep.Errors)
	}
	if rep.Allowed != 1000 || rep.Patched != 1000 || rep.Denied != 0 {
		t.Errorf("allowed/patched/denied = %d/%d/%d", rep.Allowed, rep.Patched, rep.Denied)
	}
	if len(ts.uids) != 1000 {
		t.Errorf("%d distinct uids, want 1000", len(ts.uids))
	}
	if rep.Protocol != "HTTP/1.1" || ts.protos["HTTP/1.1"] != 1000 {
		t.Errorf("protocol %q, server saw %v", rep.Protocol, ts.protos)
	}
	// Connections: not "at most one per worker". net/http closes a
	// kept-alive HTTP/1.1 connection instead of reusing it when its writer
	// goroutine has not reported the request written within 50ms of the
	// answer (maxWriteWaitBeforeConnReuse and persistConn.wroteRequest in
	// net/http/transport.go, Go 1.26), which happens on a starved CPU; the
	// next request then dials a replacement. What holds however goroutines
	// are scheduled: the report counts every connection that carried a
	// request, no more than 8 carried requests at once (a replacement's
	// first request starts after the retired connection's last one ended),
	// and the connections are kept alive: every replacement costs a worker a
	// 50ms stall, so even a badly starved run stays far below one
	// connection per ten requests, where without keep-alive it would be one
	// per request. The cap itself is the transport's (TestClientCapsConnections).
	if int(rep.Connections) < len(ts.spans) {
		t.Errorf("report counts %d connections, the server saw requests on %d", rep.Connections, len(ts.spans))
	}
	if peak := ts.maxConcurrentConns(); peak < 1 || peak > 8 {
		t.Errorf("%d connections carried requests at once for 8 workers (%d opened)", peak, rep.Connections)
	}
	if rep.Connections < 1 || rep.Connections > 100 {
		t.Errorf("%d connections for 1000 requests: connections are not kept alive", rep.Connections)
	}
	if rep.StoppedBy != "requests" || rep.hist.n != 1000 {
		t.Errorf("stopped by %q, %d latencies", rep.StoppedBy, rep.hist.n)
	}
	if rep.Latency(0.5) <= 0 || rep.Latency(1) < rep.Latency(0.99) {
		t.Errorf("latencies p50 %s p99 %s max %s", rep.Latency(0.5), rep.Latency(0.99), rep.Latency(1))
	}
}

// TestClientCapsConnections checks the client Run uses keeps at most one
// connection per worker open and in its idle pool: without the cap, a
// request that finds its worker's connection not yet back in the pool dials
// another, and c workers use up to 2c connections.
func TestClientCapsConnections(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		o, err := Options{URL: "https://127.0.0.1:1/mutate-pod", Concurrency: 8, Requests: 1, HTTP2: h2}.normalize()
		if err != nil {
			t.Fatal(err)
		}
		tr := (&runner{opts: o}).newClient().Transport.(*http.Transport)
		if tr.MaxConnsPerHost != 8 || tr.MaxIdleConnsPerHost != 8 || tr.DisableKeepAlives {
			t.Errorf("HTTP2 %v: MaxConnsPerHost %d, MaxIdleConnsPerHost %d, DisableKeepAlives %v; want 8, 8, false",
				h2, tr.MaxConnsPerHost, tr.MaxIdleConnsPerHost, tr.DisableKeepAlives)
		}
	}
}

func TestRunConcurrencyAboveRequests(t *testing.T) {
	ts := newTestServer(t, false, allowPatch)
	o := ts.options()
	o.Requests, o.Concurrency = 3, 64
	rep, err := Run(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Requests != 3 || ts.count.Load() != 3 {
		t.Errorf("requests: report %d, server %d; want 3", rep.Requests, ts.count.Load())
	}
}

func TestRunClassifiesErrors(t *testing.T) {
	okResp := func(apiVersion, uid string) []byte {
		return reviewJSON(apiVersion, map[string]any{"uid": uid, "allowed": true})
	}
	tests := []struct {
		name string
		ans  answer
		want string
	}{
		{"wrong uid", func(_ int64, v, _ string) (int, []byte) { return 200, okResp(v, "not-the-uid") }, KindUIDMismatch},
		{"500", func(int64, string, string) (int, []byte) { return 500, []byte("boom") }, KindHTTP5xx},
		{"403", func(int64, string, string) (int, []byte) { return 403, []byte("no") }, KindHTTP4xx},
		{"302", func(int64, string, string) (int, []byte) { return 302, nil }, KindHTTPOther},
		{"not json", func(int64, string, string) (int, []byte) { return 200, []byte("<html>") }, KindBadJSON},
		{"wrong apiVersion", func(_ int64, _, uid string) (int, []byte) { return 200, okResp(admission.APIVersionV1beta1, uid) }, KindBadReview},
		{"no response", func(_ int64, v, _ string) (int, []byte) { return 200, reviewJSON(v, nil) }, KindBadReview},
		{"no allowed", func(_ int64, v, uid string) (int, []byte) { return 200, reviewJSON(v, map[string]any{"uid": uid}) }, KindBadReview},
		{"patch not base64", func(_ int64, v, uid string) (int, []byte) {
			return 200, reviewJSON(v, map[string]any{"uid": uid, "allowed": true, "patchType": "JSONPatch", "patch": "%%%"})
		}, KindBadPatch},
		{"patch not a JSONPatch", func(_ int64, v, uid string) (int, []byte) {
			p := base64.StdEncoding.EncodeToString([]byte(`{"metadata":{}}`))
			return 200, reviewJSON(v, map[string]any{"uid": uid, "allowed": true, "patchType": "JSONPatch", "patch": p})
		}, KindBadPatch},
		{"patch without patchType", func(_ int64, v, uid string) (int, []byte) {
			return 200, reviewJSON(v, map[string]any{"uid": uid, "allowed": true, "patch": testPatch})
		}, KindBadPatch},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ts := newTestServer(t, false, tt.ans)
			o := ts.options()
			o.Requests = 20
			rep, err := Run(t.Context(), o)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Requests != 20 || len(rep.Errors) != 1 || rep.Errors[tt.want] != 20 {
				t.Errorf("requests %d, errors %v; want 20 %s", rep.Requests, rep.Errors, tt.want)
			}
			if rep.hist.n != 0 {
				t.Errorf("%d latencies recorded for failed requests", rep.hist.n)
			}
		})
	}
}

func TestRunMixedAnswers(t *testing.T) {
	ts := newTestServer(t, false, func(n int64, v, uid string) (int, []byte) {
		switch n % 4 {
		case 0:
			return allowPatch(n, v, uid)
		case 1:
			return 200, reviewJSON(v, map[string]any{"uid": "x", "allowed": true})
		case 2:
			return 500, nil
		default:
			return 200, reviewJSON(v, map[string]any{"uid": uid, "allowed": false, "status": map[string]any{"code": 403}})
		}
	})
	o := ts.options()
	o.Requests = 400
	rep, err := Run(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{KindUIDMismatch: 100, KindHTTP5xx: 100}
	if rep.Requests != 400 || !mapsEqual(rep.Errors, want) || rep.Allowed != 100 || rep.Denied != 100 || rep.Patched != 100 {
		t.Errorf("requests %d errors %v allowed %d denied %d patched %d", rep.Requests, rep.Errors, rep.Allowed, rep.Denied, rep.Patched)
	}
}

func mapsEqual(a, b map[string]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func TestRunTimeout(t *testing.T) {
	ts := newTestServer(t, false, func(n int64, v, uid string) (int, []byte) {
		time.Sleep(300 * time.Millisecond)
		return allowPatch(n, v, uid)
	})
	o := ts.options()
	o.Requests, o.Timeout = 4, 50*time.Millisecond
	rep, err := Run(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Errors[KindTimeout] != 4 {
		t.Errorf("errors %v, want 4 timeouts", rep.Errors)
	}
}

func TestRunConnectionRefused(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	rep, err := Run(t.Context(), Options{URL: "https://" + addr + "/x", Insecure: true, Requests: 10, Concurrency: 2})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Requests != 10 || rep.Errors[KindConnection] != 10 || rep.Connections != 0 {
		t.Errorf("requests %d errors %v connections %d", rep.Requests, rep.Errors, rep.Connections)
	}
	var buf bytes.Buffer
	if err := rep.WriteText(&buf); err != nil || !strings.Contains(buf.String(), "connection 10") {
		t.Errorf("text report (%v):\n%s", err, buf.String())
	}
}

func TestRunUntrustedCertificate(t *testing.T) {
	ts := newTestServer(t, false, allowPatch)
	o := ts.options()
	o.RootCAs, o.Requests = nil, 5 // system roots do not trust httptest's CA
	rep, err := Run(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Errors[KindTLS] != 5 {
		t.Errorf("errors %v, want 5 tls", rep.Errors)
	}
	o.RootCAs, o.Insecure = nil, true
	if rep, err = Run(t.Context(), o); err != nil || len(rep.Errors) != 0 {
		t.Errorf("--insecure: %v, errors %v", err, rep.Errors)
	}
}

func TestRunHTTP2(t *testing.T) {
	ts := newTestServer(t, true, allowPatch)
	o := ts.options()
	o.HTTP2, o.Requests, o.Concurrency = true, 200, 16
	rep, err := Run(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Errors) != 0 || rep.Protocol != "HTTP/2.0" || ts.protos["HTTP/2.0"] != 200 {
		t.Errorf("errors %v, protocol %q, server saw %v", rep.Errors, rep.Protocol, ts.protos)
	}
	// Multiplexed like the API server does: one connection for 16 streams.
	if rep.Connections != 1 {
		t.Errorf("%d connections, want 1", rep.Connections)
	}
	// HTTP/1.1 is forced even when the server offers h2.
	o.HTTP2 = false
	rep, err = Run(t.Context(), o)
	if err != nil || rep.Protocol != "HTTP/1.1" || len(rep.Errors) != 0 {
		t.Errorf("h1 against an h2 server: %v, protocol %q, errors %v", err, rep.Protocol, rep.Errors)
	}
}

func TestRunHTTP2AgainstHTTP1Server(t *testing.T) {
	ts := newTestServer(t, false, allowPatch)
	o := ts.options()
	o.HTTP2, o.Requests = true, 3
	rep, err := Run(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	if rep.ErrorCount() != 3 || ts.count.Load() != 0 {
		t.Errorf("errors %v, server answered %d; want every request refused, none sent as HTTP/1.1", rep.Errors, ts.count.Load())
	}
}

func TestRunV1beta1(t *testing.T) {
	ts := newTestServer(t, false, allowPatch)
	o := ts.options()
	o.APIVersion, o.Requests = "v1beta1", 10
	rep, err := Run(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Errors) != 0 || rep.APIVersion != admission.APIVersionV1beta1 {
		t.Errorf("errors %v, apiVersion %s", rep.Errors, rep.APIVersion)
	}
}

func TestRunDurationAndProgress(t *testing.T) {
	ts := newTestServer(t, false, allowPatch)
	o := ts.options()
	o.Requests, o.Duration = 0, 1200*time.Millisecond
	var calls atomic.Int64
	o.Progress = func(p Progress) {
		calls.Add(1)
		if p.Requests < 0 || p.Elapsed <= 0 {
			t.Errorf("progress %+v", p)
		}
	}
	rep, err := Run(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	if rep.StoppedBy != "duration" || rep.Requests == 0 || rep.Duration < o.Duration || len(rep.Errors) != 0 {
		t.Errorf("stopped by %s after %s, %d requests, errors %v", rep.StoppedBy, rep.Duration, rep.Requests, rep.Errors)
	}
	if calls.Load() < 1 {
		t.Error("progress never called")
	}
	if rep.Requests != ts.count.Load() {
		t.Errorf("report %d requests, server saw %d", rep.Requests, ts.count.Load())
	}
}

func TestRunInterrupted(t *testing.T) {
	ts := newTestServer(t, false, allowPatch)
	o := ts.options()
	o.Requests, o.Duration = 0, 30*time.Second
	ctx, cancel := context.WithCancel(t.Context())
	o.Progress = func(Progress) { cancel() }
	rep, err := Run(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if rep.StoppedBy != "interrupted" || rep.Duration >= o.Duration || len(rep.Errors) != 0 {
		t.Errorf("stopped by %s after %s, errors %v", rep.StoppedBy, rep.Duration, rep.Errors)
	}
}

func TestRunRefusesRemoteTarget(t *testing.T) {
	for _, u := range []string{"https://198.51.100.1:443/mutate", "https://[2001:db8::1]/x", "https://0.0.0.0:9443/x"} {
		_, err := Run(t.Context(), Options{URL: u, Insecure: true, Requests: 1})
		if !errors.Is(err, ErrRemoteTarget) {
			t.Errorf("%s: err = %v, want ErrRemoteTarget", u, err)
		}
	}
	// --allow-remote lifts the check (not dialed here).
	if err := checkTarget(t.Context(), "https://198.51.100.1:443/x", true); err != nil {
		t.Errorf("allowRemote: %v", err)
	}
	for _, u := range []string{"https://127.0.0.1:1/x", "https://127.9.8.7/x", "https://[::1]:9443/x", "https://[::ffff:127.0.0.1]:1/x"} {
		if err := checkTarget(t.Context(), u, false); err != nil {
			t.Errorf("%s: %v", u, err)
		}
	}
	// The dial-time guard behind the resolution check.
	if err := loopbackOnly("tcp4", "198.51.100.1:443", nil); !errors.Is(err, ErrRemoteTarget) {
		t.Errorf("loopbackOnly(198.51.100.1) = %v", err)
	}
	if err := loopbackOnly("tcp6", "[::1]:443", nil); err != nil {
		t.Errorf("loopbackOnly(::1) = %v", err)
	}
}

func TestOptionsBounds(t *testing.T) {
	base := Options{URL: "https://127.0.0.1:1/x", Insecure: true}
	tests := []struct {
		name string
		mod  func(*Options)
	}{
		{"duration too long", func(o *Options) { o.Duration = MaxDuration + time.Second }},
		{"duration too short", func(o *Options) { o.Duration = time.Millisecond }},
		{"negative duration", func(o *Options) { o.Duration = -time.Second }},
		{"too many requests", func(o *Options) { o.Requests = MaxRequests + 1 }},
		{"negative requests", func(o *Options) { o.Requests = -1 }},
		{"concurrency 0 after default is fine, 1025 is not", func(o *Options) { o.Concurrency = MaxConcurrency + 1 }},
		{"negative concurrency", func(o *Options) { o.Concurrency = -1 }},
		{"timeout too long", func(o *Options) { o.Timeout = time.Hour }},
		{"http url", func(o *Options) { o.URL = "http://127.0.0.1:1/x" }},
		{"no host", func(o *Options) { o.URL = "https:///x" }},
		{"cacert and insecure", func(o *Options) { o.RootCAs = x509.NewCertPool() }},
		{"operation", func(o *Options) { o.Operation = "PATCH" }},
		{"api version", func(o *Options) { o.APIVersion = "v2" }},
		{"two objects", func(o *Options) { o.Manifest = []byte("kind: A\napiVersion: v1\n---\nkind: B\napiVersion: v1\n") }},
		{"no kind", func(o *Options) { o.Manifest = []byte("metadata: {name: x}\n") }},
		{"empty manifest", func(o *Options) { o.Manifest = []byte("# nothing\n") }},
		{"list", func(o *Options) { o.Manifest = []byte(`{"apiVersion":"v1","kind":"List","items":[]}`) }},
	}
	for _, tt := range tests {
		o := base
		tt.mod(&o)
		if _, err := Run(t.Context(), o); !errors.Is(err, ErrOptions) {
			t.Errorf("%s: err = %v, want ErrOptions", tt.name, err)
		}
	}
	n, err := base.normalize()
	if err != nil {
		t.Fatal(err)
	}
	if n.Duration != DefaultDuration || n.Requests != MaxRequests || n.Concurrency != DefaultConcurrency || n.Operation != admissionv1.Create {
		t.Errorf("defaults: %+v", n)
	}
	base.Requests = 5
	if n, _ = base.normalize(); n.Duration != MaxDuration || n.Requests != 5 {
		t.Errorf("-n without -d: duration %s requests %d", n.Duration, n.Requests)
	}
	base.Duration = 2 * time.Second
	if n, _ = base.normalize(); n.Duration != 2*time.Second || n.Requests != 5 {
		t.Errorf("-n with -d: duration %s requests %d", n.Duration, n.Requests)
	}
}

func TestTemplate(t *testing.T) {
	j, err := decodeOne(DefaultPod())
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := j.MarshalJSON()
	if len(raw) < 3500 || len(raw) > 5500 {
		t.Errorf("default pod is %d bytes of JSON, want about 4 KB", len(raw))
	}
	for _, op := range []admissionv1.Operation{admissionv1.Create, admissionv1.Update, admissionv1.Delete} {
		tmpl, err := newTemplate(DefaultPod(), admission.APIVersionV1, op)
		if err != nil {
			t.Fatal(err)
		}
		g := newUIDGen()
		uid := string(g.next())
		body := tmpl.body([]byte(uid))
		if len(body) != tmpl.size() {
			t.Errorf("body %d bytes, size() %d", len(body), tmpl.size())
		}
		rev, err := admission.DecodeReview(body)
		if err != nil {
			t.Fatalf("%s: %v\n%s", op, err, body)
		}
		r := rev.Request
		if string(r.UID) != uid || r.Kind.Kind != "Pod" || r.Kind.Version != "v1" || r.Resource.Resource != "pods" ||
			r.Name != "checkout-api-7d9f8b6c5d-x2k4p" || r.Namespace != "shop" || r.Operation != op || r.Options.Raw == nil {
			t.Errorf("%s: request %+v", op, r)
		}
		if (op == admissionv1.Delete) != (r.Object.Raw == nil) || (op == admissionv1.Create) != (r.OldObject.Raw == nil) {
			t.Errorf("%s: object %d bytes, oldObject %d bytes", op, len(r.Object.Raw), len(r.OldObject.Raw))
		}
		if next := string(g.next()); next == uid || len(next) != 36 || next[14] != '4' {
			t.Errorf("uids %s then %s", uid, next)
		}
	}
	tmpl, err := newTemplate([]byte(`{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"d"}}`), admission.APIVersionV1, admissionv1.Create)
	if err != nil {
		t.Fatal(err)
	}
	rev, _ := admission.DecodeReview(tmpl.body([]byte(strings.Repeat("a", 36))))
	if k, res := rev.Request.Kind, rev.Request.Resource; k.Group != "apps" || res.Resource != "deployments" || rev.Request.Namespace != "" {
		t.Errorf("deployment: kind %v resource %v", k, res)
	}
}

func TestValidJSONPatch(t *testing.T) {
	good := []string{`[]`, `[{"op":"add","path":"/a","value":null}]`, `[{"op":"remove","path":"/a/0"}]`,
		`[{"op":"move","from":"/a","path":"/b"},{"op":"test","path":"","value":{}}]`}
	bad := []string{`{}`, `[{"op":"add","path":"/a"}]`, `[{"op":"remove"}]`, `[{"op":"frob","path":"/a"}]`,
		`[{"op":"copy","path":"/a"}]`, `[{"op":"remove","path":"a"}]`, `nope`}
	for _, p := range good {
		if err := validJSONPatch([]byte(p)); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
	for _, p := range bad {
		if err := validJSONPatch([]byte(p)); err == nil {
			t.Errorf("%s: accepted", p)
		}
	}
}

func TestHistogramPercentiles(t *testing.T) {
	exact := func(sorted []int64, q float64) int64 {
		rank := max(int(math.Ceil(q*float64(len(sorted)))), 1)
		return sorted[rank-1]
	}
	rng := rand.New(rand.NewPCG(1, 2))
	sets := map[string][]int64{}
	var linear []int64
	for i := int64(1); i <= 100000; i++ {
		linear = append(linear, i*int64(time.Microsecond))
	}
	sets["1us..100ms"] = linear
	var logn []int64
	for range 50000 {
		logn = append(logn, int64(math.Exp(rng.NormFloat64()*1.5+math.Log(2e6)))) // median 2ms, long tail
	}
	sets["lognormal"] = logn
	sets["small"] = []int64{5, 3, 100, 127, 128, 129, 1000}
	for name, s := range sets {
		var h histogram
		for _, v := range s {
			h.record(time.Duration(v))
		}
		sorted := slices.Sorted(slices.Values(s))
		for _, q := range []float64{0, 0.01, 0.5, 0.9, 0.99, 0.999, 1} {
			got, want := float64(h.quantile(q)), float64(exact(sorted, q))
			if math.Abs(got-want) > want*0.01 {
				t.Errorf("%s: q%v = %v, want %v ±1%%", name, q, got, want)
			}
		}
		if h.min != sorted[0] || h.max != sorted[len(sorted)-1] {
			t.Errorf("%s: min %d max %d", name, h.min, h.max)
		}
		var total uint64
		for _, b := range h.bins(20) {
			total += b.Count
		}
		if total != uint64(len(s)) {
			t.Errorf("%s: bins hold %d of %d", name, total, len(s))
		}
	}
	// Merging shards equals recording everything in one.
	var a, b, all histogram
	for i, v := range logn {
		all.record(time.Duration(v))
		if i%2 == 0 {
			a.record(time.Duration(v))
		} else {
			b.record(time.Duration(v))
		}
	}
	a.merge(&b)
	if a.counts != all.counts || a.n != all.n || a.min != all.min || a.max != all.max {
		t.Error("merge differs from recording into one histogram")
	}
	// Bucket boundaries are contiguous and each bucket is at most 1/128 of its values.
	for i := 1; i < numBucket; i++ {
		lo, w := bucketRange(i)
		plo, pw := bucketRange(i - 1)
		if plo+pw != lo || bucketOf(lo) != i || bucketOf(lo+w-1) != i || (lo >= subCount && float64(w)/float64(lo) > 1.0/subCount) {
			t.Fatalf("bucket %d: [%d, +%d) after [%d, +%d)", i, lo, w, plo, pw)
		}
	}
}

func TestReportOutputs(t *testing.T) {
	ts := newTestServer(t, false, func(n int64, v, uid string) (int, []byte) {
		if n%10 == 0 {
			return 500, nil
		}
		return allowPatch(n, v, uid)
	})
	o := ts.options()
	rep, err := Run(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(js.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"requests", "errors", "duration_seconds", "throughput_rps", "latency_ms", "concurrency", "http2", "url"} {
		if _, ok := got[k]; !ok {
			t.Errorf("JSON report lacks %q: %s", k, js.String())
		}
	}
	lat, _ := got["latency_ms"].(map[string]any)
	for _, k := range []string{"p50", "p90", "p99", "p999", "max", "mean"} {
		if v, ok := lat[k].(float64); !ok || v <= 0 {
			t.Errorf("latency_ms.%s = %v", k, lat[k])
		}
	}
	if got["requests"].(float64) != 100 || got["errors"].(map[string]any)[KindHTTP5xx].(float64) != 10 {
		t.Errorf("JSON report: %s", js.String())
	}

	var txt bytes.Buffer
	if err := rep.WriteText(&txt); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"p50", "p99.9", "http_5xx 10", "latency histogram", "#", "100.00%"} {
		if !strings.Contains(txt.String(), s) {
			t.Errorf("text report lacks %q:\n%s", s, txt.String())
		}
	}

	for _, r := range []*Report{rep, {URL: "https://x/<&>", hist: &histogram{}}} {
		var svg bytes.Buffer
		if err := r.WriteSVG(&svg); err != nil {
			t.Fatal(err)
		}
		dec := xml.NewDecoder(&svg)
		var elems int
		for {
			tok, err := dec.Token()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("SVG is not well-formed XML: %v", err)
			}
			if se, ok := tok.(xml.StartElement); ok {
				elems++
				// encoding/xml accepts duplicate attributes; XML does not.
				seen := map[xml.Name]bool{}
				for _, a := range se.Attr {
					if seen[a.Name] {
						t.Errorf("<%s> repeats attribute %s", se.Name.Local, a.Name.Local)
					}
					seen[a.Name] = true
				}
				if elems == 1 && se.Name.Local != "svg" {
					t.Errorf("root element %s", se.Name.Local)
				}
			}
		}
		if elems < 5 {
			t.Errorf("SVG has %d elements", elems)
		}
	}
}

// TestRunChecksRepeatedAnswers: an answer equal to one checked before but
// for its uid is counted as that one, yet any other byte, or a uid the
// check cannot place, sends it through the full check again.
func TestRunChecksRepeatedAnswers(t *testing.T) {
	escaped := func(uid string) string { return `\u00` + fmt.Sprintf("%x", uid[0]) + uid[1:] }
	var first atomic.Pointer[string]
	tests := []struct {
		name                     string
		ans                      answer
		errors                   map[string]int64
		allowed, denied, patched int64
	}{
		{"the same answer", allowPatch, map[string]int64{}, 100, 0, 100},
		{"the patch breaks after 50", func(n int64, v, uid string) (int, []byte) {
			if n < 50 {
				return allowPatch(n, v, uid)
			}
			return 200, reviewJSON(v, map[string]any{"uid": uid, "allowed": true, "patchType": "JSONPatch", "patch": "%%%" + testPatch[3:]})
		}, map[string]int64{KindBadPatch: 50}, 50, 0, 50},
		{"the decision flips after 50", func(n int64, v, uid string) (int, []byte) {
			return 200, reviewJSON(v, map[string]any{"uid": uid, "allowed": n < 50})
		}, map[string]int64{}, 50, 50, 0},
		{"an escaped uid and the bare one in a warning", func(_ int64, v, uid string) (int, []byte) {
			return 200, []byte(`{"apiVersion":"` + v + `","kind":"AdmissionReview","response":{"uid":"` + escaped(uid) +
				`","allowed":true,"warnings":["` + uid + `"]}}`)
		}, map[string]int64{}, 100, 0, 0},
		{"the first uid escaped, this one in a warning", func(_ int64, v, uid string) (int, []byte) {
			first.CompareAndSwap(nil, &uid)
			return 200, []byte(`{"apiVersion":"` + v + `","kind":"AdmissionReview","response":{"uid":"` + escaped(*first.Load()) +
				`","allowed":true,"warnings":["` + uid + `"]}}`)
		}, map[string]int64{KindUIDMismatch: 99}, 1, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ts := newTestServer(t, false, tt.ans)
			o := ts.options()
			o.Concurrency = 1 // "after 50" is in order
			rep, err := Run(t.Context(), o)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Requests != 100 || !mapsEqual(rep.Errors, tt.errors) || rep.Allowed != tt.allowed || rep.Denied != tt.denied || rep.Patched != tt.patched {
				t.Errorf("requests %d errors %v allowed %d denied %d patched %d; want errors %v allowed %d denied %d patched %d",
					rep.Requests, rep.Errors, rep.Allowed, rep.Denied, rep.Patched, tt.errors, tt.allowed, tt.denied, tt.patched)
			}
		})
	}
}

// TestCheckRemembersAnswers: after one full check, an answer that differs
// only by its uid is counted without decoding; it is remembered only when
// the uid's place is the response's.
func TestCheckRemembersAnswers(t *testing.T) {
	r := &runner{tmpl: &template{apiVersion: admission.APIVersionV1}}
	uidA, uidB := "0a3e5c1d-0000-4000-8000-00000000000a", "0a3e5c1d-0000-4000-8000-00000000000b"
	_, a := allowPatch(0, admission.APIVersionV1, uidA)
	_, b := allowPatch(0, admission.APIVersionV1, uidB)
	if r.check(a, []byte(uidA)) != kindOK || r.known[0].Load() == nil {
		t.Fatal("a passing answer was not remembered")
	}
	k := r.known[0].Load()
	if !bytes.Equal(append(append(bytes.Clone(k.prefix), uidB...), k.suffix...), b) {
		t.Fatal("the remembered answer is not the answer around its uid")
	}
	if r.check(b, []byte(uidB)) != kindOK || r.allowed.Load() != 2 || r.patched.Load() != 2 || r.known[1].Load() != nil {
		t.Fatalf("the same answer for another uid: allowed %d patched %d, remembered again %v", r.allowed.Load(), r.patched.Load(), r.known[1].Load() != nil)
	}
	if got := r.check(b, []byte(uidA)); got != kUIDMismatch {
		t.Fatalf("another request's answer: %v", got)
	}
	// The uid twice: not remembered, still checked.
	r2 := &runner{tmpl: r.tmpl}
	twice := []byte(`{"apiVersion":"` + admission.APIVersionV1 + `","kind":"AdmissionReview","response":{"uid":"` + uidA + `","allowed":true,"warnings":["` + uidA + `"]}}`)
	if r2.check(twice, []byte(uidA)) != kindOK || r2.known[0].Load() != nil {
		t.Fatal("an answer with its uid twice was remembered")
	}
}
