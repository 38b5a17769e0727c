// Package serve wires the `kadmit serve` process together: configuration
// and policies, one certificate source (certs.Source, one per --tls mode),
// the registrar (registration.Registrar) that writes and repairs the webhook
// configurations, one readiness gate and the HTTPS server. It holds no logic
// of its own beyond choosing and connecting those parts.
package serve

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/builtin"
	"github.com/kadmit/kadmit/internal/celpolicy"
	"github.com/kadmit/kadmit/internal/certs"
	"github.com/kadmit/kadmit/internal/kubeconfig"
	"github.com/kadmit/kadmit/internal/metrics"
	"github.com/kadmit/kadmit/internal/readiness"
	"github.com/kadmit/kadmit/internal/registration"
	"github.com/kadmit/kadmit/internal/server"
	"github.com/kadmit/kadmit/internal/tracing"
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
	ConfigKey string
	// PolicyPaths are ValidatingAdmissionPolicy / MutatingAdmissionPolicy
	// files or directories (with bindings and params) served next to the
	// built-in policies (package celpolicy); read at start and with every
	// configuration build.
	PolicyPaths []string
	// PolicyConfigMap, "namespace/name", names a ConfigMap whose data keys
	// hold more declared policies (with bindings and params), loaded with
	// PolicyPaths as one set and followed live: a valid edit is swapped in,
	// an invalid edit or a deletion is refused, keeping the running ones.
	PolicyConfigMap string
	Addr            string
	MetricsAddr     string
	ShutdownGrace   time.Duration
	ShutdownDrain   time.Duration
	MaxRequestBytes int64
	// PolicyAllowSensitiveGroups lets declared policies (PolicyPaths and
	// PolicyConfigMap) match the API groups of celpolicy.SensitiveGroups
	// (RBAC, admission, certificates, authentication, authorization);
	// without it such a policy is refused at load. Whoever may write the
	// policies then holds cluster-admin-equivalent power (docs/security.md).
	PolicyAllowSensitiveGroups bool
	// Pprof serves net/http/pprof on the metrics listener (debugging).
	Pprof bool
	// Hardening: bounds, mutual TLS and metrics authentication; see
	// server.Options and docs/security.md.
	ReadTimeout          time.Duration
	MaxConnections       int
	MaxInFlight          int
	MaxBodyBytesInFlight int64
	// PolicyMaxObjectBytes bounds the object the declared policies are
	// evaluated on, PolicyDecodeBytesInFlight the memory of the objects
	// they hold decoded at once (celpolicy.Options; 0: the defaults).
	PolicyMaxObjectBytes      int
	PolicyDecodeBytesInFlight int64
	HTTP2                     bool
	ClientCAFile              string
	ClientAllowedNames        []string
	MetricsSecure             bool
	// MetricsMaxConnections and MaxAbandonedReviews: the metrics
	// listener's connection bound and the abandoned-review bound
	// (server.Options).
	MetricsMaxConnections int
	MaxAbandonedReviews   int
	// DecisionLog chooses the allowed decisions logged
	// (server.Options.DecisionLog); nil: server.DefaultDecisionLog().
	DecisionLog *server.DecisionLog

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

	// Register writes kadmit's webhook configurations once a replica is
	// ready, and repairs them whenever they change.
	Register bool
	// WebhookConfigName names both webhook configurations; one per install
	// (default registration.DefaultName).
	WebhookConfigName string
	// WebhookURL is the base URL the API server calls in dev mode.
	WebhookURL string
	// Namespace is kadmit's own namespace (Secret, Service); it is
	// always excluded from kadmit's webhooks.
	Namespace    string
	ServiceName  string
	ServicePort  int32
	CABundleFile string
	Kubeconfig   string
	KubeContext  string

	// Collectors are registered with kadmit's metrics (the buffered log
	// writer's kadmit_log_lines_dropped_total).
	Collectors []prometheus.Collector
	// Tracing, when set, records a span per review (server.Options.Tracing);
	// the caller owns it and flushes it after Run returns.
	Tracing *tracing.Tracer
}

// ErrUsage is wrapped by errors in Options themselves (exit code 2).
var ErrUsage = errors.New("usage")

func usage(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrUsage, fmt.Sprintf(format, args...))
}

// daemon is one `kadmit serve` being assembled, then run.
type daemon struct {
	opts Options
	log  *slog.Logger
	// kube loads the kubeconfig, once, when a part needs the cluster.
	kube       func() (*rest.Config, error)
	client     kubernetes.Interface
	hooks      []admission.Hook
	reloads    *reloader
	promReg    *prometheus.Registry
	certs      *metrics.Certificates
	regMetrics *metrics.Registration
	names      certs.Names
	serverName string
	source     certs.Source
	rotator    *rotatorSource          // the source in self-managed mode
	registrar  *registration.Registrar // nil without --register
	srv        *server.Server
}

// Run serves until ctx is cancelled and returns nil after a clean drain.
// Errors wrapping ErrUsage are about opts themselves.
func Run(ctx context.Context, opts Options, log *slog.Logger) error {
	// client-go (informers) logs through klog: keep one
	// log stream in one format.
	klog.SetSlogLogger(log)
	d := &daemon{opts: opts, log: log}
	for _, step := range []func(context.Context) error{
		d.validate, d.connect, d.loadPolicies, d.newMetrics, d.newSource, d.newRegistrar, d.newRotator, d.newServer,
	} {
		if err := step(ctx); err != nil {
			return err
		}
	}
	return d.serve(ctx)
}

// validate checks what needs no cluster, before anything starts.
func (d *daemon) validate(context.Context) error {
	o := d.opts
	switch o.TLSMode {
	case TLSSelfManaged, TLSFiles, TLSSelfSigned:
	default:
		return usage("--tls %q: must be %s, %s or %s", o.TLSMode, TLSSelfManaged, TLSFiles, TLSSelfSigned)
	}
	if o.TLSMode == TLSFiles && o.CertDir == "" {
		return usage("--tls=files needs --cert-dir")
	}
	if o.TLSMode == TLSFiles && o.Register && o.CABundleFile == "" {
		return usage("--register with --tls=files needs --ca-bundle-file")
	}
	if o.PolicyConfigMap != "" {
		if _, _, err := policyConfigMapName(o); err != nil {
			return err
		}
	}
	d.names = certs.Names{WebhookURL: o.WebhookURL, Service: o.ServiceName, Namespace: o.Namespace, ClusterDomain: o.ClusterDomain, Extra: o.SANs}
	if o.Register || o.TLSMode == TLSSelfManaged {
		name, err := d.names.ServerName()
		if err != nil {
			return usage("--webhook-url or --service-name and --namespace: %v", err)
		}
		d.serverName = name
	}
	return nil
}

// connect prepares the one kubeconfig load (deferred: a dev run without
// --register or cluster-reading policies never needs one) and the client
// when a part surely needs it.
func (d *daemon) connect(context.Context) error {
	d.kube = sync.OnceValues(func() (*rest.Config, error) {
		rc, err := kubeconfig.Load(d.opts.Kubeconfig, d.opts.KubeContext, "kadmit")
		if err == nil && rc.QPS == 0 {
			// client-go's 5 QPS / burst 10 would queue a caBundle repair
			// behind a few earlier writes; controller-runtime's defaults
			// (pkg/client/config, QPS 20, Burst 30) keep it immediate.
			rc.QPS, rc.Burst = 20, 30
		}
		return rc, err
	})
	if !d.opts.Register && d.opts.TLSMode != TLSSelfManaged && d.opts.ConfigMap == "" && d.opts.PolicyConfigMap == "" {
		return nil
	}
	rc, err := d.kube()
	if err != nil {
		return err
	}
	if d.client, err = kubernetes.NewForConfig(rc); err != nil {
		return fmt.Errorf("build client: %w", err)
	}
	return nil
}

// loadPolicies reads the configuration and builds its hooks.
func (d *daemon) loadPolicies(ctx context.Context) error {
	cfg, err := loadConfig(ctx, d.client, d.opts)
	if err != nil {
		return err
	}
	d.reloads = &reloader{ctx: ctx, opts: d.opts, log: d.log, cfg: cfg, wantCfg: cfg, kube: d.kube}
	var docsErr error
	if d.opts.PolicyConfigMap != "" {
		// A ConfigMap that cannot be read is a declared set that does not
		// load: serve starts with the built-in policies (reloader.start).
		if d.reloads.wantDocs, docsErr = loadPolicyConfigMap(ctx, d.client, d.opts); docsErr == nil {
			d.reloads.haveDocs = true
		}
	}
	d.hooks, err = d.reloads.start(ctx, docsErr)
	return err
}

func (d *daemon) newMetrics(context.Context) error {
	d.promReg = prometheus.NewRegistry()
	d.promReg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if err := registerAll(d.promReg, d.opts.Collectors); err != nil {
		return err
	}
	var err error
	if d.certs, err = metrics.NewCertificates(d.promReg); err != nil {
		return err
	}
	if d.regMetrics, err = metrics.NewRegistration(d.promReg); err != nil {
		return err
	}
	if d.reloads.metrics, err = metrics.NewConfigReloads(d.promReg); err != nil {
		return err
	}
	if d.reloads.declaredMetric, err = metrics.NewDeclaredPolicies(d.promReg); err != nil {
		return err
	}
	d.reloads.declaredMetric.Served(d.reloads.declaredReady() == nil)
	if d.reloads.declared() {
		b := d.reloads.decodeBudget()
		err = metrics.NewDecodeBudget(d.promReg, metrics.DecodeBudgetSource{Used: b.Used, Refused: b.Refused, Max: b.Max()})
	}
	return err
}

// newRegistrar builds the registrar: with --register it writes and repairs
// the configurations; a self-managed replica without --register still
// watches them, read-only, so it reports unready when whoever registers them
// does not trust its certificate (a replica behind the same Service with a
// Secret of its own). A configuration set that cannot be registered (no URL
// or Service, a bad name) is a usage error.
func (d *daemon) newRegistrar(ctx context.Context) error {
	if !d.opts.Register && d.opts.TLSMode != TLSSelfManaged {
		return nil
	}
	ro := registration.RegistrarOptions{
		Client: d.client, Registration: d.registrationOptions(), Hooks: d.hooks,
		ServerName: d.serverName, Holder: d.source.Holder(), Bundle: d.bundle,
		Listening: func() error { return d.srv.Serving() }, Probe: d.probe(), Logger: d.log,
		Observer: d.regMetrics,
	}
	if d.opts.Register {
		// Only a writer can be in a fight over caBundle: its Warning
		// Events go through client-go's recorder to namespace default
		// (the configurations are cluster-scoped), as kadmit watch's do.
		ro.Recorder = eventRecorder(ctx, d.client)
	}
	reg, err := registration.NewRegistrar(ro)
	if err != nil {
		return usage("--register: %v", err)
	}
	d.registrar = reg
	if !d.opts.Register {
		return nil
	}
	d.reloads.register = reg.SetHooks
	return nil
}

// bundle is the registrar's Bundle: the source's caBundle, with the
// generation of the certificate Secret it comes from in self-managed mode
// (so a replica whose Secret lags never reverts a newer one).
func (d *daemon) bundle() ([]byte, int64) {
	if d.rotator != nil {
		return d.rotator.bundle()
	}
	return d.source.CABundle(), 0
}

func (d *daemon) registrationOptions() registration.Options {
	o := registration.Options{Name: d.opts.WebhookConfigName, URL: d.opts.WebhookURL, ServicePort: d.opts.ServicePort}
	if o.URL == "" {
		o.ServiceNamespace, o.ServiceName = d.opts.Namespace, d.opts.ServiceName
	}
	if d.opts.Namespace != "" {
		o.ExcludeNamespaces = []string{d.opts.Namespace}
	}
	return o
}

// probe handshakes with the Service's ready endpoints; nil in URL mode,
// where the API server calls this process directly.
func (d *daemon) probe() func(context.Context) ([]*x509.Certificate, error) {
	if d.opts.WebhookURL != "" {
		return nil
	}
	return registration.EndpointProber{Client: d.client, Namespace: d.opts.Namespace, Service: d.opts.ServiceName,
		Port: d.opts.ServicePort, ServerName: d.serverName}.Probe
}

// ready is the one readiness condition /readyz answers: the listener
// serves (server.Ready checks that first), the certificate source is synced
// with a fresh certificate, and the API server would trust it: against the
// registered caBundles whenever the registrar watches them, else against
// the source's own bundle (files and self-signed without --register). Policies' cluster caches need no condition: the hooks that read
// them are served only after StartCluster waited for their sync.
func (d *daemon) ready() readiness.Gate {
	trust := func() error {
		b := d.source.CABundle()
		if len(b) == 0 || d.serverName == "" {
			return nil
		}
		return certs.VerifyServed(d.source.Holder(), "the certificate source", b, d.serverName, time.Now())
	}
	if d.registrar != nil {
		trust = d.registrar.Ready
	}
	contested := func() error { return nil }
	if d.registrar != nil && d.opts.Register {
		contested = d.registrar.Contested
	}
	return readiness.Gate{
		{Name: "certificate", Check: d.source.Ready},
		{Name: "caBundle", Check: trust},
		// Degraded, not unready: a fight over caBundle with a GitOps
		// controller is not this replica's to win, and every replica is in
		// it alike, so taking them out of the Service's endpoints would
		// fail every call the API server can still make (the other side's
		// bundle may verify too). Whether the API server trusts the
		// certificate right now stays the caBundle condition's answer,
		// which names the fight when it fails.
		{Name: "caBundleContested", Check: contested, Degraded: true},
		// Degraded, not unready: a replica serving the built-in policies
		// must stay in the Service's endpoints (docs/policies-cel.md).
		{Name: "declaredPolicies", Check: d.reloads.declaredReady, Degraded: true},
	}
}

func (d *daemon) newServer(context.Context) error {
	webhooks, err := admission.NewWebhooks(d.hooks)
	if err != nil {
		return err
	}
	var metricsAuth *rest.Config
	if d.opts.MetricsSecure {
		if metricsAuth, err = d.kube(); err != nil {
			return fmt.Errorf("--metrics-secure authenticates scrapers through the API server: %w", err)
		}
	}
	o := d.opts
	// A path the registered configurations still call but no hook serves
	// (a policy just turned off) is answered "allowed", not 404.
	var unserved func(string) bool
	if d.registrar != nil {
		unserved = d.registrar.Calls
	}
	gate := d.ready()
	d.srv, err = server.New(server.Options{
		Addr: o.Addr, MetricsAddr: o.MetricsAddr, Webhooks: webhooks, Certs: d.source.Holder(),
		Logger: d.log, ShutdownGrace: o.ShutdownGrace, Drain: o.ShutdownDrain, MaxRequestBytes: o.MaxRequestBytes,
		Registry: d.promReg, Ready: gate.Check, Degraded: gate.Degraded, Pprof: o.Pprof,
		MetricsAuth: metricsAuth, ReadTimeout: o.ReadTimeout, MaxConnections: o.MaxConnections,
		MaxInFlight: o.MaxInFlight, MaxBodyBytesInFlight: o.MaxBodyBytesInFlight, HTTP2: o.HTTP2,
		ClientCAFile: o.ClientCAFile, ClientAllowedNames: o.ClientAllowedNames, Unserved: unserved,
		MetricsMaxConnections: o.MetricsMaxConnections, MaxAbandonedReviews: o.MaxAbandonedReviews, DecisionLog: o.DecisionLog,
		Tracing: o.Tracing,
	})
	d.reloads.serve = d.srv.SetWebhooks
	// The server and the registrar hold the start's hooks now, and a
	// reload replaces them there: kept here too, they would keep the
	// start's declared policy engine alive for the life of the process.
	d.hooks = nil
	return err
}

// serve binds the listeners, starts the certificate source, the registrar
// and the configuration watch, and serves until ctx ends.
func (d *daemon) serve(ctx context.Context) error {
	if err := d.srv.Listen(); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- d.srv.Serve(ctx) }()
	if err := d.start(ctx); err != nil {
		cancel()
		return errors.Join(err, <-done)
	}
	return <-done
}

func (d *daemon) start(ctx context.Context) error {
	if d.registrar != nil {
		if err := d.registrar.Start(ctx); err != nil {
			return err
		}
	}
	if err := d.source.Start(ctx); err != nil {
		return err
	}
	d.log.Info("serving certificate source started", "tls", d.opts.TLSMode, "sans", d.source.SANs(), "serverName", d.serverName)
	if d.opts.Register {
		// Every replica keeps the configurations written; in self-managed
		// mode with the bundle of its Secret, whose generation keeps a
		// replica that lags from reverting a newer one.
		if err := waitServing(ctx, d.srv, 10*time.Second); err != nil {
			return err
		}
		go d.registrar.Run(ctx)
	}
	if len(d.opts.PolicyPaths) > 0 {
		go celpolicy.Watch(ctx, d.opts.PolicyPaths, 0, d.reloads.rebuild)
	}
	if d.opts.PolicyConfigMap != "" {
		ns, name, _ := policyConfigMapName(d.opts)
		if err := celpolicy.WatchConfigMap(ctx, d.client, ns, name, d.reloads.policyConfigMap); err != nil {
			return err
		}
	}
	if d.opts.ConfigMap != "" {
		ns, name, _ := strings.Cut(d.opts.ConfigMap, "/")
		return builtin.Config.WatchConfigMap(ctx, d.client, ns, name, configKey(d.opts), d.reloads.reload, d.reloads.invalid)
	}
	return nil
}

// waitServing waits until the HTTPS listener accepts connections, so the
// first registration is not held back for a retry interval.
func waitServing(ctx context.Context, srv *server.Server, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		err := srv.Serving()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("HTTPS listener not serving after %s: %w", timeout, err)
		case <-tick.C:
		}
	}
}

func registerAll(reg prometheus.Registerer, cs []prometheus.Collector) error {
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("register metrics: %w", err)
		}
	}
	return nil
}

// eventRecorder is a core/v1 Event recorder writing through cs until ctx
// ends; its source is component kadmit on this host (the pod's name in a
// cluster).
func eventRecorder(ctx context.Context, cs kubernetes.Interface) record.EventRecorder {
	b := record.NewBroadcaster(record.WithContext(ctx))
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cs.CoreV1().Events("")})
	host, _ := os.Hostname()
	return b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "kadmit", Host: host})
}
