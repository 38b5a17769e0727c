package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

func TestAPIServerOptionsBounds(t *testing.T) {
	ok := APIServerOptions{}
	n, err := ok.normalize()
	if err != nil {
		t.Fatal(err)
	}
	if n.Rate != DefaultRate || n.Duration != DefaultDuration || n.MaxInFlight != DefaultMaxInFlight || n.Timeout != DefaultAPITimeout {
		t.Errorf("defaults: %+v", n)
	}
	bad := []struct {
		o    APIServerOptions
		want string
	}{
		{APIServerOptions{Rate: -1}, "--rate -1: must be 1..1000"},
		{APIServerOptions{Rate: MaxRate + 1}, "--rate 1001"},
		{APIServerOptions{Duration: 999 * time.Millisecond}, "-d 999ms: must be 1s..10m0s"},
		{APIServerOptions{Duration: MaxDuration + time.Second}, "-d 10m1s"},
		{APIServerOptions{MaxInFlight: MaxInFlight + 1}, "--max-in-flight 1025"},
		{APIServerOptions{MaxInFlight: -3}, "--max-in-flight -3"},
		{APIServerOptions{Timeout: 500 * time.Millisecond}, "--timeout 500ms: must be 1s..1m0s"},
		{APIServerOptions{Timeout: 2 * time.Minute}, "--timeout 2m0s"},
		{APIServerOptions{Namespace: "Shop_1"}, `--namespace "Shop_1"`},
	}
	for _, c := range bad {
		_, err := c.o.normalize()
		if !errors.Is(err, ErrOptions) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want ErrOptions mentioning %q", c.o, err, c.want)
		}
	}
}

// The planned count is exact: floor(rate × duration).
func TestAPIServerPlanned(t *testing.T) {
	cases := []struct {
		rate int
		d    time.Duration
		want int64
	}{
		{100, 60 * time.Second, 6000},
		{50, 10 * time.Second, 500},
		{3, 1500 * time.Millisecond, 4},
		{MaxRate, MaxDuration, 600_000},
		{1, time.Second, 1},
	}
	for _, c := range cases {
		if got := (APIServerOptions{Rate: c.rate, Duration: c.d}).planned(); got != c.want {
			t.Errorf("rate %d for %s: %d planned, want %d", c.rate, c.d, got, c.want)
		}
	}
}

func TestAPIServerPod(t *testing.T) {
	var pod corev1.Pod
	if err := json.Unmarshal(APIServerPod(), &pod); err != nil {
		t.Fatal(err)
	}
	if pod.Name != "" || pod.GenerateName == "" {
		t.Errorf("name %q generateName %q: want only generateName, as a ReplicaSet sends it", pod.Name, pod.GenerateName)
	}
	if pod.Labels["acme.com/lifespan-requested"] != "3" || pod.Labels["app.kubernetes.io/name"] != "checkout-api" {
		t.Errorf("labels %v", pod.Labels)
	}
	if pod.Spec.PriorityClassName != "" {
		t.Errorf("priorityClassName %q: the Priority plugin would refuse it on most clusters", pod.Spec.PriorityClassName)
	}
	var keys []string
	for _, tl := range pod.Spec.Tolerations {
		if tl.TolerationSeconds == nil || *tl.TolerationSeconds != 300 || tl.Effect != corev1.TaintEffectNoExecute || tl.Operator != corev1.TolerationOpExists {
			t.Errorf("toleration %+v: want Exists NoExecute 300s", tl)
		}
		keys = append(keys, tl.Key)
	}
	if strings.Join(keys, ",") != "node.kubernetes.io/not-ready,node.kubernetes.io/unreachable" {
		t.Errorf("tolerations %v, want the two DefaultTolerationSeconds adds", keys)
	}
	if len(pod.Spec.Containers) != 2 {
		t.Errorf("%d containers, want the default pod's 2", len(pod.Spec.Containers))
	}
}

func TestClassifyCreate(t *testing.T) {
	status := func(code int, msg string) []byte {
		b, _ := json.Marshal(map[string]any{"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "message": msg})
		return b
	}
	cases := []struct {
		code int
		body []byte
		want string
	}{
		{201, nil, ""},
		{200, nil, ""},
		{403, status(403, `admission webhook "pod-name.kadmit.io" denied the request: pod name contains "offensive"`), APIKindWebhookDenied},
		{400, status(400, `admission webhook "x.example.com" denied the request: bad`), APIKindWebhookDenied},
		{500, status(500, `Internal error occurred: failed calling webhook "lifespan.kadmit.io": failed to call webhook: Post "https://127.0.0.1:1/mutate-pod?timeout=10s": dial tcp 127.0.0.1:1: connect: connection refused`), APIKindWebhookFailed},
		{401, status(401, "Unauthorized"), APIKindUnauthorized},
		{403, status(403, `pods is forbidden: User "bob" cannot create resource "pods"`), APIKindForbidden},
		{404, status(404, `namespaces "shop" not found`), APIKindNotFound},
		{409, status(409, "already exists"), APIKindConflict},
		{422, status(422, "Pod is invalid"), APIKindInvalid},
		{429, status(429, "too many requests"), APIKindThrottled},
		{504, status(504, "timeout"), APIKindTimeout},
		{418, []byte("teapot"), APIKindHTTP4xx},
		{503, []byte("unavailable"), APIKindHTTP5xx},
		{302, nil, APIKindHTTPOther},
	}
	for _, c := range cases {
		if got := classifyCreate(c.code, c.body); got != c.want {
			t.Errorf("HTTP %d %s: %q, want %q", c.code, c.body, got, c.want)
		}
	}
}

// testLoad runs apiLoad against a local HTTP server whose handler is h.
func testLoad(t *testing.T, o APIServerOptions, h http.HandlerFunc) (*apiLoad, *int64) {
	t.Helper()
	var requests int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		atomic.AddInt64(&requests, 1)
		h(w, r)
	}))
	t.Cleanup(srv.Close)
	o, err := o.normalize()
	if err != nil {
		t.Fatal(err)
	}
	l := &apiLoad{opts: o, client: srv.Client(), url: srv.URL + "/api/v1/namespaces/shop/pods?dryRun=All", body: []byte(`{}`), kind: "Pod", hist: &histogram{}}
	l.run(context.Background())
	return l, &requests
}

func created(w http.ResponseWriter, _ *http.Request) {
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write([]byte(`{"kind":"Pod","apiVersion":"v1","metadata":{"name":"checkout-api-x"}}`))
}

// The sender is open loop and exact: rate × duration creates, on schedule,
// each answer checked.
func TestAPILoadExactCount(t *testing.T) {
	start := time.Now()
	l, n := testLoad(t, APIServerOptions{Rate: 200, Duration: time.Second}, created)
	took := time.Since(start)
	if l.sent.Load() != 200 || *n != 200 || l.created.Load() != 200 || l.stoppedBy != "count" {
		t.Fatalf("sent %d, server saw %d, created %d, stopped by %s; want exactly 200", l.sent.Load(), *n, l.created.Load(), l.stoppedBy)
	}
	// The last create is due at 995ms: the run cannot be much shorter.
	if took < 990*time.Millisecond {
		t.Errorf("200 creates at 200/s took %s: not on schedule", took)
	}
	if l.held != 0 {
		t.Errorf("%d creates held by the in-flight bound against an instant server", l.held)
	}
	if l.hist.n != 200 {
		t.Errorf("%d latencies recorded", l.hist.n)
	}
}

// A slow server holds the sender back at MaxInFlight: creates are late, the
// bound is never exceeded, and sending stops at Duration + Timeout.
func TestAPILoadInFlightBoundAndDeadline(t *testing.T) {
	var inFlight, peak atomic.Int64
	slow := func(w http.ResponseWriter, r *http.Request) {
		n := inFlight.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		time.Sleep(100 * time.Millisecond)
		inFlight.Add(-1)
		created(w, r)
	}
	// Capacity 2 / 100ms = 20/s against 100/s asked: by the send deadline
	// (1s + 1s) about 40 of the 100 are sent.
	l, n := testLoad(t, APIServerOptions{Rate: 100, Duration: time.Second, MaxInFlight: 2, Timeout: time.Second}, slow)
	if got := peak.Load(); got > 2 || l.peak.Load() > 2 {
		t.Errorf("server saw %d in flight, sender %d; bound 2", got, l.peak.Load())
	}
	if l.stoppedBy != "send deadline" || l.sent.Load() >= 100 || l.sent.Load() < 20 {
		t.Errorf("stopped by %s after %d sent; want the send deadline after ~40", l.stoppedBy, l.sent.Load())
	}
	if l.late == 0 || l.held == 0 || l.maxLag < 100*time.Millisecond {
		t.Errorf("late %d max lag %s: held-back creates must count as late", l.late, l.maxLag)
	}
	if *n != l.sent.Load() || l.answered.Load() != l.sent.Load() {
		t.Errorf("server saw %d, sent %d, answered %d", *n, l.sent.Load(), l.answered.Load())
	}
}

// Failed creates are counted by class, with a sample message, and a 2xx
// that is not the object sent is a bad answer.
func TestAPILoadErrors(t *testing.T) {
	var i atomic.Int64
	mixed := func(w http.ResponseWriter, r *http.Request) {
		switch i.Add(1) % 3 {
		case 0:
			created(w, r)
		case 1:
			w.WriteHeader(http.StatusForbidden)
			_, _ = w.Write([]byte(`{"kind":"Status","message":"admission webhook \"pod-name.kadmit.io\" denied the request: no"}`))
		default:
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(`{"kind":"Deployment","metadata":{"name":"x"}}`))
		}
	}
	l, _ := testLoad(t, APIServerOptions{Rate: 30, Duration: time.Second}, mixed)
	if l.created.Load() != 10 || l.errs[APIKindWebhookDenied] != 10 || l.errs[APIKindBadAnswer] != 10 {
		t.Errorf("created %d, errors %v; want 10 of each", l.created.Load(), l.errs)
	}
	if !strings.Contains(l.samples[APIKindWebhookDenied], `denied the request: no`) {
		t.Errorf("sample %q", l.samples[APIKindWebhookDenied])
	}
}

func TestAPIServerReportOutput(t *testing.T) {
	m, err := parseWebhookMetrics(strings.NewReader(exposition))
	if err != nil {
		t.Fatal(err)
	}
	deltas, err := deltaWebhooks(&webhookMetrics{}, m)
	if err != nil {
		t.Fatal(err)
	}
	h := &histogram{}
	for range 100 {
		h.record(10 * time.Millisecond)
	}
	r := &APIServerReport{
		Server: "https://127.0.0.1:6443", Kind: "Pod", Resource: "pods", Namespace: "shop", BodyBytes: 4600,
		Rate: 100, Asked: time.Second, MaxInFlight: 64, Planned: 100, Sent: 100, Answered: 100, Created: 100,
		Errors: map[string]int64{}, StoppedBy: "count", client: h,
	}
	for _, d := range deltas {
		r.Webhooks = append(r.Webhooks, r.webhookLatency(d))
	}
	ls := r.Webhooks[0]
	// 95 of 100 <= 5ms, 5 in (5, 25]: p50 = 5·50/95 ms; p99 = 5 + 20·4/5 = 21ms.
	if math.Abs(ls.P50-0.005*50/95) > 1e-12 || math.Abs(ls.P99-0.021) > 1e-12 || ls.LowestShare != 0.95 || ls.MeetsTarget() {
		t.Errorf("lifespan: %+v", ls)
	}
	if math.Abs(ls.Mean-0.0025) > 1e-12 || math.Abs(ls.ShareMean-0.25) > 0.01 {
		t.Errorf("lifespan mean %v share %v, want 2.5ms and 25%% of 10ms", ls.Mean, ls.ShareMean)
	}
	pn := r.Webhooks[1]
	if pn.Calls != 100 || pn.Rejected != 2 || pn.LowestShare != 0.99 || !pn.MeetsTarget() {
		t.Errorf("pod-name: %+v", pn)
	}
	var text bytes.Buffer
	if err := r.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"100 of 100 planned sent (exactly as planned)",
		"bucket-interpolated as PromQL's histogram_quantile",
		"lifespan.kadmit.io", "pod-name.kadmit.io", "95.00% <= 5.00ms", "missed", "met",
		"rejections by error_type: calling_webhook_error 1, no_error 1",
		"target      every webhook's p99 in the API server's lowest bucket (<= 5.00ms) at 100 creates/s",
		"MISSED: met by 1 of 2 webhooks",
	} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text report lacks %q:\n%s", want, text.String())
		}
	}
	var js bytes.Buffer
	if err := r.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back APIServerJSON
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatalf("%v\n%s", err, js.String())
	}
	if back.Planned != 100 || len(back.Webhooks) != 2 || back.Webhooks[0].Buckets[3].LE != "+Inf" || back.Target.Met || !back.Complete {
		t.Errorf("JSON: %s", js.String())
	}
}
