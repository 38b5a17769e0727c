// Package daemon assembles the `kadmit serve` process: configuration,
// serving certificate and its lifecycle, HTTPS server and self-registration.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/certs"
	"github.com/kadmit/kadmit/internal/lifecycle"
	"github.com/kadmit/kadmit/internal/metrics"
	"github.com/kadmit/kadmit/internal/policy/builtin"
	"github.com/kadmit/kadmit/internal/registration"
	"github.com/kadmit/kadmit/internal/server"
)

// TLS modes.
const (
	// TLSSelfManaged: kadmit keeps its CA and serving certificate in a
	// Secret, rotates them and injects the caBundle (the in-cluster default).
	TLSSelfManaged = "self-managed"
	// TLSFiles: tls.crt and tls.key in --cert-dir, reloaded on change
	// (cert-manager, a mounted Secret).
	TLSFiles = "files"
	// TLSSelfSigned: an in-memory CA and certificate for development.
	TLSSelfSigned = "self-signed"
)

// Options are `kadmit serve`'s settings.
type Options struct {
	ConfigFile string // empty: the seed profile
	// ConfigMap, "namespace/name", is an alternative to ConfigFile that is
	// followed live: a valid edit is applied without a restart.
	ConfigMap string
	// ConfigKey is the ConfigMap data key; default config.yaml.
	ConfigKey       string
	Addr            string
	MetricsAddr     string
	ShutdownGrace   time.Duration
	MaxRequestBytes int64
	// Pprof serves net/http/pprof on the metrics listener (debugging).
	Pprof bool
	// Hardening: bounds, mutual TLS and metrics authentication; see
	// server.Options and docs/security.md.
	ReadTimeout          time.Duration
	MaxConnections       int
	MaxInFlight          int
	MaxBodyBytesInFlight int64
	HTTP2                bool
	ClientCAFile         string
	ClientAllowedNames   []string
	MetricsSecure        bool

	// TLSMode is TLSSelfManaged, TLSFiles or TLSSelfSigned.
	TLSMode string
	CertDir string
	// SANs are extra serving-certificate names (DNS names or IP literals).
	SANs []string
	// CAFile receives the self-signed CA (PEM) for the caller; optional.
	CAFile string
	// Self-managed certificates.
	SecretName                  string
	ClusterDomain               string
	KeyType                     string
	ServingValidity, CAValidity time.Duration
	LeaseName, Identity         string
	LeaseDuration               time.Duration
	RenewDeadline               time.Duration
	RetryPeriod                 time.Duration
	SettleDelay                 time.Duration

	// Register writes kadmit's webhook configurations once a replica is ready.
	Register bool
	// WebhookURL is the base URL the API server calls in dev mode.
	WebhookURL string
	// Namespace is kadmit's own namespace (Secret, Lease, Service); it is
	// always excluded from kadmit's webhooks.
	Namespace    string
	ServiceName  string
	ServicePort  int32
	CABundleFile string
	Kubeconfig   string
	KubeContext  string
}

// ErrUsage is wrapped by errors in Options themselves (exit code 2).
var ErrUsage = errors.New("usage")

// Run serves until ctx is cancelled and returns nil after a clean drain.
func Run(ctx context.Context, opts Options, log *slog.Logger) error {
	// client-go (leader election, informers) logs through klog: keep one
	// log stream in one format.
	klog.SetSlogLogger(log)
	var cs kubernetes.Interface
	var err error
	if opts.Register || opts.TLSMode == TLSSelfManaged || opts.ConfigMap != "" {
		if cs, err = clientset(opts.Kubeconfig, opts.KubeContext); err != nil {
			return err
		}
	}
	cfg, err := loadConfig(ctx, cs, opts)
	if err != nil {
		return err
	}
	rl := &reloader{ctx: ctx, opts: opts, log: log, cfg: cfg}
	hooks, err := rl.build(ctx, cfg)
	if err != nil {
		return err
	}
	webhooks, err := admission.NewWebhooks(hooks)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	certMetrics, err := metrics.NewCertificates(reg)
	if err != nil {
		return err
	}
	if rl.metrics, err = metrics.NewConfigReloads(reg); err != nil {
		return err
	}

	regOpts := registration.Options{URL: opts.WebhookURL, ServicePort: opts.ServicePort}
	if opts.WebhookURL == "" {
		regOpts.ServiceNamespace, regOpts.ServiceName = opts.Namespace, opts.ServiceName
	}
	if opts.Namespace != "" {
		regOpts.ExcludeNamespaces = []string{opts.Namespace}
	}
	if opts.Register {
		if _, _, err := registration.Build(hooks, regOpts); err != nil {
			return fmt.Errorf("%w: %w", ErrUsage, err)
		}
	}

	holder := &certs.Holder{}
	var srv *server.Server
	var readyChecks []func() error
	var start func(context.Context) error // runs once the listener is bound
	var caBundle []byte
	switch opts.TLSMode {
	case TLSSelfSigned:
		b, err := selfSigned(opts.SANs, opts.WebhookURL)
		if err != nil {
			return err
		}
		c, err := b.TLSCertificate()
		if err != nil {
			return err
		}
		holder.Set(c)
		certMetrics.Loaded(c.Leaf, nil)
		caBundle = b.CACert
		if opts.CAFile != "" {
			if err := os.WriteFile(opts.CAFile, b.CACert, 0o644); err != nil {
				return fmt.Errorf("write CA to %s: %w", opts.CAFile, err)
			}
		}
		log.Info("issued self-signed serving certificate", "sans", c.Leaf.DNSNames, "ips", c.Leaf.IPAddresses, "notAfter", c.Leaf.NotAfter, "caFile", opts.CAFile)
	case TLSFiles:
		if opts.CertDir == "" {
			return fmt.Errorf("%w: --tls=files needs --cert-dir", ErrUsage)
		}
		w := &certs.DirWatcher{Dir: opts.CertDir, Holder: holder, Logger: log,
			OnReload: func(h *certs.Holder) {
				certMetrics.Loaded(h.Current().Leaf, nil)
				log.Info("serving certificate loaded", "dir", opts.CertDir, "sans", h.Current().Leaf.DNSNames, "notAfter", h.Current().Leaf.NotAfter)
			},
			OnError: func(error) { certMetrics.ReloadError() },
		}
		if err := w.Load(); err != nil {
			return err
		}
		start = func(ctx context.Context) error { go w.Run(ctx); return nil }
		if opts.CABundleFile != "" {
			if caBundle, err = os.ReadFile(opts.CABundleFile); err != nil {
				return fmt.Errorf("read CA bundle: %w", err)
			}
		}
	case TLSSelfManaged:
		spec, serverName, err := selfManagedSpec(opts)
		if err != nil {
			return err
		}
		identity := opts.Identity
		if identity == "" {
			identity, _ = os.Hostname()
		}
		mgr, err := lifecycle.New(lifecycle.Options{
			Client: cs, Namespace: opts.Namespace, SecretName: opts.SecretName, Spec: spec, ServerName: serverName,
			Holder: holder, Register: opts.Register, Hooks: hooks, Registration: regOpts,
			LeaseName: opts.LeaseName, Identity: identity, LeaseDuration: opts.LeaseDuration,
			RenewDeadline: opts.RenewDeadline, RetryPeriod: opts.RetryPeriod, SettleDelay: opts.SettleDelay,
			ListenerReady: func() error { return srv.Serving() }, Metrics: certMetrics, Logger: log,
		})
		if err != nil {
			return fmt.Errorf("%w: %w", ErrUsage, err)
		}
		readyChecks = append(readyChecks, mgr.Ready)
		start = mgr.Start
		rl.register = mgr.SetHooks
	default:
		return fmt.Errorf("%w: --tls %q: must be %s, %s or %s", ErrUsage, opts.TLSMode, TLSSelfManaged, TLSFiles, TLSSelfSigned)
	}

	if opts.Register && opts.TLSMode != TLSSelfManaged {
		// Readiness must mean "the API server can call me" whatever the
		// certificate source: a cert-manager certificate the registered
		// caBundle does not trust makes this replica unready.
		bundle := caBundle
		trust := &lifecycle.Trust{ServerName: apiServerName(opts), Holder: holder,
			Fallback: func() (string, []byte) { return "the registered CA", bundle }}
		readyChecks = append(readyChecks, trust.Ready)
		prev := start
		start = func(ctx context.Context) error {
			if prev != nil {
				if err := prev(ctx); err != nil {
					return err
				}
			}
			return trust.Start(ctx, cs, nil)
		}
	}
	var metricsAuth *rest.Config
	if opts.MetricsSecure {
		if metricsAuth, err = restConfig(opts.Kubeconfig, opts.KubeContext); err != nil {
			return fmt.Errorf("--metrics-secure authenticates scrapers through the API server: %w", err)
		}
	}
	srv, err = server.New(server.Options{
		Addr: opts.Addr, MetricsAddr: opts.MetricsAddr, Webhooks: webhooks, Certs: holder, Logger: log,
		ShutdownGrace: opts.ShutdownGrace, MaxRequestBytes: opts.MaxRequestBytes, Registry: reg, ReadyChecks: readyChecks,
		Pprof: opts.Pprof, MetricsAuth: metricsAuth, ReadTimeout: opts.ReadTimeout, MaxConnections: opts.MaxConnections,
		MaxInFlight: opts.MaxInFlight, MaxBodyBytesInFlight: opts.MaxBodyBytesInFlight, HTTP2: opts.HTTP2,
		ClientCAFile: opts.ClientCAFile, ClientAllowedNames: opts.ClientAllowedNames,
	})
	if err != nil {
		return err
	}
	if err := srv.Listen(); err != nil {
		return err
	}
	serveCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	if start != nil {
		if err := start(serveCtx); err != nil {
			return err
		}
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(serveCtx) }()

	if opts.Register && opts.TLSMode != TLSSelfManaged {
		if len(caBundle) == 0 {
			cancel()
			return errors.Join(fmt.Errorf("%w: --register with --tls=files needs --ca-bundle-file", ErrUsage), <-done)
		}
		// Registering before the server answers would send the API server's
		// first calls into a closed port: with failurePolicy Fail that is an
		// outage. Wait until ready, then write the configurations.
		if err := waitReady(ctx, srv, 30*time.Second); err != nil {
			cancel()
			return errors.Join(err, <-done)
		}
		regOpts.CABundle = caBundle
		mwc, vwc, _ := registration.Build(hooks, regOpts)
		if err := registration.Apply(ctx, cs, mwc, vwc); err != nil {
			cancel()
			return errors.Join(err, <-done)
		}
		log.Info("registered webhook configurations", "name", "kadmit", "url", opts.WebhookURL)
		rl.register = func(hooks []admission.Hook) {
			mwc, vwc, err := registration.Build(hooks, regOpts)
			if err == nil {
				err = registration.Apply(serveCtx, cs, mwc, vwc)
			}
			if err != nil {
				log.Error("re-registering webhooks after a configuration reload failed", "error", err)
			}
		}
	}
	if opts.ConfigMap != "" {
		rl.serve = srv.SetWebhooks
		ns, name, _ := strings.Cut(opts.ConfigMap, "/")
		if err := builtin.Config.WatchConfigMap(serveCtx, cs, ns, name, configKey(opts), rl.reload, rl.invalid); err != nil {
			cancel()
			return errors.Join(err, <-done)
		}
	}
	return <-done
}

// selfManagedSpec derives the serving certificate's SANs and the name the
// API server verifies: <svc>, <svc>.<ns>, <svc>.<ns>.svc and
// <svc>.<ns>.svc.<domain> in Service mode; the URL host in dev mode.
func selfManagedSpec(opts Options) (certs.Spec, string, error) {
	kt, err := certs.ParseKeyType(opts.KeyType)
	if err != nil {
		return certs.Spec{}, "", fmt.Errorf("%w: --key-type: %w", ErrUsage, err)
	}
	if opts.Namespace == "" || opts.SecretName == "" {
		return certs.Spec{}, "", fmt.Errorf("%w: --tls=self-managed needs --namespace and --secret-name", ErrUsage)
	}
	if opts.ServingValidity < time.Minute || opts.CAValidity < opts.ServingValidity {
		return certs.Spec{}, "", fmt.Errorf("%w: validities must be >= 1m with --ca-validity >= --serving-validity", ErrUsage)
	}
	spec := certs.Spec{KeyType: kt, ServingValidity: opts.ServingValidity, CAValidity: opts.CAValidity}
	var serverName string
	sans := append([]string(nil), opts.SANs...)
	if opts.WebhookURL != "" {
		u, err := url.Parse(opts.WebhookURL)
		if err != nil || u.Hostname() == "" {
			return certs.Spec{}, "", fmt.Errorf("%w: --webhook-url %q has no host", ErrUsage, opts.WebhookURL)
		}
		serverName = u.Hostname()
		sans = append(sans, serverName)
	} else {
		if opts.ServiceName == "" {
			return certs.Spec{}, "", fmt.Errorf("%w: --tls=self-managed needs --service-name or --webhook-url", ErrUsage)
		}
		svc, ns, domain := opts.ServiceName, opts.Namespace, opts.ClusterDomain
		serverName = svc + "." + ns + ".svc"
		sans = append(sans, svc, svc+"."+ns, serverName, serverName+"."+domain)
	}
	spec.DNSNames, spec.IPs = splitSANs(sans)
	return spec, serverName, nil
}

// splitSANs sorts SANs into DNS names and IP literals, dropping repeats.
func splitSANs(sans []string) (dnsNames []string, ips []net.IP) {
	seen := map[string]bool{}
	for _, s := range sans {
		if seen[s] {
			continue
		}
		seen[s] = true
		if ip := net.ParseIP(s); ip != nil {
			ips = append(ips, ip)
		} else {
			dnsNames = append(dnsNames, s)
		}
	}
	return dnsNames, ips
}

// apiServerName is the name the API server verifies kadmit's certificate
// for: the --webhook-url host in dev mode, else <svc>.<ns>.svc.
func apiServerName(opts Options) string {
	if u, err := url.Parse(opts.WebhookURL); opts.WebhookURL != "" && err == nil {
		return u.Hostname()
	}
	return opts.ServiceName + "." + opts.Namespace + ".svc"
}

func waitReady(ctx context.Context, srv *server.Server, timeout time.Duration) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		err := srv.Ready()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			return fmt.Errorf("server not ready after %s: %w", timeout, err)
		case <-tick.C:
		}
	}
}

func selfSigned(sans []string, webhookURL string) (*certs.Bundle, error) {
	if u, err := url.Parse(webhookURL); webhookURL != "" && err == nil && u.Hostname() != "" {
		sans = append(sans, u.Hostname())
	}
	if len(sans) == 0 {
		return nil, fmt.Errorf("%w: --tls=self-signed needs --dns-name or --webhook-url", ErrUsage)
	}
	var opts certs.SelfSignedOptions
	opts.DNSNames, opts.IPs = splitSANs(sans)
	return certs.NewSelfSigned(opts)
}

func clientset(kubeconfig, kubeContext string) (kubernetes.Interface, error) {
	rc, err := restConfig(kubeconfig, kubeContext)
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("build client: %w", err)
	}
	return cs, nil
}

// restConfig loads --kubeconfig (default rules: $KUBECONFIG, ~/.kube/config,
// in-cluster) with user agent kadmit.
func restConfig(kubeconfig, kubeContext string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if kubeconfig != "" {
		rules.ExplicitPath = kubeconfig
	}
	rc, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: kubeContext}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig: %w", err)
	}
	rc.UserAgent = "kadmit"
	return rc, nil
}
