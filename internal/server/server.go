// Package server runs kadmit's HTTPS admission listener and its plain-HTTP
// metrics and health listener, and shuts both down without dropping requests.
package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"sort"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/certs"
	"github.com/kadmit/kadmit/internal/metrics"
)

// Options configure a Server.
type Options struct {
	// Addr is the HTTPS admission listen address; default ":9443".
	Addr string
	// MetricsAddr is the plain-HTTP address for /metrics, /healthz and
	// /readyz; default ":8080"; "0" disables it.
	MetricsAddr string
	// Webhooks are served on their paths.
	Webhooks []*admission.Webhook
	// Certs holds the serving certificate; required.
	Certs *certs.Holder
	// Logger receives one info line per decision; default slog.Default().
	Logger *slog.Logger
	// ShutdownGrace bounds how long in-flight requests may take to finish
	// after shutdown starts; default 30s.
	ShutdownGrace time.Duration
	// MaxRequestBytes bounds AdmissionReview bodies; 0 means the default.
	MaxRequestBytes int64
	// Registry receives kadmit's metrics; default a new registry with the Go
	// and process collectors.
	Registry *prometheus.Registry
	// Ready, when set, is the whole readiness condition /readyz answers
	// (readiness.Gate.Check, which includes Serving). Default: Serving and
	// a valid certificate in Certs.
	Ready func() error
	// Pprof serves net/http/pprof under /debug/pprof/ on the plain-HTTP
	// metrics listener (never on the admission listener), for debugging:
	// heap and CPU profiles of a running server. Off by default; ignored
	// when the metrics listener is disabled.
	Pprof bool
}

// Server is a running or runnable kadmit server.
type Server struct {
	opts     Options
	log      *slog.Logger
	metrics  *metrics.Metrics
	https    *http.Server
	plain    *http.Server
	httpsLn  net.Listener
	plainLn  net.Listener
	serving  atomic.Bool
	stopping atomic.Bool
	// routes maps each admission path to its handler; swapped whole by
	// SetWebhooks so a config reload never serves half a policy set.
	routes atomic.Pointer[map[string]http.Handler]
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
		opts.MetricsAddr = ":8080"
	}
	if opts.ShutdownGrace <= 0 {
		opts.ShutdownGrace = 30 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Registry == nil {
		opts.Registry = prometheus.NewRegistry()
		opts.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	m, err := metrics.New(opts.Registry)
	if err != nil {
		return nil, fmt.Errorf("server: register metrics: %w", err)
	}
	s := &Server{opts: opts, log: opts.Logger, metrics: m}

	s.SetWebhooks(opts.Webhooks)
	mux := http.NewServeMux()
	mux.HandleFunc("/", s.route)
	s.health(mux)
	s.https = &http.Server{
		Handler: mux,
		TLSConfig: &tls.Config{
			MinVersion:     tls.VersionTLS12,
			GetCertificate: opts.Certs.GetCertificate,
		},
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       90 * time.Second,
		ErrorLog:          slog.NewLogLogger(opts.Logger.Handler(), slog.LevelDebug),
	}
	if opts.MetricsAddr != "0" {
		pm := http.NewServeMux()
		pm.Handle("/metrics", promhttp.HandlerFor(opts.Registry, promhttp.HandlerOpts{Registry: opts.Registry}))
		s.health(pm)
		if opts.Pprof {
			pm.HandleFunc("/debug/pprof/", pprof.Index)
			pm.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
			pm.HandleFunc("/debug/pprof/profile", pprof.Profile)
			pm.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
			pm.HandleFunc("/debug/pprof/trace", pprof.Trace)
		}
		s.plain = &http.Server{Handler: pm, ReadHeaderTimeout: 10 * time.Second}
	}
	return s, nil
}

// SetWebhooks replaces the served webhooks atomically: requests already in
// flight finish on the old set, new ones get the new set. Paths no longer
// served answer 404.
func (s *Server) SetWebhooks(webhooks []*admission.Webhook) {
	routes := make(map[string]http.Handler, len(webhooks))
	for _, wh := range webhooks {
		h := admission.NewHandler(wh, admission.HandlerOptions{MaxRequestBytes: s.opts.MaxRequestBytes, Observe: s.observe})
		routes[wh.Path] = s.metrics.InFlight(wh.Path, h)
	}
	s.routes.Store(&routes)
}

func (s *Server) route(w http.ResponseWriter, r *http.Request) {
	h, ok := (*s.routes.Load())[r.URL.Path]
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
		_, _ = w.Write([]byte("ok\n"))
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
	s.httpsLn = ln
	if s.plain != nil {
		pln, err := net.Listen("tcp", s.opts.MetricsAddr)
		if err != nil {
			ln.Close()
			return fmt.Errorf("listen on %s: %w", s.opts.MetricsAddr, err)
		}
		s.plainLn = pln
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
		go func() { errc <- s.plain.Serve(s.plainLn) }()
	}
	s.serving.Store(true)
	s.log.Info("serving admission webhooks", "addr", s.httpsLn.Addr().String(), "metrics", addrString(s.plainLn), "paths", s.paths())

	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errc:
		serveErr = fmt.Errorf("serve: %w", serveErr)
	}
	s.stopping.Store(true)
	s.log.Info("shutting down: draining in-flight requests", "grace", s.opts.ShutdownGrace.String())
	// The caller's ctx is already done; the grace period needs its own.
	shutCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.ShutdownGrace)
	defer cancel()
	err := s.https.Shutdown(shutCtx)
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

func (s *Server) paths() []string {
	routes := *s.routes.Load()
	out := make([]string, 0, len(routes))
	for p := range routes {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

func (s *Server) observe(d admission.Decision) {
	s.metrics.Observe(d)
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
		s.log.LogAttrs(context.Background(), slog.LevelError, "policy panicked; answered 500 so failurePolicy applies",
			append(attrs, slog.String("policy", d.Panic.Policy), slog.Any("panic", d.Panic.Value), slog.String("stack", string(d.Panic.Stack)))...)
	case d.Err != nil:
		s.log.LogAttrs(context.Background(), slog.LevelWarn, "request not admitted: "+d.Err.Error(), attrs...)
	default:
		attrs = append(attrs, slog.Bool("allowed", d.Allowed))
		if !d.Allowed {
			attrs = append(attrs, slog.String("policy", d.Policy), slog.Int("code", int(d.ResultCode)), slog.String("message", d.Message))
		}
		if d.Patched {
			attrs = append(attrs, slog.Bool("patched", true))
		}
		s.log.LogAttrs(context.Background(), slog.LevelInfo, "admission decision", attrs...)
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
