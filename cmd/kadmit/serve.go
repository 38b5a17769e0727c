package main

import (
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/daemon"
)

func newServeCmd() *cobra.Command {
	var o daemon.Options
	var logFormat, logLevel string
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve the admission webhooks over HTTPS",
		Long: `Serve AdmissionReview v1 and v1beta1 over HTTPS on one path per webhook
(/validate-pod, /mutate-pod, /mutate-node-status, /validate-node), with
/healthz, /readyz and /metrics on a separate plain-HTTP port.

With --register, kadmit writes its own MutatingWebhookConfiguration and
ValidatingWebhookConfiguration (named kadmit) once it is ready to answer.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := newLogger(logFormat, logLevel)
			if err != nil {
				return &exitError{2, err}
			}
			if err := daemon.Run(cmd.Context(), o, log); err != nil {
				return &exitError{1, err}
			}
			log.Info("stopped")
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.ConfigFile, "config", "", "configuration file (YAML); default: the seed profile with every built-in policy")
	f.StringVar(&o.Addr, "addr", ":9443", "HTTPS admission listen address")
	f.StringVar(&o.MetricsAddr, "metrics-addr", ":8080", `plain-HTTP address for /metrics, /healthz and /readyz ("0" disables)`)
	f.DurationVar(&o.ShutdownGrace, "shutdown-grace", 30*time.Second, "how long in-flight requests may take to finish after SIGTERM")
	f.Int64Var(&o.MaxRequestBytes, "max-request-bytes", admission.DefaultMaxRequestBytes, "largest AdmissionReview body accepted (larger: HTTP 413)")
	f.StringVar(&o.CertDir, "cert-dir", "", "directory with tls.crt and tls.key")
	f.BoolVar(&o.SelfSigned, "self-signed", false, "issue an in-memory CA and serving certificate for --dns-name")
	f.StringSliceVar(&o.SANs, "dns-name", nil, "SAN (DNS name or IP) of the self-signed serving certificate; repeatable")
	f.StringVar(&o.CAFile, "ca-file", "", "write the self-signed CA (PEM) to this file")
	f.BoolVar(&o.Register, "register", false, "write kadmit's webhook configurations once ready")
	f.StringVar(&o.WebhookURL, "webhook-url", "", "base URL the API server calls (dev mode), e.g. https://127.0.0.1:9443")
	f.StringVar(&o.ServiceNamespace, "service-namespace", "", "namespace of kadmit's Service (in-cluster registration)")
	f.StringVar(&o.ServiceName, "service-name", "", "name of kadmit's Service (in-cluster registration)")
	f.Int32Var(&o.ServicePort, "service-port", 443, "port of kadmit's Service")
	f.StringVar(&o.CABundleFile, "ca-bundle-file", "", "CA (PEM) to register as caBundle when serving --cert-dir")
	f.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig for --register (default: in-cluster or $KUBECONFIG)")
	f.StringVar(&o.KubeContext, "context", "", "kubeconfig context")
	f.StringVar(&logFormat, "log-format", "json", "log format: json or text")
	f.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn or error")
	return cmd
}

func newLogger(format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: %w", level, err)
	}
	ho := &slog.HandlerOptions{Level: lv}
	switch strings.ToLower(format) {
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, ho)), nil
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, ho)), nil
	default:
		return nil, fmt.Errorf("--log-format %q: must be json or text", format)
	}
}
