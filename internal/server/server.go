// Package server runs kadmit's HTTPS admission listener and its plain-HTTP
// metrics and health listener, and shuts both down without dropping requests.
package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/pprof"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kadmit/kadmit/pkg/webhookcerts"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/client-go/rest"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/certs"
	"github.com/kadmit/kadmit/internal/metrics"
	"github.com/kadmit/kadmit/internal/tracing"
)

// Defaults of the bounds in Options; docs/security.md adds them up.
const (
	// DefaultReadTimeout bounds reading one request, headers and body: 30s,
	// the largest timeoutSeconds the API server accepts for a webhook, so
	// no call the API server still waits for is cut short.
	DefaultReadTimeout = 30 * time.Second
	// DefaultReadHeaderTimeout bounds the TLS handshake and the request
	// headers: 10s.
	DefaultReadHeaderTimeout = 10 * time.Second
	// DefaultMaxConnections bounds open admission connections: 512.
	DefaultMaxConnections = 512
	// DefaultMaxHeaderBytes bounds request headers: 64 KiB (the API server
	// sends a few hundred bytes).
	DefaultMaxHeaderBytes = 64 << 10
	// IdleTimeout closes an admission connection idle this long: 2 minutes,
	// longer than the API server's webhook client keeps an idle connection
	// (client-go's transport, k8s.io/apimachinery v0.37.1
	// pkg/util/net/http.go SetOldTransportDefaults: http.DefaultTransport's
	// IdleConnTimeout, 90s), so the client always closes first. With equal
	// timeouts kadmit could close a connection just as the API server sends
	// a review on it; net/http does not retry a POST it has written
	// (Transport.shouldRetryRequest), so that call fails and the webhook's
	// failurePolicy decides the request. Idle connections are bounded by
	// MaxConnections.
	IdleTimeout = 2 * time.Minute
	// DefaultMetricsMaxConnections bounds open connections on the metrics
	// and health listener: 64. Its clients are one or two Prometheus
	// scrapers (one kept-alive connection each) and the kubelet's probes
	// (a fresh connection per probe); 64 idle TLS connections cost about
	// 3 MiB (TestHostileMetricsConnectionFlood measures 47 KiB each). At the bound an idle connection of the address holding the
	// most is closed to make room (limitListener), so probes get in during
	// a flood.
	DefaultMetricsMaxConnections = 64
	// metricsReadTimeout bounds reading one metrics/health request (GETs
	// with no body), the TLS handshake included: 10s.
	metricsReadTimeout = 10 * time.Second
	// metricsWriteTimeout bounds writing one answer to a reader that does
	// not read: 60s, enough for /debug/pprof/profile's default 30-second
	// profile (net/http/pprof refuses a profile longer than WriteTimeout).
	metricsWriteTimeout = 60 * time.Second
	// metricsIdleTimeout closes a kept-alive metrics connection idle this
	// long: 90s. Prometheus scrapes every 15-60s; a scraper whose idle
	// connection is closed just redials (a GET is retried by net/http).
	metricsIdleTimeout = 90 * time.Second
	// HTTP/2, when enabled: streams per connection, largest frame read and
	// receive windows. Each stream is a request and takes an in-flight slot
	// like any other; the windows bound unread body bytes per connection.
	http2MaxStreams        = 100
	http2MaxReadFrameSize  = 16 << 10
	http2MaxReceiveConn    = 64 << 10
	http2MaxReceiveStream  = 64 << 10
	http2MaxHeaderTableLen = 4 << 10
)

// Options configure a Server.
type Options struct {
	// Addr is the HTTPS admission listen address; default ":9443".
	Addr string
	// MetricsAddr is the address for /metrics, /healthz and /readyz;
	// default "127.0.0.1:8080" (plain HTTP) or ":8443" (MetricsAuth set);
	// "0" disables it.
	MetricsAddr string
	// MetricsAuth, when set, makes the metrics listener HTTPS (serving
	// certificate from Certs) and requires, for /metrics and
	// /debug/pprof/, a bearer token the API server authenticates
	// (TokenReview) and authorizes for "get" on that non-resource URL
	// (SubjectAccessReview); see metricsAuth. /healthz and /readyz stay
	// open for the kubelet. Nil: plain HTTP, no authentication.
	MetricsAuth *rest.Config
	// Webhooks are served on their paths.
	Webhooks []*admission.Webhook
	// Certs holds the serving certificate; required.
	Certs *webhookcerts.Holder
	// ClientCAFile, when set, makes the admission listener require a
	// client certificate signed by a CA in this PEM file (re-read when it
	// changes): mutual TLS with the API server.
	ClientCAFile string
	// ClientAllowedNames, with ClientCAFile, further requires the client
	// certificate's subject common name or a DNS SAN to be one of these.
	ClientAllowedNames []string
	// Logger receives the decisions DecisionLog selects (every one when
	// it is enabled at debug level, as New finds it), and is the base of
	// the request-scoped logger each review's context carries
	// (logging.FromContext: with "webhook" and "uid"); default
	// slog.Default().
	Logger *slog.Logger
	// DecisionLog chooses the allowed decisions logged (denials, errors and
	// panics always are); nil: DefaultDecisionLog().
	DecisionLog *DecisionLog
	// ShutdownGrace bounds how long in-flight reviews may take to finish
	// after shutdown starts; default 30s. Requests still reading their body
	// and connections with no review in progress are closed at once.
	ShutdownGrace time.Duration
	// Drain, when positive, is how long after shutdown starts the
	// admission listener keeps accepting and answering before the grace
	// period above begins (it counts against ShutdownGrace and must be
	// shorter). /readyz fails from the start, so the kubelet takes the
	// endpoint out of the Service's ready and serving endpoints and
	// kube-proxy stops routing new connections here; meanwhile every HTTP/1
	// answer carries "Connection: close", so the API server retires each
	// pooled connection after an answer instead of writing a review into a
	// connection being closed (EOF, broken pipe), and connections kube-proxy
	// still sends here (every replica terminating at once: it then uses
	// serving terminating endpoints) are answered, not refused. Zero: no
	// drain, the listener closes at once (tests, a terminal). Measured on a
	// real cluster (test/deploy/chartcluster): without it, 5 of 12,000
	// admissions failed across 70 restarts, drains and upgrades.
	Drain time.Duration
	// ReadTimeout bounds reading one request, headers and body, counted
	// from its first byte; default DefaultReadTimeout.
	ReadTimeout time.Duration
	// MaxConnections bounds open admission connections; beyond it a new
	// connection is closed at accept. Default DefaultMaxConnections.
	MaxConnections int
	// MetricsMaxConnections bounds open connections on the metrics and
	// health listener; beyond it an idle connection of the busiest source
	// address is closed, or the new one (limitListener). Default
	// DefaultMetricsMaxConnections.
	MetricsMaxConnections int
	// MaxInFlight bounds admission requests in flight (abandoned reviews
	// beyond MaxAbandonedReviews included); beyond it requests get HTTP
	// 503. Default admission.DefaultMaxInFlight.
	MaxInFlight int
	// MaxAbandonedReviews bounds the reviews abandoned at their deadline
	// that release their in-flight slot and body bytes at once
	// (admission.Limits.SetMaxAbandoned); further abandoned reviews keep
	// both until their policy returns. Default
	// admission.DefaultMaxAbandoned.
	MaxAbandonedReviews int
	// MaxBodyBytesInFlight bounds the body buffers of all requests at once;
	// beyond it requests get HTTP 503. Default
	// admission.DefaultMaxBodyBytesInFlight.
	MaxBodyBytesInFlight int64
	// HTTP2 offers HTTP/2 on the admission listener (off: HTTP/1.1 only).
	// See docs/security.md for why it is opt-in.
	HTTP2 bool
	// MaxRequestBytes bounds AdmissionReview bodies; 0 means the default.
	MaxRequestBytes int64
	// Registry receives kadmit's metrics; default a new registry with the Go
	// and process collectors.
	Registry *prometheus.Registry
	// Ready, when set, is the whole readiness condition /readyz answers
	// (readiness.Gate.Check, which includes Serving). Default: Serving and
	// a valid certificate in Certs.
	Ready func() error
	// Degraded, when set, reports what this replica does not serve while
	// it stays ready (readiness.Gate.Degraded): /readyz answers 200 with
	// "ok\ndegraded: <reason>\n".
	Degraded func() error
	// Pprof serves net/http/pprof under /debug/pprof/ on the metrics
	// listener (never on the admission listener), for debugging: heap and
	// CPU profiles of a running server. Off by default; ignored when the
	// metrics listener is disabled; authenticated like /metrics when
	// MetricsAuth is set.
	Pprof bool
	// Unserved, when set, reports whether the API server may still call a
	// path no webhook is served on (registration.Registrar.Calls): a
	// policy just turned off whose configuration the API server has not
	// caught up with, or a stale one a restart finds. Such a request is
	// answered allowed, without a patch (what "off" means), under the
	// webhook label UnservedWebhook; any other unknown path gets 404.
	Unserved func(path string) bool
	// Tracing, when set, records a span per admission review
	// (tracing.Tracer.Wrap); nil (the default) leaves the handlers
	// unwrapped, so tracing off costs nothing per request.
	Tracing *tracing.Tracer
}

// UnservedWebhook is the webhook label (metrics, log) of the answers on
// paths the API server may still call but no webhook is served on; never a
// path, so it names no policy.
const UnservedWebhook = "unserved"

// Server is a running or runnable kadmit server.
type Server struct {
	opts     Options
	log      *slog.Logger
	metrics  *metrics.Metrics
	limitsM  *metrics.Limits
	boundsM  *metrics.Bounds
	limits   *admission.Limits
	tracker  *tracker
	throttle *throttle
	https    *http.Server
	plain    *http.Server
	httpsLn  net.Listener
	connLn   *limitListener
	plainLn  net.Listener
	// metricsLn bounds the metrics listener's connections (plainLn wraps it).
	metricsLn *limitListener
	serving   atomic.Bool
	stopping  atomic.Bool
	draining  atomic.Bool
	// fallback is the metrics listener's certificate until Certs has one.
	fallbackOnce sync.Once
	fallback     *tls.Certificate
	fallbackErr  error
	// routes maps each admission path to its handler; swapped whole by
	// SetWebhooks so a config reload never serves half a policy set.
	routes atomic.Pointer[map[string]http.Handler]
	// unserved answers Options.Unserved's paths: an empty webhook allows.
	unserved http.Handler
	// logAll: the logger is enabled at debug level, every decision is
	// logged; otherwise sampler picks the allowed ones (Options.DecisionLog).
	logAll  bool
	sampler *sampler
}

// New validates opts and builds the server; call Listen, then Serve.
func New(opts Options) (*Server, error) {
	if opts.Certs == nil {
		return nil, errors.New("server: a certificate holder is required")
	}
	if opts.Addr == "" {
		opts.Addr = ":9443"
	}
	if opts.MetricsAddr == "" {
		opts.MetricsAddr = "127.0.0.1:8080"
		if opts.MetricsAuth != nil {
			opts.MetricsAddr = ":8443"
		}
	}
	if opts.ShutdownGrace <= 0 {
		opts.ShutdownGrace = 30 * time.Second
	}
	if opts.Drain < 0 || opts.Drain >= opts.ShutdownGrace {
		return nil, fmt.Errorf("server: drain %s: want 0 or more, and less than the shutdown grace %s it counts against", opts.Drain, opts.ShutdownGrace)
	}
	if opts.ReadTimeout <= 0 {
		opts.ReadTimeout = DefaultReadTimeout
	}
	if opts.MaxConnections <= 0 {
		opts.MaxConnections = DefaultMaxConnections
	}
	if opts.MetricsMaxConnections <= 0 {
		opts.MetricsMaxConnections = DefaultMetricsMaxConnections
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	decisionLog := DefaultDecisionLog()
	if opts.DecisionLog != nil {
		decisionLog = *opts.DecisionLog
	}
	if err := decisionLog.validate(); err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	if opts.Registry == nil {
		opts.Registry = prometheus.NewRegistry()
		opts.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	m, err := metrics.New(opts.Registry)
	if err != nil {
		return nil, fmt.Errorf("server: register metrics: %w", err)
	}
	s := &Server{opts: opts, log: opts.Logger, metrics: m, tracker: newTracker(), throttle: newThrottle(),
		limits: admission.NewLimits(opts.MaxInFlight, opts.MaxBodyBytesInFlight)}
	s.limits.SetMaxAbandoned(opts.MaxAbandonedReviews)
	// The level is fixed for the life of the logger (logging.New), so it
	// is read once rather than per decision.
	s.logAll = opts.Logger.Enabled(context.Background(), slog.LevelDebug)
	s.sampler = newSampler(decisionLog)
	s.connLn = &limitListener{max: int64(opts.MaxConnections)}
	s.metricsLn = &limitListener{max: int64(opts.MetricsMaxConnections), evict: true}
	s.limitsM, err = metrics.NewLimits(opts.Registry, metrics.LimitsSource{
		InFlight: s.limits.InFlight, Abandoned: s.limits.Abandoned, BodyBytes: s.limits.BodyBytes,
		Connections: s.connLn.open.Load,
		MaxInFlight: int64(s.limits.MaxInFlight()), MaxBodyBytes: s.limits.MaxBodyBytes(), MaxConnections: int64(opts.MaxConnections),
	})
	if err != nil {
		return nil, fmt.Errorf("server: register metrics: %w", err)
	}
	s.boundsM, err = metrics.NewBounds(opts.Registry, metrics.BoundsSource{
		MetricsConnections: s.metricsLn.open.Load, MaxMetricsConnections: int64(opts.MetricsMaxConnections),
		AbandonedTotal: s.limits.AbandonedTotal, AbandonedBytes: s.limits.AbandonedBytes, MaxAbandoned: int64(s.limits.MaxAbandoned()),
	})
	if err != nil {
		return nil, fmt.Errorf("server: register metrics: %w", err)
	}
	s.connLn.refused = func() {
		s.limitsM.Refused("connections")
		s.throttle.log(context.Background(), s.log, slog.LevelWarn, "connection refused: kadmit is at its limit of open connections", slog.Int("maxConnections", opts.MaxConnections))
	}

	s.SetWebhooks(opts.Webhooks)
	// The routes hold them now: a copy in s.opts, or in opts, which the
	// listeners' refusal callbacks capture, would keep the start's
	// policies (a declared policy engine with its compiled programs)
	// alive after the first reload replaced them.
	opts.Webhooks, s.opts.Webhooks = nil, nil
	s.unserved = s.metrics.InFlight(UnservedWebhook, admission.NewHandler(&admission.Webhook{Path: UnservedWebhook, Type: admission.Validating},
		admission.HandlerOptions{MaxRequestBytes: opts.MaxRequestBytes, Limits: s.limits, Observe: s.observe, Logger: s.log}))
	mux := http.NewServeMux()
	mux.Handle("/", s.closeWhenDraining(s.tracker.wrap(http.HandlerFunc(s.route))))
	s.health(mux)
	tlsConfig := &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: opts.Certs.GetCertificate,
	}
	var handshakeLine func(string)
	if opts.ClientCAFile != "" {
		ca, err := newClientCA(opts.ClientCAFile, opts.ClientAllowedNames, s.boundsM.ClientCertRefused)
		if err != nil {
			return nil, fmt.Errorf("server: %w", err)
		}
		ca.configure(tlsConfig)
		handshakeLine = ca.handshakeLogLine
	} else if len(opts.ClientAllowedNames) > 0 {
		return nil, errors.New("server: allowed client names need a client CA file")
	}
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetHTTP2(opts.HTTP2)
	s.https = &http.Server{
		Handler:           mux,
		TLSConfig:         tlsConfig,
		Protocols:         &protocols,
		ReadHeaderTimeout: min(DefaultReadHeaderTimeout, opts.ReadTimeout),
		ReadTimeout:       opts.ReadTimeout,
		// Answers are small; the extra 5s covers writing one to a slow
		// reader after a review that used its whole deadline.
		WriteTimeout:   opts.ReadTimeout + 5*time.Second,
		IdleTimeout:    IdleTimeout,
		MaxHeaderBytes: DefaultMaxHeaderBytes,
		ConnState:      s.tracker.connState,
		ConnContext:    s.tracker.connContext,
		ErrorLog:       s.throttle.errorLog(opts.Logger, handshakeLine),
		HTTP2: &http.HTTP2Config{
			MaxConcurrentStreams:          http2MaxStreams,
			MaxReadFrameSize:              http2MaxReadFrameSize,
			MaxReceiveBufferPerConnection: http2MaxReceiveConn,
			MaxReceiveBufferPerStream:     http2MaxReceiveStream,
			MaxDecoderHeaderTableSize:     http2MaxHeaderTableLen,
			MaxEncoderHeaderTableSize:     http2MaxHeaderTableLen,
		},
	}
	if opts.MetricsAddr != "0" {
		if err := s.buildMetricsServer(); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// With Pprof: sample one contended mutex event in 10, and goroutine blocking
// events of 10 µs or more (a rate is in nanoseconds).
const (
	pprofMutexFraction = 10
	pprofBlockRate     = int(10 * time.Microsecond)
)

// buildMetricsServer serves /metrics (and /debug/pprof/ with Pprof), behind
// Kubernetes authentication and authorization when MetricsAuth is set, and
// the unauthenticated health probes.
func (s *Server) buildMetricsServer() error {
	opts := s.opts
	protected := http.NewServeMux()
	protected.Handle("/metrics", promhttp.HandlerFor(opts.Registry, promhttp.HandlerOpts{Registry: opts.Registry}))
	if opts.Pprof {
		// The mutex and block profiles record nothing until their rates
		// are set; contention on the admission path is what they are
		// for. One event in pprofMutexFraction, and blocking of
		// pprofBlockRate or more: a few percent of CPU at most, and
		// --pprof is for debugging only.
		runtime.SetMutexProfileFraction(pprofMutexFraction)
		runtime.SetBlockProfileRate(pprofBlockRate)
		protected.HandleFunc("/debug/pprof/", pprof.Index)
		protected.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		protected.HandleFunc("/debug/pprof/profile", pprof.Profile)
		protected.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		protected.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	var handler http.Handler = protected
	if opts.MetricsAuth != nil {
		var err error
		if handler, err = metricsAuth(opts.MetricsAuth, s.log, s.throttle, s.boundsM.MetricsAuthLimited, protected); err != nil {
			return fmt.Errorf("server: %w", err)
		}
	}
	pm := http.NewServeMux()
	pm.Handle("/", handler)
	s.health(pm)
	// The same bounds as the admission listener (a TLS handshake and the
	// headers within 10s, 64 KiB of headers, a connection cap), sized for
	// GETs: the kubelet's probes and Prometheus.
	s.metricsLn.refused = func() {
		s.limitsM.Refused("metrics-connections")
		s.throttle.log(context.Background(), s.log, slog.LevelWarn, "metrics connection closed: kadmit is at its limit of open metrics connections", slog.Int("metricsMaxConnections", opts.MetricsMaxConnections))
	}
	s.plain = &http.Server{
		Handler:           pm,
		ReadHeaderTimeout: DefaultReadHeaderTimeout,
		ReadTimeout:       metricsReadTimeout,
		WriteTimeout:      metricsWriteTimeout,
		IdleTimeout:       metricsIdleTimeout,
		MaxHeaderBytes:    DefaultMaxHeaderBytes,
		ConnState:         s.metricsLn.connState,
		ErrorLog:          s.throttle.errorLog(opts.Logger, nil),
	}
	if opts.MetricsAuth != nil {
		var protocols http.Protocols
		protocols.SetHTTP1(true)
		s.plain.Protocols = &protocols
		s.plain.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: s.metricsCertificate}
	}
	return nil
}

// SetWebhooks replaces the served webhooks atomically: requests already in
// flight finish on the old set, new ones get the new set. Paths no longer
// served answer allowed while Options.Unserved says the API server may still
// call them, else 404.
func (s *Server) SetWebhooks(webhooks []*admission.Webhook) {
	routes := make(map[string]http.Handler, len(webhooks))
	for _, wh := range webhooks {
		h := admission.NewHandler(wh, admission.HandlerOptions{MaxRequestBytes: s.opts.MaxRequestBytes, Limits: s.limits, Observe: s.observe, AbandonedRan: s.boundsM.AbandonedRan, Logger: s.log})
		if s.opts.Tracing != nil {
			h = s.opts.Tracing.Wrap(wh.Path, h)
		}
		routes[wh.Path] = s.metrics.InFlight(wh.Path, h)
	}
	s.routes.Store(&routes)
}

func (s *Server) route(w http.ResponseWriter, r *http.Request) {
	h, ok := (*s.routes.Load())[r.URL.Path]
	if !ok && s.opts.Unserved != nil && s.opts.Unserved(r.URL.Path) {
		h, ok = s.unserved, true
	}
	if !ok {
		http.Error(w, fmt.Sprintf("no webhook is served on %s", r.URL.Path), http.StatusNotFound)
		return
	}
	h.ServeHTTP(w, r)
}

func (s *Server) health(mux *http.ServeMux) {
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := s.Ready(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		msg := "ok\n"
		if s.opts.Degraded != nil {
			if err := s.opts.Degraded(); err != nil {
				msg += "degraded: " + err.Error() + "\n"
			}
		}
		_, _ = w.Write([]byte(msg))
	})
}

// Serving returns nil while the HTTPS listener accepts connections and the
// server is not shutting down.
func (s *Server) Serving() error {
	if s.stopping.Load() {
		return errors.New("shutting down")
	}
	if !s.serving.Load() {
		return errors.New("admission listener not serving")
	}
	return nil
}

// Ready is what /readyz answers: Options.Ready when set; else nil when the
// HTTPS listener serves, the server is not shutting down and a valid
// serving certificate is loaded. Shutting down always makes it fail, so
// endpoints drain whatever Options.Ready says.
func (s *Server) Ready() error {
	if err := s.Serving(); err != nil {
		return err
	}
	if s.opts.Ready != nil {
		return s.opts.Ready()
	}
	return s.opts.Certs.Check(time.Now())
}

// Listen binds both listeners, so callers know the addresses (Addr,
// MetricsAddr) before serving; it returns the bind error.
func (s *Server) Listen() error {
	ln, err := net.Listen("tcp", s.opts.Addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", s.opts.Addr, err)
	}
	s.connLn.Listener = ln
	s.httpsLn = s.connLn
	if s.plain != nil {
		pln, err := net.Listen("tcp", s.opts.MetricsAddr)
		if err != nil {
			ln.Close()
			return fmt.Errorf("listen on %s: %w", s.opts.MetricsAddr, err)
		}
		s.metricsLn.Listener = pln
		s.plainLn = s.metricsLn
	}
	return nil
}

// Addr is the bound HTTPS address (after Listen).
func (s *Server) Addr() net.Addr { return s.httpsLn.Addr() }

// MetricsAddr is the bound metrics address (after Listen), or nil.
func (s *Server) MetricsAddr() net.Addr {
	if s.plainLn == nil {
		return nil
	}
	return s.plainLn.Addr()
}

// Serve serves until ctx is cancelled, then stops accepting connections,
// reports not ready, lets in-flight requests finish within ShutdownGrace and
// returns. It returns an error when a listener fails or in-flight requests
// outlive the grace period (they are then cut off).
func (s *Server) Serve(ctx context.Context) error {
	if s.httpsLn == nil {
		if err := s.Listen(); err != nil {
			return err
		}
	}
	errc := make(chan error, 2)
	go func() { errc <- s.https.ServeTLS(s.httpsLn, "", "") }()
	if s.plain != nil {
		if s.plain.TLSConfig != nil {
			go func() { errc <- s.plain.ServeTLS(s.plainLn, "", "") }()
		} else {
			go func() { errc <- s.plain.Serve(s.plainLn) }()
		}
	}
	s.serving.Store(true)
	s.log.Info("serving admission webhooks", "addr", s.httpsLn.Addr().String(), "metrics", addrString(s.plainLn), "paths", s.paths())

	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errc:
		serveErr = fmt.Errorf("serve: %w", serveErr)
	}
	// Draining before not ready: an answer given once /readyz fails
	// already closes its connection.
	drainNow := s.opts.Drain > 0 && serveErr == nil
	s.draining.Store(drainNow)
	s.stopping.Store(true)
	// The caller's ctx is already done; the grace period needs its own.
	// It starts now: the drain counts against it.
	shutCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.ShutdownGrace)
	defer cancel()
	if drainNow {
		s.log.Info("shutting down: answering while the endpoint leaves the Service, each answer closing its connection", "drain", s.opts.Drain.String())
		drain := time.NewTimer(s.opts.Drain)
		select {
		case <-drain.C:
		case serveErr = <-errc:
			drain.Stop()
			serveErr = fmt.Errorf("serve: %w", serveErr)
		}
	}
	s.log.Info("shutting down: draining in-flight requests", "grace", s.opts.ShutdownGrace.String())
	// Shutdown waits for every connection with a request in progress,
	// including a client that sent half a body and stopped: cut those off
	// (and keep doing so while draining) so only reviews wait.
	stopSweep, swept := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(swept)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			s.tracker.sweep()
			select {
			case <-stopSweep:
				return
			case <-tick.C:
			}
		}
	}()
	err := s.https.Shutdown(shutCtx)
	close(stopSweep)
	<-swept
	if err != nil {
		_ = s.https.Close()
		err = fmt.Errorf("in-flight requests outlived the %s grace period: %w", s.opts.ShutdownGrace, err)
	}
	if s.plain != nil {
		// When the admission drain used up the grace period, shutCtx is
		// already done and Shutdown leaves active connections open: close
		// them so nothing is served after Serve returns.
		if s.plain.Shutdown(shutCtx) != nil {
			_ = s.plain.Close()
		}
	}
	s.serving.Store(false)
	return errors.Join(serveErr, err)
}

// closeWhenDraining makes every HTTP/1 answer given while draining close
// its connection: the client reads "Connection: close" with the answer, so
// no request of its is ever written into a connection kadmit closes.
// HTTP/2 needs nothing: Shutdown's GOAWAY tells the client which streams
// were not processed, and it retries them elsewhere.
func (s *Server) closeWhenDraining(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.draining.Load() && r.ProtoMajor == 1 {
			w.Header().Set("Connection", "close")
		}
		next.ServeHTTP(w, r)
	})
}

// metricsCertificate serves the admission certificate on the secure
// metrics listener, or, while there is none yet (a self-managed replica
// still bootstrapping), an in-memory self-signed one: the kubelet's probes
// do not verify certificates, and /healthz must answer while /readyz says
// why the replica is not ready.
func (s *Server) metricsCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	if c, err := s.opts.Certs.GetCertificate(hello); err == nil {
		return c, nil
	}
	s.fallbackOnce.Do(func() {
		b, err := certs.NewSelfSigned(certs.SelfSignedOptions{DNSNames: []string{"kadmit-metrics"}})
		if err == nil {
			s.fallback, err = b.TLSCertificate()
		}
		s.fallbackErr = err
	})
	return s.fallback, s.fallbackErr
}

func (s *Server) paths() []string {
	return slices.Sorted(maps.Keys(*s.routes.Load()))
}

func (s *Server) observe(ctx context.Context, d admission.Decision) {
	s.metrics.Observe(d)
	if s.opts.Tracing != nil {
		tracing.Record(ctx, d)
	}
	switch {
	case errors.Is(d.Err, admission.ErrInFlightLimit):
		s.limitsM.Refused("in-flight")
	case errors.Is(d.Err, admission.ErrBodyBytesLimit):
		s.limitsM.Refused("body-bytes")
	}
	// Allowed decisions are most of the traffic and the least news: past
	// a burst each second they are sampled (DecisionLog), decided before
	// any attribute is built so an unlogged one costs no allocation.
	// Denials, errors and panics are always logged (the latter two
	// throttled below).
	var sampled bool
	if d.Allowed && d.HTTPCode == http.StatusOK && d.Err == nil && d.Panic == nil && !s.logAll {
		var logged bool
		if logged, sampled = s.sampler.allowed(d.Webhook, d.Latency); !logged {
			return
		}
	}
	attrs := []slog.Attr{
		slog.String("webhook", d.Webhook),
		slog.String("uid", d.UID),
		slog.String("kind", d.Kind),
		slog.String("object", objectRef(d.Namespace, d.Name)),
		slog.String("operation", d.Operation),
		slog.Int("http", d.HTTPCode),
		slog.Duration("latency", d.Latency),
	}
	switch {
	case d.Panic != nil:
		// Throttled like the warnings: a policy that panics on every
		// request must not turn each one into a stack trace in the log.
		s.throttle.log(ctx, s.log, slog.LevelError, "policy panicked; answered 500 so failurePolicy applies",
			append(attrs, slog.String("policy", d.Panic.Policy), slog.Any("panic", d.Panic.Value), slog.String("stack", string(d.Panic.Stack)))...)
	case d.Err != nil:
		s.throttle.log(ctx, s.log, slog.LevelWarn, "request not admitted: "+d.Err.Error(), attrs...)
	default:
		attrs = append(attrs, slog.Bool("allowed", d.Allowed))
		if !d.Allowed {
			attrs = append(attrs, slog.String("policy", d.Policy), slog.Int("code", int(d.ResultCode)), slog.String("message", d.Message))
		}
		if d.Patched {
			attrs = append(attrs, slog.Bool("patched", true))
		}
		if sampled {
			attrs = append(attrs, slog.String("sampled", s.sampler.attr))
		}
		s.log.LogAttrs(ctx, slog.LevelInfo, "admission decision", attrs...)
	}
}

func objectRef(ns, name string) string {
	if ns == "" {
		return name
	}
	return ns + "/" + name
}

func addrString(ln net.Listener) string {
	if ln == nil {
		return "disabled"
	}
	return ln.Addr().String()
}
