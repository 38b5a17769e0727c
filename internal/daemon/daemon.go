// Package daemon assembles the `kadmit serve` process: configuration,
// serving certificate, HTTPS server and, when asked, self-registration.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kadmit/kadmit/internal/certs"
	"github.com/kadmit/kadmit/internal/config"
	"github.com/kadmit/kadmit/internal/policy/builtin"
	"github.com/kadmit/kadmit/internal/registration"
	"github.com/kadmit/kadmit/internal/server"
)

// Options are `kadmit serve`'s settings.
type Options struct {
	ConfigFile      string // empty: the seed profile
	Addr            string
	MetricsAddr     string
	ShutdownGrace   time.Duration
	MaxRequestBytes int64

	// TLS: exactly one of CertDir and SelfSigned.
	CertDir    string
	SelfSigned bool
	// SANs for --self-signed: DNS names and IP literals.
	SANs []string
	// CAFile receives the self-signed CA (PEM) for the caller; optional.
	CAFile string

	// Register writes kadmit's webhook configurations once the server is ready.
	Register bool
	// WebhookURL is the base URL the API server calls in dev mode.
	WebhookURL string
	// Service the API server calls when WebhookURL is empty.
	ServiceNamespace, ServiceName string
	ServicePort                   int32
	// CABundleFile is the CA to register with --cert-dir; the self-signed CA
	// otherwise.
	CABundleFile string
	Kubeconfig   string
	KubeContext  string
}

// ErrUsage is wrapped by errors in Options themselves (exit code 2).
var ErrUsage = errors.New("usage")

// Run serves until ctx is cancelled and returns nil after a clean drain.
func Run(ctx context.Context, opts Options, log *slog.Logger) error {
	cfg := config.Default()
	if opts.ConfigFile != "" {
		var err error
		if cfg, err = config.LoadFile(opts.ConfigFile); err != nil {
			return err
		}
	}
	hooks, err := builtin.Hooks(cfg)
	if err != nil {
		return err
	}
	webhooks, err := builtin.Webhooks(cfg)
	if err != nil {
		return err
	}

	holder := &certs.Holder{}
	var caBundle []byte
	switch {
	case opts.SelfSigned && opts.CertDir != "":
		return fmt.Errorf("%w: --self-signed and --cert-dir are exclusive", ErrUsage)
	case opts.SelfSigned:
		b, err := selfSigned(opts.SANs)
		if err != nil {
			return err
		}
		c, err := b.TLSCertificate()
		if err != nil {
			return err
		}
		holder.Set(c)
		caBundle = b.CACert
		if opts.CAFile != "" {
			if err := os.WriteFile(opts.CAFile, b.CACert, 0o644); err != nil {
				return fmt.Errorf("write CA to %s: %w", opts.CAFile, err)
			}
		}
		log.Info("issued self-signed serving certificate", "sans", opts.SANs, "notAfter", c.Leaf.NotAfter, "caFile", opts.CAFile)
	case opts.CertDir != "":
		c, err := certs.LoadDir(opts.CertDir)
		if err != nil {
			return err
		}
		holder.Set(c)
		log.Info("loaded serving certificate", "dir", opts.CertDir, "sans", c.Leaf.DNSNames, "notAfter", c.Leaf.NotAfter)
	default:
		return fmt.Errorf("%w: choose --self-signed or --cert-dir", ErrUsage)
	}
	if opts.CABundleFile != "" {
		if caBundle, err = os.ReadFile(opts.CABundleFile); err != nil {
			return fmt.Errorf("read CA bundle: %w", err)
		}
	}

	var cs kubernetes.Interface
	var regOpts registration.Options
	if opts.Register {
		if len(caBundle) == 0 {
			return fmt.Errorf("%w: --register with --cert-dir needs --ca-bundle-file", ErrUsage)
		}
		if cs, err = clientset(opts.Kubeconfig, opts.KubeContext); err != nil {
			return err
		}
		regOpts = registration.Options{
			URL: opts.WebhookURL, ServiceNamespace: opts.ServiceNamespace, ServiceName: opts.ServiceName,
			ServicePort: opts.ServicePort, CABundle: caBundle,
		}
		if opts.ServiceNamespace != "" {
			regOpts.ExcludeNamespaces = []string{opts.ServiceNamespace}
		}
		if _, _, err := registration.Build(hooks, regOpts); err != nil {
			return fmt.Errorf("%w: %w", ErrUsage, err)
		}
	}

	srv, err := server.New(server.Options{
		Addr: opts.Addr, MetricsAddr: opts.MetricsAddr, Webhooks: webhooks, Certs: holder, Logger: log,
		ShutdownGrace: opts.ShutdownGrace, MaxRequestBytes: opts.MaxRequestBytes,
	})
	if err != nil {
		return err
	}
	if err := srv.Listen(); err != nil {
		return err
	}
	serveCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- srv.Serve(serveCtx) }()

	if opts.Register {
		// Registering before the server answers would send the API server's
		// first calls into a closed port: with failurePolicy Fail that is an
		// outage. Wait until ready, then write the configurations.
		if err := waitReady(ctx, srv, 30*time.Second); err != nil {
			cancel()
			return errors.Join(err, <-done)
		}
		mwc, vwc, _ := registration.Build(hooks, regOpts)
		if err := registration.Apply(ctx, cs, mwc, vwc); err != nil {
			cancel()
			return errors.Join(err, <-done)
		}
		log.Info("registered webhook configurations", "name", "kadmit", "url", opts.WebhookURL, "service", opts.ServiceName)
	}
	return <-done
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

func selfSigned(sans []string) (*certs.Bundle, error) {
	var opts certs.SelfSignedOptions
	for _, s := range sans {
		if ip := net.ParseIP(s); ip != nil {
			opts.IPs = append(opts.IPs, ip)
		} else {
			opts.DNSNames = append(opts.DNSNames, s)
		}
	}
	if len(sans) == 0 {
		return nil, fmt.Errorf("%w: --self-signed needs at least one --dns-name", ErrUsage)
	}
	return certs.NewSelfSigned(opts)
}

func clientset(kubeconfig, kubeContext string) (kubernetes.Interface, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if kubeconfig != "" {
		rules.ExplicitPath = kubeconfig
	}
	rc, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: kubeContext}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig: %w", err)
	}
	rc.UserAgent = "kadmit"
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("build client: %w", err)
	}
	return cs, nil
}
