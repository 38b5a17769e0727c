package main

import (
	"errors"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/kadmit/kadmit/internal/cmdexit"
	"github.com/kadmit/kadmit/internal/kubeconfig"
	"github.com/kadmit/kadmit/internal/watch"
)

// podNamespaceFile is where the kubelet mounts the pod's namespace.
const podNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

func newWatchCmd() *cobra.Command {
	var o watch.Options
	var kubeconfigPath, kubeContext, metricsAddr, logFormat, logLevel string
	cmd := &cobra.Command{
		Use:   "watch",
		Short: "Keep doctor's checks current for every webhook in the cluster (in-cluster controller)",
		Long: `Watch every MutatingWebhookConfiguration and ValidatingWebhookConfiguration
with informers and a periodic TLS handshake to every ready endpoint, and report
doctor's findings as Prometheus metrics (kadmit_watch_*) and Kubernetes Events
(Warning, reason = check ID; Normal <ID>Resolved when it clears) on the
configuration. One replica, elected on a Lease, reports; all serve /healthz,
/readyz and /metrics on --metrics-addr. The RBAC it needs is read-only plus
Events (docs/troubleshooting.md).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := newLogger(logFormat, logLevel)
			if err != nil {
				return cmdexit.New(2, err)
			}
			rc, err := kubeconfig.Load(kubeconfigPath, kubeContext, "kadmit-watch")
			if err != nil {
				return cmdexit.New(2, err)
			}
			if o.Client, err = kubernetes.NewForConfig(rc); err != nil {
				return cmdexit.New(2, err)
			}
			if o.Dynamic, err = dynamic.NewForConfig(rc); err != nil {
				return cmdexit.New(2, err)
			}
			if o.Identity == "" {
				o.Identity, _ = os.Hostname()
			}
			o.Log = log
			c, err := watch.New(o, nil)
			if err != nil {
				if errors.Is(err, watch.ErrUsage) {
					return cmdexit.New(2, err)
				}
				return cmdexit.New(1, err)
			}
			if err := c.Run(cmd.Context(), metricsAddr); err != nil {
				return cmdexit.New(1, err)
			}
			log.Info("stopped")
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfigPath, "kubeconfig", "", "kubeconfig (default: $KUBECONFIG, ~/.kube/config, then in-cluster)")
	f.StringVar(&kubeContext, "context", "", "kubeconfig context")
	f.StringVar(&o.Namespace, "namespace", podNamespace(), "namespace of the Lease (default: the pod's namespace, else kadmit-system)")
	f.BoolVar(&o.LeaderElect, "leader-elect", true, "elect one reporting replica on a coordination.k8s.io Lease; false: this replica always reports (run one only)")
	f.StringVar(&o.LeaseName, "lease-name", "kadmit-watch", "Lease electing the replica that reports series and Events")
	f.StringVar(&o.Identity, "identity", envOr("POD_NAME", ""), "leader-election identity (default: hostname)")
	f.DurationVar(&o.LeaseDuration, "lease-duration", 15*time.Second, "leader-election lease duration")
	f.DurationVar(&o.RenewDeadline, "renew-deadline", 10*time.Second, "leader-election renew deadline")
	f.DurationVar(&o.RetryPeriod, "retry-period", 2*time.Second, "leader-election retry period")
	f.StringVar(&metricsAddr, "metrics-addr", ":8080", `plain-HTTP address for /metrics, /healthz and /readyz ("" disables)`)
	f.DurationVar(&o.HandshakeInterval, "handshake-interval", watch.DefaultHandshakeInterval, "period of the TLS handshake to every ready endpoint of every webhook (new endpoints are handshaken at once)")
	f.DurationVar(&o.Debounce, "debounce", watch.DefaultDebounce, "an informer event re-evaluates after this delay, coalescing the events within it")
	f.BoolVar(&o.Probe, "probe", false, "server-side dry-run probes through the API server (doctor's check 7); needs create on the probed resources")
	f.DurationVar(&o.ProbeInterval, "probe-interval", watch.DefaultProbeInterval, "period of the probe of each webhook (with --probe)")
	f.Float64Var(&o.ProbeQPS, "probe-qps", watch.DefaultProbeQPS, "probes per second over all webhooks, burst 1 (with --probe)")
	f.IntVar(&o.MaxWebhooks, "max-webhooks", watch.DefaultMaxWebhooks, "webhooks tracked (series, Events, handshakes); more are counted in kadmit_watch_untracked_webhooks")
	f.StringVar(&logFormat, "log-format", "json", "log format: json or text")
	f.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn or error")
	return cmd
}

// podNamespace is the namespace the pod runs in, else kadmit-system.
func podNamespace() string {
	if b, err := os.ReadFile(podNamespaceFile); err == nil {
		if ns := strings.TrimSpace(string(b)); ns != "" {
			return ns
		}
	}
	return "kadmit-system"
}
