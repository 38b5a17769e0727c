package main

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"time"

	"github.com/kadmit/kadmit/internal/cmdexit"
	"github.com/kadmit/kadmit/pkg/webhookcerts"

	"github.com/spf13/cobra"

	"fmt"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/celpolicy"
	"github.com/kadmit/kadmit/internal/gcpace"
	"github.com/kadmit/kadmit/internal/logging"
	"github.com/kadmit/kadmit/internal/registration"
	"github.com/kadmit/kadmit/internal/serve"
	"github.com/kadmit/kadmit/internal/server"
	"github.com/kadmit/kadmit/internal/tracing"
	"k8s.io/apimachinery/pkg/api/resource"
)

func newServeCmd() *cobra.Command {
	var o serve.Options
	decisionLog := server.DefaultDecisionLog()
	o.DecisionLog = &decisionLog
	var logFormat, logLevel, gcHeapFloor string
	var traceOpts tracing.Options
	var selfSignedFlag bool
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve the admission webhooks over HTTPS",
		Long: `Serve AdmissionReview v1 and v1beta1 over HTTPS on one path per webhook
(/validate-pod, /mutate-pod, /mutate-node-status, /validate-node), with
/healthz, /readyz and /metrics on a separate port: plain HTTP on 127.0.0.1
by default, HTTPS with token-authorized /metrics with --metrics-secure. With
--pprof (debugging only, off by default) that port also serves /debug/pprof/.
Both listeners bound their open connections (--max-connections,
--metrics-max-connections), handshakes, headers, reads, writes and idle
time; admission requests, body bytes and reviews running past their
deadline are bounded too (docs/security.md, "Bounds").

With --register, kadmit writes its own MutatingWebhookConfiguration and
ValidatingWebhookConfiguration (named by --webhook-config-name, one name per
install) once it is ready to answer, and repairs them whenever they change,
whatever the --tls mode.

With --tracing-endpoint HOST:PORT (off by default), each review is recorded as
an OpenTelemetry span "kadmit.review" and exported over OTLP/gRPC: a child of
the API server's webhook call when the API server sends a W3C traceparent
(its APIServerTracing, GA in Kubernetes 1.34). With --tracing-sampling-ratio 0
(the default) kadmit records exactly the calls the API server sampled, and
nothing for requests without a sampled traceparent. A loopback endpoint is
dialled in plaintext, any other with TLS (system roots, or --tracing-ca-file).
Spans carry the webhook path, operation, kind, allowed, patched and the HTTP
status, never the object's name or the user (docs/performance.md, "Exact
per-call latency from the API server's traces").`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if decisionLog.AllowedBurst < 0 || decisionLog.AllowedSample < 0 || decisionLog.SlowReview < 0 {
				return cmdexit.New(2, errors.New("--log-allowed-burst, --log-allowed-sample and --log-slow-review may not be negative"))
			}
			// Decision lines (denials, errors, slow and sampled allowed
			// ones; every one at debug) are buffered: written out at least
			// every 100 ms and flushed once the server has drained.
			log, logw, err := logging.NewBufferedLogger(os.Stderr, logFormat, logLevel)
			if err != nil {
				return cmdexit.New(2, err)
			}
			defer logw.Close(logging.DefaultCloseTimeout)
			o.Collectors = append(o.Collectors, logw.Collector())
			if !cmd.Flags().Changed("tls") {
				switch {
				case selfSignedFlag:
					o.TLSMode = serve.TLSSelfSigned
				case o.CertDir != "":
					o.TLSMode = serve.TLSFiles
				}
			}
			if traceOpts.Endpoint != "" {
				traceOpts.Logger = log
				tr, err := tracing.New(cmd.Context(), traceOpts)
				if err != nil {
					return cmdexit.New(2, err)
				}
				o.Tracing = tr
				// Flushed after the server has drained, so the last
				// reviews' spans are exported too.
				defer func() {
					ctx, cancel := context.WithTimeout(context.WithoutCancel(cmd.Context()), tracing.ShutdownTimeout)
					defer cancel()
					if err := tr.Shutdown(ctx); err != nil {
						log.Warn(err.Error())
					}
				}()
			} else if cmd.Flags().Changed("tracing-ca-file") || cmd.Flags().Changed("tracing-sampling-ratio") {
				return cmdexit.New(2, errors.New("--tracing-ca-file and --tracing-sampling-ratio need --tracing-endpoint"))
			}
			floor, err := resource.ParseQuantity(gcHeapFloor)
			if err != nil || floor.Sign() < 0 {
				return cmdexit.New(2, fmt.Errorf("--gc-heap-floor %q: want a non-negative quantity such as 64Mi or 0", gcHeapFloor))
			}
			if p := gcpace.Start(floor.Value()); p != nil {
				defer p.Stop()
				log.Debug("garbage collector heap floor set", "floorBytes", p.Floor())
			}
			if err := serve.Run(cmd.Context(), o, log); err != nil {
				if errors.Is(err, serve.ErrUsage) {
					return cmdexit.New(2, err)
				}
				return cmdexit.New(1, err)
			}
			log.Info("stopped")
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.ConfigFile, "config", "", "configuration file (YAML); default: the seed profile with every built-in policy")
	f.StringVar(&o.ConfigMap, "config-map", "", "NAMESPACE/NAME of a ConfigMap holding the configuration, followed live (exclusive with --config)")
	f.StringVar(&o.ConfigKey, "config-key", "config.yaml", "data key of --config-map")
	f.StringArrayVar(&o.PolicyPaths, "policies", nil, "ValidatingAdmissionPolicy / MutatingAdmissionPolicy files or directories (with bindings and params) to serve next to the built-in policies, on /validate-policies and /mutate-policies; repeatable")
	f.BoolVar(&o.PolicyAllowSensitiveGroups, "policies-allow-sensitive-groups", false, "let declared policies (--policies, --policies-configmap) match resources of the rbac.authorization.k8s.io, admissionregistration.k8s.io, certificates.k8s.io, authentication.k8s.io and authorization.k8s.io groups, refused by default: whoever may write the policies can then grant themselves cluster-admin (docs/security.md)")
	f.StringVar(&o.PolicyConfigMap, "policies-configmap", "", "NAMESPACE/NAME of a ConfigMap whose data keys hold more declared policies (with bindings and params), served with --policies and followed live: an invalid edit is refused, keeping the running policies, and writes that do not compile are denied by the kadmit-policies webhook; a set that does not load at start leaves the built-in policies served and /readyz reporting declaredPolicies degraded")
	f.StringVar(&o.Addr, "addr", ":9443", "HTTPS admission listen address")
	f.StringVar(&o.MetricsAddr, "metrics-addr", "", `address for /metrics, /healthz and /readyz ("0" disables); default 127.0.0.1:8080, or :8443 with --metrics-secure`)
	f.StringVar(&gcHeapFloor, "gc-heap-floor", resource.NewQuantity(gcpace.DefaultFloor, resource.BinarySI).String(), "keep the garbage collector's heap goal at least this large (a quantity: 64Mi; 0 disables): a small live heap otherwise means a collection every few MiB allocated, tens per second under load, and CPU per review that grows with cores. Never above half of GOMEMLIMIT, which still bounds the heap; ignored with GOGC=off (docs/performance.md)")
	f.BoolVar(&o.Pprof, "pprof", false, "serve net/http/pprof under /debug/pprof/ on the --metrics-addr listener, for debugging (heap and CPU profiles); keep that address private")
	// Hardening (docs/security.md).
	f.BoolVar(&o.MetricsSecure, "metrics-secure", false, "serve --metrics-addr over HTTPS; /metrics and /debug/pprof/ need a token the API server authenticates and authorizes (get on the URL); /healthz and /readyz stay open")
	f.StringVar(&o.ClientCAFile, "client-ca-file", "", "require admission clients (the API server) to present a certificate signed by a CA in this PEM file (mutual TLS; re-read on change)")
	f.StringSliceVar(&o.ClientAllowedNames, "client-allowed-names", nil, "with --client-ca-file: accept only client certificates whose subject CN or a DNS SAN is one of these")
	f.DurationVar(&o.ReadTimeout, "read-timeout", server.DefaultReadTimeout, "bound on reading one admission request, headers and body (the API server's largest webhook timeoutSeconds is 30)")
	f.IntVar(&o.MaxConnections, "max-connections", server.DefaultMaxConnections, "open admission connections; more are closed at accept")
	f.IntVar(&o.MetricsMaxConnections, "metrics-max-connections", server.DefaultMetricsMaxConnections, "open --metrics-addr connections; beyond it an idle connection of the address holding the most is closed (so probes from another address get in), else the new one")
	f.IntVar(&o.MaxInFlight, "max-in-flight", admission.DefaultMaxInFlight, "admission requests in flight, reviews running past their deadline beyond --max-abandoned-reviews included; more get HTTP 503")
	f.IntVar(&o.MaxAbandonedReviews, "max-abandoned-reviews", admission.DefaultMaxAbandoned, "reviews still running past their deadline (answered 500) that give back their in-flight slot and body bytes at once; beyond it (or a quarter of --max-body-bytes-in-flight) they keep both until their policy returns")
	f.Int64Var(&o.MaxBodyBytesInFlight, "max-body-bytes-in-flight", admission.DefaultMaxBodyBytesInFlight, "request-body buffer bytes held by all requests at once; more get HTTP 503")
	f.IntVar(&o.PolicyMaxObjectBytes, "policy-max-object-bytes", celpolicy.DefaultMaxObjectBytes, "largest object or oldObject (JSON bytes) declared policies are evaluated on; larger: HTTP 413, the policy's failurePolicy decides (1.5 MiB is etcd's request limit; negative: no bound)")
	f.Int64Var(&o.PolicyDecodeBytesInFlight, "policy-decode-bytes-in-flight", celpolicy.DefaultDecodeBudgetBytes, "estimated memory of the objects declared policies hold decoded at once, all requests together; more get HTTP 503")
	f.BoolVar(&o.HTTP2, "http2", false, "offer HTTP/2 on the admission listener (HTTP/1.1 only by default; see docs/security.md)")
	f.DurationVar(&o.ShutdownGrace, "shutdown-grace", 30*time.Second, "how long in-flight requests may take to finish after SIGTERM")
	f.DurationVar(&o.ShutdownDrain, "shutdown-drain", 0, "after SIGTERM, keep accepting and answering this long (each answer closing its connection, /readyz failing) while the endpoint leaves the Service; counts against --shutdown-grace. The chart sets 12s: two failed readiness probes 5s apart, then kube-proxy's sync")
	f.Int64Var(&o.MaxRequestBytes, "max-request-bytes", admission.DefaultMaxRequestBytes, "largest AdmissionReview body accepted (larger: HTTP 413)")
	f.StringVar(&o.TLSMode, "tls", serve.TLSSelfManaged, "certificate source: self-managed (a Secret kadmit rotates), files (--cert-dir, reloaded on change) or self-signed (in memory, development)")
	f.StringVar(&o.CertDir, "cert-dir", "", "directory with tls.crt and tls.key (--tls=files)")
	f.BoolVar(&selfSignedFlag, "self-signed", false, "shorthand for --tls=self-signed")
	f.StringSliceVar(&o.SANs, "dns-name", nil, "extra SAN (DNS name or IP) of the serving certificate; repeatable")
	f.StringVar(&o.CAFile, "ca-file", "", "write the self-signed CA (PEM) to this file (--tls=self-signed)")
	f.StringVar(&o.Namespace, "namespace", envOr("POD_NAMESPACE", "kadmit-system"), "kadmit's namespace: its Secret and Service; never intercepted")
	f.StringVar(&o.SecretName, "secret-name", "kadmit-tls", "Secret holding the CA and serving certificate (--tls=self-managed)")
	f.StringVar(&o.ServiceName, "service-name", "kadmit", "kadmit's Service, called by the API server as <svc>.<ns>.svc")
	f.Int32Var(&o.ServicePort, "service-port", 443, "port of kadmit's Service")
	f.StringVar(&o.ClusterDomain, "cluster-domain", "cluster.local", "cluster DNS domain for the <svc>.<ns>.svc.<domain> SAN")
	f.StringVar(&o.KeyType, "key-type", string(webhookcerts.ECDSAP256), "key type: ecdsa-p256, ecdsa-p384, rsa-2048, rsa-3072 or rsa-4096")
	f.DurationVar(&o.ServingValidity, "serving-validity", 90*24*time.Hour, "serving certificate lifetime; renewed at 2/3 of it")
	f.DurationVar(&o.CAValidity, "ca-validity", 5*365*24*time.Hour, "CA lifetime; rotated at 2/3 of it without an unknown-authority window")
	f.BoolVar(&o.Register, "register", false, "write kadmit's webhook configurations once a replica is ready, and repair them when changed")
	f.StringVar(&o.WebhookConfigName, "webhook-config-name", registration.DefaultName, "name of the MutatingWebhookConfiguration and ValidatingWebhookConfiguration --register writes and readiness checks; one per install (the Helm chart uses the release's full name)")
	f.StringVar(&o.WebhookURL, "webhook-url", "", "base URL the API server calls (dev mode), e.g. https://127.0.0.1:9443; default: the Service")
	f.StringVar(&o.CABundleFile, "ca-bundle-file", "", "CA bundle (PEM) to register as caBundle with --tls=files, followed on change like --cert-dir")
	f.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig (default: $KUBECONFIG, ~/.kube/config, then in-cluster)")
	f.StringVar(&o.KubeContext, "context", "", "kubeconfig context")
	f.StringVar(&logFormat, "log-format", "json", "log format: json or text")
	f.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn or error; debug logs every admission decision, unsampled")
	// Which allowed decisions are logged (denials, errors and panics
	// always are): docs/install.md, "Logs".
	f.IntVar(&decisionLog.AllowedBurst, "log-allowed-burst", server.DefaultLogAllowedBurst, "allowed admission decisions logged in full per webhook each second before sampling starts")
	f.IntVar(&decisionLog.AllowedSample, "log-allowed-sample", server.DefaultLogAllowedSample, `past the burst, log 1 in N allowed decisions per webhook, marked sampled="1/N"; 1 logs every one, 0 none`)
	f.DurationVar(&decisionLog.SlowReview, "log-slow-review", server.DefaultLogSlowReview, "always log an allowed decision that took longer than this (reading the request to writing the answer); 0 turns it off")
	f.StringVar(&traceOpts.Endpoint, "tracing-endpoint", "", "OTLP/gRPC collector HOST:PORT to export a span per review to (off when empty); plaintext to a loopback host, TLS otherwise")
	f.StringVar(&traceOpts.CAFile, "tracing-ca-file", "", "with --tracing-endpoint: PEM CA file verifying the collector's certificate (TLS even to loopback); default: system roots for a non-loopback host")
	f.Float64Var(&traceOpts.SamplingRatio, "tracing-sampling-ratio", 0, "with --tracing-endpoint: share 0..1 of reviews traced that arrive without a traceparent; a sampled traceparent is always followed, an unsampled one never (0: record only what the API server samples)")
	return cmd
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// newLogger builds the logger every command writes to stderr; field caps
// and escaping live in internal/logging.
func newLogger(format, level string) (*slog.Logger, error) {
	return logging.New(os.Stderr, format, level)
}
