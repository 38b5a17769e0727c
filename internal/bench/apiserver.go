package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kadmit/kadmit/internal/fixture"
	"github.com/kadmit/kadmit/internal/kubeconfig"
	"github.com/kadmit/kadmit/internal/otlpreceiver"
)

// Bounds and defaults of RunAPIServer. Every run sends at most
// MaxRate × MaxDuration creates and lasts at most Duration + 2 × Timeout plus
// two bounded /metrics scrapes.
const (
	// MaxRate bounds --rate: beyond ~1000 dry-run creates/s the API server
	// itself (admission chain, validation, etcd-less dry-run storage) is what
	// a run measures, not its webhooks.
	MaxRate     = 1000
	DefaultRate = 100
	// MinAPIDuration is the shortest through-API-server run: with fewer
	// creates the 5 ms-wide first bucket says little.
	MinAPIDuration     = time.Second
	MaxInFlight        = 1024
	DefaultMaxInFlight = 64
	// DefaultAPITimeout bounds each create: above the API server's 10 s
	// default webhook timeout, so a slow webhook shows as the API server's
	// answer rather than as a client-side timeout.
	DefaultAPITimeout = 30 * time.Second
	// scrapeTimeout bounds each GET /metrics.
	scrapeTimeout = 30 * time.Second
	// maxErrorSample bounds the one message kept per error class.
	maxErrorSample = 300
)

// The histogram target, printed next to every through-API-server result:
// at TargetRate creates/s, every webhook's p99 in the API server's lowest
// bucket (<= TargetBucket seconds), i.e. at least 99% of its calls there.
const (
	TargetRate   = 100
	TargetBucket = 0.005
)

// ErrMetricsForbidden is wrapped when the API server refuses GET /metrics.
var ErrMetricsForbidden = errors.New(`the API server refused GET /metrics: the user needs RBAC verb "get" on nonResourceURL "/metrics" (a ClusterRole rule {nonResourceURLs: ["/metrics"], verbs: ["get"]}, bound with a ClusterRoleBinding)`)

// ErrNoKubeconfig is wrapped when no client configuration can be found.
var ErrNoKubeconfig = errors.New("no kubeconfig")

// Error classes of dry-run creates, the keys of APIServerReport.Errors. A
// create counts under exactly one.
const (
	APIKindWebhookDenied = "webhook_denied"      // an admission webhook denied the create
	APIKindWebhookFailed = "webhook_call_failed" // the API server could not call a webhook (failurePolicy Fail)
	APIKindUnauthorized  = "unauthorized"        // HTTP 401: the kubeconfig's credentials were refused
	APIKindForbidden     = "forbidden"           // HTTP 403 for another reason: RBAC, an admission plugin
	APIKindNotFound      = "not_found"           // HTTP 404: namespace or resource missing
	APIKindConflict      = "conflict"            // HTTP 409: already exists
	APIKindInvalid       = "invalid"             // HTTP 422: the object fails validation
	APIKindThrottled     = "throttled"           // HTTP 429: API Priority and Fairness or max-in-flight
	APIKindTimeout       = "timeout"             // HTTP 504, or no answer within --timeout
	APIKindHTTP4xx       = "http_4xx"            // any other 4xx
	APIKindHTTP5xx       = "http_5xx"            // any other 5xx
	APIKindHTTPOther     = "http_other"          // any other status
	APIKindBadAnswer     = "bad_answer"          // 2xx whose body is not the object of the kind sent
	APIKindConnection    = "connection"          // transport error: refused, reset, TLS
)

// APIServerOptions configure RunAPIServer. Zero values have defaults.
type APIServerOptions struct {
	// Kubeconfig is the kubeconfig file; empty means $KUBECONFIG, then
	// ~/.kube/config, then the in-cluster ServiceAccount, as kubectl.
	Kubeconfig string
	// Context overrides the kubeconfig's current context.
	Context string
	// Manifest is one object as YAML or JSON; nil means APIServerPod().
	Manifest []byte
	// Namespace, when set, replaces the object's namespace; otherwise the
	// object's, else "default". An error for a cluster-scoped kind.
	Namespace string
	// Rate is the creates sent per second, 1..MaxRate; 0 means DefaultRate.
	Rate int
	// Duration is how long creates are sent, MinAPIDuration..MaxDuration;
	// 0 means DefaultDuration. Exactly floor(Rate × Duration) creates are
	// planned.
	Duration time.Duration
	// MaxInFlight bounds the creates awaiting an answer, 1..MaxInFlight;
	// 0 means DefaultMaxInFlight. When it is reached the next create waits
	// (and counts as late) instead of being dropped.
	MaxInFlight int
	// Timeout bounds each create, 1s..MaxTimeout; 0 means DefaultAPITimeout.
	Timeout time.Duration
	// AllowRemote permits an API server that is not on loopback.
	AllowRemote bool
	// Progress, when set, is called about once per second while creates
	// are sent. It must return quickly.
	Progress func(Progress)
	// TraceReceiver, when set, is a loopback HOST:PORT where an OTLP/gRPC
	// trace receiver (internal/otlpreceiver) listens for the run: the API
	// server (its TracingConfiguration endpoint) and kadmit serve
	// (--tracing-endpoint) export there, and the report gains Spans, the
	// exact per-call split of each webhook's latency. After the last
	// answer the run waits up to 20 s for the spans' last batches.
	TraceReceiver string
	// MaxSpans bounds the spans the receiver keeps; 0 means
	// otlpreceiver.DefaultMaxSpans.
	MaxSpans int
}

func (o APIServerOptions) normalize() (APIServerOptions, error) {
	if o.Rate == 0 {
		o.Rate = DefaultRate
	}
	if o.Rate < 1 || o.Rate > MaxRate {
		return o, fmt.Errorf("%w: --rate %d: must be 1..%d creates per second", ErrOptions, o.Rate, MaxRate)
	}
	if o.Duration == 0 {
		o.Duration = DefaultDuration
	}
	if o.Duration < MinAPIDuration || o.Duration > MaxDuration {
		return o, fmt.Errorf("%w: -d %s: must be %s..%s", ErrOptions, o.Duration, MinAPIDuration, MaxDuration)
	}
	if o.MaxInFlight == 0 {
		o.MaxInFlight = DefaultMaxInFlight
	}
	if o.MaxInFlight < 1 || o.MaxInFlight > MaxInFlight {
		return o, fmt.Errorf("%w: --max-in-flight %d: must be 1..%d", ErrOptions, o.MaxInFlight, MaxInFlight)
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultAPITimeout
	}
	if o.Timeout < time.Second || o.Timeout > MaxTimeout {
		return o, fmt.Errorf("%w: --timeout %s: must be 1s..%s", ErrOptions, o.Timeout, MaxTimeout)
	}
	if o.MaxSpans < 0 || o.MaxSpans > otlpreceiver.MaxMaxSpans {
		return o, fmt.Errorf("%w: --max-spans %d: must be 1..%d", ErrOptions, o.MaxSpans, otlpreceiver.MaxMaxSpans)
	}
	if o.TraceReceiver != "" {
		host, _, err := net.SplitHostPort(o.TraceReceiver)
		if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
			return o, fmt.Errorf("%w: --trace-receiver %q: want a loopback IP:PORT, e.g. 127.0.0.1:4317", ErrOptions, o.TraceReceiver)
		}
	}
	if o.Namespace != "" {
		if errs := validateNamespace(o.Namespace); errs != "" {
			return o, fmt.Errorf("%w: --namespace %q: %s", ErrOptions, o.Namespace, errs)
		}
	}
	return o, nil
}

// planned is the exact number of creates a run sends: floor(Rate × Duration).
func (o APIServerOptions) planned() int64 {
	return int64(o.Rate) * int64(o.Duration) / int64(time.Second)
}

// APIServerPod returns the object RunAPIServer creates when
// APIServerOptions.Manifest is nil: DefaultPod() as its ReplicaSet sends it
// to the API server (generateName, no name), labelled
// acme.com/lifespan-requested: "3" so that the lifespan webhook has its full
// work to do, with the two tolerations the DefaultTolerationSeconds plugin
// adds (node.kubernetes.io/not-ready and unreachable, 300 s), and without
// spec.priorityClassName, which the Priority admission plugin would refuse
// on any cluster lacking that PriorityClass. As JSON.
func APIServerPod() []byte {
	obj, err := decodeOne(fixture.DeploymentPod())
	if err != nil {
		panic("bench: embedded fixture pod.yaml: " + err.Error()) // covered by tests
	}
	labels := obj.GetLabels()
	labels["acme.com/lifespan-requested"] = "3"
	obj.SetLabels(labels)
	obj.SetName("")
	unstructured.RemoveNestedField(obj.Object, "spec", "priorityClassName")
	tolerations := []any{
		map[string]any{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": int64(300)},
		map[string]any{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": int64(300)},
	}
	if err := unstructured.SetNestedSlice(obj.Object, tolerations, "spec", "tolerations"); err != nil {
		panic("bench: set tolerations: " + err.Error())
	}
	b, err := obj.MarshalJSON()
	if err != nil {
		panic("bench: encode pod: " + err.Error())
	}
	return b
}

// WebhookLatency is one admission webhook's activity between the two
// /metrics scrapes of a run, from the API server's
// apiserver_admission_webhook_admission_duration_seconds (summed over the
// rejected label) and apiserver_admission_webhook_rejection_count. Times are
// in seconds. Every call the API server made in that window counts, also
// calls for requests other than the bench's.
type WebhookLatency struct {
	Name      string // the webhook's name in its configuration
	Type      string // "admit" (mutating) or "validating"
	Operation string // CREATE, UPDATE, ...
	Calls     int64
	Rejected  int64            // calls with rejected="true": denied or failed
	Rejection map[string]int64 // by error_type: no_error (denied), calling_webhook_error, apiserver_internal_error
	Mean      float64          // _sum / _count: exact, not bucketed
	// P50 and P99 are bucket-interpolated as PromQL's histogram_quantile
	// does (see bucketQuantile): estimates at the grain of the API server's
	// buckets (5 ms, 25 ms, 100 ms, ...). P99InInf marks a p99 beyond the
	// last finite bucket, reported as that bucket's bound.
	P50, P99           float64
	P50InInf, P99InInf bool
	// LowestBucket is the upper bound of the first bucket (0.005 on
	// kube-apiserver) and LowestShare the share (0..1) of calls in it.
	LowestBucket, LowestShare float64
	// Buckets are the cumulative counts of the delta, by upper bound.
	Buckets []Bucket
	// ShareMean, ShareP50 and ShareP99 compare the webhook with the creates
	// as the client saw them: Mean / client mean, P50 / client p50, P99 /
	// client p99 (ratios of quantiles, not a quantile of ratios). 0 when no
	// create succeeded.
	ShareMean, ShareP50, ShareP99 float64
}

// MeetsTarget reports whether the webhook's p99 is in the lowest bucket at
// or below TargetBucket: at least 99% of its calls there.
func (w *WebhookLatency) MeetsTarget() bool {
	return w.LowestBucket <= TargetBucket && w.LowestShare >= 0.99
}

// Bucket is one cumulative bucket: Count calls took at most LE seconds.
type Bucket struct {
	LE    float64
	Count int64
}

// APIServerReport is the outcome of RunAPIServer.
type APIServerReport struct {
	Server    string // the API server's URL
	Kind      string // kind of the object created
	Resource  string // its resource, e.g. "pods"
	Namespace string // empty for cluster-scoped kinds
	BodyBytes int

	Rate        int
	Asked       time.Duration // Duration asked for
	MaxInFlight int
	Planned     int64 // floor(Rate × Asked): the creates the run must send
	Sent        int64 // creates sent; Planned unless interrupted or held back past the send deadline
	Answered    int64 // creates that got an HTTP answer or failed, aborted ones excluded
	Created     int64 // answered 2xx with the object of the kind sent (nothing is stored: dryRun=All)
	Errors      map[string]int64
	// ErrorSamples holds the first message seen per error class, cut to
	// 300 bytes.
	ErrorSamples map[string]string
	// Late counts creates sent more than one period after their slot,
	// because MaxInFlight creates were awaiting answers or because the
	// client itself was starved of CPU; MaxLag is the largest delay. Held
	// counts the creates that had to wait for an in-flight slot. Late
	// creates mean the rate was not held.
	Late         int64
	Held         int64
	MaxLag       time.Duration
	PeakInFlight int64
	Elapsed      time.Duration // first create sent to last answer
	StoppedBy    string        // "count", "send deadline" or "interrupted"

	// Webhooks are the webhooks the API server called during the run, from
	// its own metrics; admit (mutating) before validating, then by name.
	Webhooks []WebhookLatency
	// Spans is the exact split from the API server's and kadmit's traces;
	// nil without APIServerOptions.TraceReceiver.
	Spans *SpanReport

	client *histogram // latency of the successful creates
}

// ErrorCount returns the creates that failed.
func (r *APIServerReport) ErrorCount() int64 {
	var n int64
	for _, c := range r.Errors {
		n += c
	}
	return n
}

// ClientLatency returns the latency at quantile q (0..1) of the successful
// creates as the client measured them (request sent to last byte of the
// answer), within 0.4%; 0 when none succeeded.
func (r *APIServerReport) ClientLatency(q float64) time.Duration { return r.client.quantile(q) }

// ClientMean is the mean latency of the successful creates.
func (r *APIServerReport) ClientMean() time.Duration { return r.client.mean() }

// RunAPIServer sends exactly floor(Rate × Duration) server-side dry-run
// creates (POST ...?dryRun=All) of one object to the API server of the
// kubeconfig, open loop: the i-th create is due at start + i/Rate whatever
// the answers do (a fixed schedule rather than a time.Ticker, which would
// drop ticks while the in-flight bound holds the sender back). At most
// MaxInFlight creates await an answer; when the bound is reached the next
// create waits for a slot and is counted late. Sending stops at Duration +
// Timeout in any case (Report.StoppedBy "send deadline"), and each create is
// bounded by Timeout.
//
// Before the first create and after the last answer it reads the API
// server's /metrics and reports, per webhook, the delta of
// apiserver_admission_webhook_admission_duration_seconds.
//
// Errors: ErrOptions (invalid options or manifest), ErrNoKubeconfig,
// ErrRemoteTarget (the API server is not on loopback and AllowRemote is
// unset), ErrMetricsForbidden, ErrCounterReset, a missing namespace, or any
// failure to reach the API server before the load starts. Failed creates are
// counted in the report, not returned.
func RunAPIServer(ctx context.Context, opts APIServerOptions) (*APIServerReport, error) {
	o, err := opts.normalize()
	if err != nil {
		return nil, err
	}
	manifest := o.Manifest
	if manifest == nil {
		manifest = APIServerPod()
	}
	obj, err := decodeOne(manifest)
	if err != nil {
		return nil, fmt.Errorf("%w: manifest: %w", ErrOptions, err)
	}
	gvk := obj.GroupVersionKind()
	if gvk.Kind == "" || gvk.Version == "" {
		return nil, fmt.Errorf("%w: manifest: object has no apiVersion or kind", ErrOptions)
	}
	if obj.GetName() == "" && obj.GetGenerateName() == "" {
		return nil, fmt.Errorf("%w: manifest: object has neither metadata.name nor metadata.generateName", ErrOptions)
	}

	c, err := newAPIClient(ctx, o)
	if err != nil {
		return nil, err
	}
	defer c.http.CloseIdleConnections()

	resource, namespaced, err := c.resourceFor(ctx, gvk.Group, gvk.Version, gvk.Kind)
	if err != nil {
		return nil, err
	}
	ns := ""
	if namespaced {
		ns = o.Namespace
		if ns == "" {
			ns = obj.GetNamespace()
		}
		if ns == "" {
			ns = metav1.NamespaceDefault
		}
		obj.SetNamespace(ns)
		if err := c.namespaceExists(ctx, ns); err != nil {
			return nil, err
		}
	} else if o.Namespace != "" {
		return nil, fmt.Errorf("%w: --namespace %s: %s is cluster-scoped", ErrOptions, o.Namespace, gvk.Kind)
	}
	body, err := obj.MarshalJSON()
	if err != nil {
		return nil, fmt.Errorf("%w: manifest: %w", ErrOptions, err)
	}
	createURL := c.resourceURL(gvk.Group, gvk.Version, ns, resource)
	createURL.RawQuery = url.Values{"dryRun": {metav1.DryRunAll}}.Encode()

	var rcv *otlpreceiver.Receiver
	if o.TraceReceiver != "" {
		if rcv, err = otlpreceiver.Start(otlpreceiver.Options{Addr: o.TraceReceiver, MaxSpans: o.MaxSpans}); err != nil {
			return nil, err
		}
		defer rcv.Stop()
	}
	var primed time.Duration
	if rcv != nil {
		primer := &apiLoad{opts: o, client: c.http, url: createURL.String(), body: body, kind: gvk.Kind, hist: &histogram{}}
		t0 := time.Now()
		if err := primeTraces(ctx, rcv, primer); err != nil {
			return nil, err
		}
		primed = time.Since(t0)
	}
	before, err := c.scrape(ctx)
	if err != nil {
		return nil, err
	}
	l := &apiLoad{opts: o, client: c.http, url: createURL.String(), body: body, kind: gvk.Kind, hist: &histogram{}}
	l.run(ctx)
	if ctx.Err() != nil {
		// The run was interrupted: report what was measured, but the
		// after-scrape needs a context of its own.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), scrapeTimeout)
		defer cancel()
	}
	after, err := c.scrape(ctx)
	if err != nil {
		return nil, err
	}
	deltas, err := deltaWebhooks(before, after)
	if err != nil {
		return nil, err
	}

	rep := &APIServerReport{
		Server: c.base.String(), Kind: gvk.Kind, Resource: resource, Namespace: ns, BodyBytes: len(body),
		Rate: o.Rate, Asked: o.Duration, MaxInFlight: o.MaxInFlight, Planned: o.planned(),
		Sent: l.sent.Load(), Answered: l.answered.Load(), Created: l.created.Load(),
		Errors: map[string]int64{}, ErrorSamples: map[string]string{},
		Late: l.late, Held: l.held, MaxLag: l.maxLag, PeakInFlight: l.peak.Load(), Elapsed: l.elapsed,
		StoppedBy: l.stoppedBy, client: l.hist,
	}
	l.mu.Lock()
	for k, n := range l.errs {
		rep.Errors[k] = n
		rep.ErrorSamples[k] = l.samples[k]
	}
	l.mu.Unlock()
	var expected int64
	for _, d := range deltas {
		rep.Webhooks = append(rep.Webhooks, rep.webhookLatency(d))
		expected += rep.Webhooks[len(rep.Webhooks)-1].Calls
	}
	if rcv != nil {
		// Spans of earlier runs (a warm-up's last batches) may still
		// arrive: only call spans that started during this run count.
		from, to := l.startedAt.UnixNano(), l.startedAt.Add(l.elapsed).UnixNano()
		waited := waitForSpans(rcv, from, to, expected, ctx.Done())
		rep.Spans = &SpanReport{Receiver: rcv.Addr(), Stats: rcv.Stats(), Primed: primed, Waited: waited, Webhooks: splitSpans(rcv.Spans(), from, to)}
	}
	return rep, nil
}

// webhookLatency turns a delta into a report row, with shares of the client
// latency.
func (r *APIServerReport) webhookLatency(d webhookDelta) WebhookLatency {
	h := d.hist
	w := WebhookLatency{
		Name: d.name, Type: d.typ, Operation: d.operation,
		Calls: int64(math.Round(h.count())), Rejected: int64(math.Round(d.rejected)),
		Rejection: map[string]int64{},
	}
	for k, v := range d.rejections {
		w.Rejection[k] = int64(math.Round(v))
	}
	w.Mean = h.sum / h.count()
	w.P50, w.P50InInf = bucketQuantile(0.5, h)
	w.P99, w.P99InInf = bucketQuantile(0.99, h)
	w.LowestBucket = h.bounds[0]
	w.LowestShare = fractionAtOrBelow(h, h.bounds[0])
	for i, b := range h.bounds {
		w.Buckets = append(w.Buckets, Bucket{LE: b, Count: int64(math.Round(h.counts[i]))})
	}
	if r.client.n > 0 {
		w.ShareMean = w.Mean / r.ClientMean().Seconds()
		w.ShareP50 = w.P50 / r.ClientLatency(0.5).Seconds()
		w.ShareP99 = w.P99 / r.ClientLatency(0.99).Seconds()
	}
	return w
}

// apiClient talks to one API server with the kubeconfig's credentials.
type apiClient struct {
	http *http.Client
	base *url.URL // scheme, host and any path prefix of the server
}

// newAPIClient loads the kubeconfig, refuses a non-loopback server unless
// AllowRemote, and builds an HTTP client whose dialer also refuses one.
func newAPIClient(ctx context.Context, o APIServerOptions) (*apiClient, error) {
	if o.Kubeconfig != "" {
		if _, err := os.Stat(o.Kubeconfig); err != nil {
			return nil, fmt.Errorf("%w: --kubeconfig: %w", ErrNoKubeconfig, err)
		}
	}
	cfg, err := kubeconfig.Load(o.Kubeconfig, o.Context, "kadmit-bench")
	if err != nil {
		if isEmptyConfig(err) {
			return nil, fmt.Errorf("%w: pass --kubeconfig, set $KUBECONFIG or create ~/.kube/config (no in-cluster ServiceAccount either): %w", ErrNoKubeconfig, err)
		}
		return nil, err
	}
	base, _, err := rest.DefaultServerUrlFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig server %q: %w", cfg.Host, err)
	}
	if err := checkTarget(ctx, base.String(), o.AllowRemote); err != nil {
		return nil, err
	}
	if !o.AllowRemote {
		d := &net.Dialer{Timeout: o.Timeout, KeepAlive: 30 * time.Second, Control: loopbackOnly}
		cfg.Dial = d.DialContext
		// Never through a proxy: the load must reach the loopback address
		// that was checked.
		cfg.Proxy = func(*http.Request) (*url.URL, error) { return nil, nil }
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("client for %s: %w", base, err)
	}
	return &apiClient{http: hc, base: base}, nil
}

// resourceURL is the collection URL of resource in namespace ns ("" for
// cluster-scoped).
func (c *apiClient) resourceURL(group, version, ns, resource string) *url.URL {
	parts := []string{"apis", group, version}
	if group == "" {
		parts = []string{"api", version}
	}
	if ns != "" {
		parts = append(parts, "namespaces", ns)
	}
	return c.base.JoinPath(append(parts, resource)...)
}

// get GETs path under the server and returns status and body (at most max
// bytes).
func (c *apiClient) get(ctx context.Context, u *url.URL, accept string, max int64) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, scrapeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return 0, nil, fmt.Errorf("GET %s: %w", u.Path, err)
	}
	req.Header.Set("Accept", accept)
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("GET %s: %w", u.Path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, max+1))
	if err != nil {
		return 0, nil, fmt.Errorf("GET %s: read answer: %w", u.Path, err)
	}
	if int64(len(b)) > max {
		return 0, nil, fmt.Errorf("GET %s: answer longer than %d bytes", u.Path, max)
	}
	return resp.StatusCode, b, nil
}

// resourceFor finds the resource name and scope of kind in group/version
// through discovery (one GET of the group version's APIResourceList); v1 Pod
// needs none.
func (c *apiClient) resourceFor(ctx context.Context, group, version, kind string) (string, bool, error) {
	if group == "" && version == "v1" && kind == "Pod" {
		return "pods", true, nil
	}
	u := c.base.JoinPath("apis", group, version)
	if group == "" {
		u = c.base.JoinPath("api", version)
	}
	code, b, err := c.get(ctx, u, "application/json", MaxResponseBytes)
	if err != nil {
		return "", false, fmt.Errorf("discover %s: %w", kind, err)
	}
	if code != http.StatusOK {
		return "", false, fmt.Errorf("discover %s: GET %s: HTTP %d: %s", kind, u.Path, code, statusMessage(b))
	}
	var list metav1.APIResourceList
	if err := json.Unmarshal(b, &list); err != nil {
		return "", false, fmt.Errorf("discover %s: GET %s: %w", kind, u.Path, err)
	}
	for _, r := range list.APIResources {
		if r.Kind == kind && !strings.Contains(r.Name, "/") {
			for _, v := range r.Verbs {
				if v == "create" {
					return r.Name, r.Namespaced, nil
				}
			}
			return "", false, fmt.Errorf("%w: %s %s cannot be created (verbs %v)", ErrOptions, u.Path, r.Name, r.Verbs)
		}
	}
	return "", false, fmt.Errorf("%w: the API server serves no kind %s in %s", ErrOptions, kind, u.Path)
}

// namespaceExists fails when the API server says the namespace is not
// there; a user who may not read namespaces is let through (the creates will
// tell).
func (c *apiClient) namespaceExists(ctx context.Context, ns string) error {
	u := c.base.JoinPath("api", "v1", "namespaces", ns)
	code, b, err := c.get(ctx, u, "application/json", MaxResponseBytes)
	switch {
	case err != nil:
		return fmt.Errorf("check namespace %s: %w", ns, err)
	case code == http.StatusNotFound:
		return fmt.Errorf("namespace %q not found: create it or pass --namespace", ns)
	case code == http.StatusUnauthorized:
		return fmt.Errorf("check namespace %s: HTTP 401: the API server refused the kubeconfig's credentials: %s", ns, statusMessage(b))
	}
	return nil
}

// scrape reads the webhook metrics from the API server's /metrics.
func (c *apiClient) scrape(ctx context.Context) (*webhookMetrics, error) {
	u := c.base.JoinPath("metrics")
	ctx, cancel := context.WithTimeout(ctx, scrapeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, fmt.Errorf("GET /metrics: %w", err)
	}
	// The text exposition format, which expfmt parses.
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET /metrics: %w", err)
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusForbidden:
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return nil, fmt.Errorf("%w; the API server said: %s", ErrMetricsForbidden, statusMessage(b))
	case http.StatusUnauthorized:
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return nil, fmt.Errorf("GET /metrics: HTTP 401: the API server refused the kubeconfig's credentials: %s", statusMessage(b))
	default:
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return nil, fmt.Errorf("GET /metrics: HTTP %d: %s", resp.StatusCode, statusMessage(b))
	}
	m, err := parseWebhookMetrics(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("GET /metrics: %w", err)
	}
	return m, nil
}

// statusMessage returns the message of a metav1.Status body, else the body
// itself, cut to maxErrorSample bytes.
func statusMessage(b []byte) string {
	var st metav1.Status
	msg := strings.TrimSpace(string(b))
	if json.Unmarshal(b, &st) == nil && st.Message != "" {
		msg = st.Message
	}
	if len(msg) > maxErrorSample {
		msg = msg[:maxErrorSample] + "..."
	}
	return msg
}

// apiLoad is one run's sending and counting.
type apiLoad struct {
	opts   APIServerOptions
	client *http.Client
	url    string
	body   []byte
	kind   string

	sent, answered, created, inFlight, peak atomic.Int64

	mu      sync.Mutex
	hist    *histogram
	errs    map[string]int64
	samples map[string]string

	// Written by run's goroutine only.
	startedAt time.Time
	late      int64
	held      int64
	maxLag    time.Duration
	elapsed   time.Duration
	stoppedBy string
}

// run sends the planned creates on schedule and waits for their answers.
func (l *apiLoad) run(ctx context.Context) {
	o := l.opts
	planned := o.planned()
	period := time.Second / time.Duration(o.Rate)
	slots := make(chan struct{}, o.MaxInFlight)
	start := time.Now()
	l.startedAt = start
	deadline := time.NewTimer(o.Duration + o.Timeout)
	defer deadline.Stop()
	timer := time.NewTimer(0)
	defer timer.Stop()
	progressDone := make(chan struct{})
	var progressWG sync.WaitGroup
	if o.Progress != nil {
		progressWG.Go(func() { l.progress(start, progressDone) })
	}
	var wg sync.WaitGroup
	l.stoppedBy = "count"
send:
	for i := range planned {
		due := start.Add(time.Duration(i * int64(time.Second) / int64(o.Rate)))
		if d := time.Until(due); d > 0 {
			timer.Reset(d)
			select {
			case <-timer.C:
			case <-ctx.Done():
				l.stoppedBy = "interrupted"
				break send
			case <-deadline.C:
				l.stoppedBy = "send deadline"
				break send
			}
		}
		select {
		case slots <- struct{}{}:
		default:
			l.held++
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				l.stoppedBy = "interrupted"
				break send
			case <-deadline.C:
				l.stoppedBy = "send deadline"
				break send
			}
		}
		if lag := time.Since(due); lag > period {
			l.late++
			l.maxLag = max(l.maxLag, lag)
		}
		l.sent.Add(1)
		if n := l.inFlight.Add(1); n > l.peak.Load() {
			l.peak.Store(n) // only this goroutine raises it
		}
		wg.Go(func() {
			defer func() { l.inFlight.Add(-1); <-slots }()
			l.create(ctx)
		})
	}
	wg.Wait()
	l.elapsed = time.Since(start)
	close(progressDone)
	progressWG.Wait()
}

// create sends one dry-run create and counts its outcome. A create that ctx
// aborted is not counted as answered.
func (l *apiLoad) create(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, l.opts.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, l.url, bytes.NewReader(l.body))
	if err != nil { // the URL was built from a parsed one: cannot happen
		l.fail(APIKindConnection, err.Error())
		return
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	start := time.Now()
	resp, err := l.client.Do(req)
	var b []byte
	if err == nil {
		b, err = io.ReadAll(io.LimitReader(resp.Body, MaxResponseBytes+1))
		_ = resp.Body.Close()
	}
	lat := time.Since(start)
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		kind := APIKindConnection
		var ne net.Error
		if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
			kind = APIKindTimeout
		}
		l.fail(kind, err.Error())
		return
	}
	if kind := classifyCreate(resp.StatusCode, b); kind != "" {
		l.fail(kind, fmt.Sprintf("HTTP %d: %s", resp.StatusCode, statusMessage(b)))
		return
	}
	if !l.isObject(b) {
		l.fail(APIKindBadAnswer, fmt.Sprintf("HTTP %d but not a %s: %.200s", resp.StatusCode, l.kind, b))
		return
	}
	l.answered.Add(1)
	l.created.Add(1)
	l.mu.Lock()
	l.hist.record(lat)
	l.mu.Unlock()
}

// isObject checks that a 2xx body is an object of the kind sent, with a name
// (generated if the manifest had only generateName).
func (l *apiLoad) isObject(b []byte) bool {
	if len(b) > MaxResponseBytes {
		return false
	}
	var obj struct {
		Kind     string `json:"kind"`
		Metadata struct {
			Name string `json:"name"`
		} `json:"metadata"`
	}
	return json.Unmarshal(b, &obj) == nil && obj.Kind == l.kind && obj.Metadata.Name != ""
}

func (l *apiLoad) fail(kind, msg string) {
	l.answered.Add(1)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.errs == nil {
		l.errs, l.samples = map[string]int64{}, map[string]string{}
	}
	l.errs[kind]++
	if _, ok := l.samples[kind]; !ok {
		if len(msg) > maxErrorSample {
			msg = msg[:maxErrorSample] + "..."
		}
		l.samples[kind] = msg
	}
}

// classifyCreate returns the error class of an answer to a create, "" for a
// 2xx. The API server's message tells a webhook's denial (`admission webhook
// "x" denied the request`) and a failed call (`failed calling webhook "x"`)
// from other refusals; see k8s.io/apiserver v0.37.1
// pkg/admission/plugin/webhook/errors/statuserror.go:29 and
// pkg/util/webhook/error.go:36.
func classifyCreate(code int, body []byte) string {
	if code >= 200 && code <= 299 {
		return ""
	}
	msg := statusMessage(body)
	switch {
	case strings.Contains(msg, "admission webhook") && strings.Contains(msg, "denied the request"):
		return APIKindWebhookDenied
	case strings.Contains(msg, "failed calling webhook"):
		return APIKindWebhookFailed
	}
	switch {
	case code == http.StatusUnauthorized:
		return APIKindUnauthorized
	case code == http.StatusForbidden:
		return APIKindForbidden
	case code == http.StatusNotFound:
		return APIKindNotFound
	case code == http.StatusConflict:
		return APIKindConflict
	case code == http.StatusUnprocessableEntity:
		return APIKindInvalid
	case code == http.StatusTooManyRequests:
		return APIKindThrottled
	case code == http.StatusGatewayTimeout:
		return APIKindTimeout
	case code >= 400 && code <= 499:
		return APIKindHTTP4xx
	case code >= 500 && code <= 599:
		return APIKindHTTP5xx
	}
	return APIKindHTTPOther
}

// progress calls opts.Progress about once per second until done is closed.
func (l *apiLoad) progress(start time.Time, done <-chan struct{}) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	last, lastAt := int64(0), start
	for {
		select {
		case <-done:
			return
		case now := <-t.C:
			n := l.answered.Load()
			l.mu.Lock()
			var e int64
			for _, c := range l.errs {
				e += c
			}
			l.mu.Unlock()
			l.opts.Progress(Progress{Elapsed: now.Sub(start), Requests: n, Errors: e, RPS: float64(n-last) / now.Sub(lastAt).Seconds()})
			last, lastAt = n, now
		}
	}
}

// validateNamespace returns why ns is not a namespace name (a DNS-1123
// label), or "".
func validateNamespace(ns string) string {
	return strings.Join(validation.IsDNS1123Label(ns), "; ")
}

// isEmptyConfig reports whether err (wrapped by kubeconfig.Load) is
// clientcmd's "no configuration has been provided", which IsEmptyConfig
// recognises only unwrapped.
func isEmptyConfig(err error) bool {
	for ; err != nil; err = errors.Unwrap(err) {
		if clientcmd.IsEmptyConfig(err) {
			return true
		}
	}
	return false
}

// primeMax bounds primeTraces: above gRPC's 120 s longest reconnect
// backoff (google.golang.org/grpc backoff.DefaultConfig.MaxDelay), which an
// API server whose exporter found no receiver for minutes may be in.
const primeMax = 150 * time.Second

// ErrNoTraces is wrapped when no span from the API server reaches the
// trace receiver.
var ErrNoTraces = errors.New("no span from the API server reached the trace receiver")

// primeTraces sends one dry-run create per second (not counted in the
// report; before the first /metrics scrape) until a span of the API server
// (any span that is not kadmit's) arrives at rcv, so the run starts with
// its exporter connected: one that found nothing listening retries with a
// growing backoff and drops what its queue cannot hold meanwhile.
func primeTraces(ctx context.Context, rcv *otlpreceiver.Receiver, primer *apiLoad) error {
	st0 := rcv.Stats()
	deadline := time.NewTimer(primeMax)
	defer deadline.Stop()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		st := rcv.Stats()
		if st.Calls > st0.Calls || st.Ignored > st0.Ignored {
			return nil
		}
		primer.create(ctx)
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the API server's spans: %w", ctx.Err())
		case <-deadline.C:
			return fmt.Errorf("%w (%s) within %s of dry-run creates: start the API server with --tracing-config-file, a TracingConfiguration (apiserver.config.k8s.io/v1) with endpoint %s and samplingRatePerMillion 1000000", ErrNoTraces, rcv.Addr(), primeMax, rcv.Addr())
		case <-tick.C:
		}
	}
}
