// Package cli is the `doctor` command line, shared by `kadmit doctor` and the
// kubectl plugin `kubectl-kadmit` (so `kubectl kadmit doctor` works). It lives
// outside package main so that both binaries build the same command.
package cli

import (
	"context"
	"errors"
	"fmt"
	"github.com/kadmit/kadmit/internal/cmdexit"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kadmit/kadmit/internal/doctor"
	"github.com/kadmit/kadmit/internal/kubeconfig"
)

// NewCommand returns the `doctor` command. Its RunE returns nil (exit 0) when
// no finding is an error, and a *cmdexit.Error otherwise.
func NewCommand() *cobra.Command {
	var kubeconfig, kubeContext, output string
	var probe bool
	var probeCount int
	var timeout, expiryWarning time.Duration
	cmd := &cobra.Command{
		Use:   "doctor [NAME...]",
		Short: "Diagnose admission webhooks from the API server's point of view",
		Long: `Read every MutatingWebhookConfiguration and ValidatingWebhookConfiguration (or
those named) and report, per webhook, what would make the API server's calls
fail: a missing Service or port, no ready endpoints, a Service selecting pods
of several workloads, certificate problems (caBundle, unknown authority, SAN
mismatch, expiry, weak keys, SHA-1; by a TLS handshake with ServerName
<svc>.<ns>.svc where endpoints are reachable from here), webhooks that block
their own restart, risky settings, and orphaned configurations.

--probe makes the API server call each webhook through a server-side dry-run
create of a minimal object the webhook matches (nothing is stored) and
classifies the answer; --probe-count repeats it to catch intermittent errors.

Every finding has a stable ID (KD101...), a severity, why it breaks admission,
and the fix. Exit status: 0 no errors, 1 errors found, 2 doctor could not run.`,
		RunE: func(cmd *cobra.Command, names []string) error {
			if output != "table" && output != "json" {
				return cmdexit.New(2, fmt.Errorf("-o %q: must be table or json", output))
			}
			if timeout <= 0 {
				return cmdexit.New(2, fmt.Errorf("--timeout %s: must be positive", timeout))
			}
			cs, err := clientFor(kubeconfig, kubeContext)
			if err != nil {
				return cmdexit.New(2, err)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			rep, err := doctor.Run(ctx, cs, doctor.Options{
				Names: names, Probe: probe, ProbeCount: probeCount, ExpiryWarning: expiryWarning,
			})
			if err != nil {
				if errors.Is(err, context.DeadlineExceeded) {
					err = fmt.Errorf("%w (raise --timeout, now %s)", err, timeout)
				}
				return cmdexit.New(2, err)
			}
			if output == "json" {
				err = doctor.WriteJSON(cmd.OutOrStdout(), rep)
			} else {
				err = doctor.WriteTable(cmd.OutOrStdout(), rep)
			}
			if err != nil {
				return cmdexit.New(2, err)
			}
			if rep.Errors > 0 {
				return cmdexit.New(1, fmt.Errorf("%d error(s) found in %d webhook(s)", rep.Errors, len(rep.Webhooks)))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
	f.StringVar(&kubeContext, "context", "", "kubeconfig context (default: the current context)")
	f.BoolVar(&probe, "probe", false, "let the API server call each webhook via a server-side dry-run create")
	f.IntVar(&probeCount, "probe-count", 3, "probes per webhook with --probe; more catch intermittent errors")
	f.StringVarP(&output, "output", "o", "table", "output: table or json")
	f.DurationVar(&timeout, "timeout", 2*time.Minute, "bound for the whole run (API calls, handshakes, probes)")
	f.DurationVar(&expiryWarning, "expiry-warning", doctor.DefaultExpiryWarning, "warn when a serving certificate expires within this (and is in the last third of its life)")
	return cmd
}

// clientFor loads a kubeconfig the way kubectl does: --kubeconfig, else
// $KUBECONFIG, else ~/.kube/config; --context overrides the current context.
// Server warnings (which a probe may trigger) are dropped: the report says
// what matters.
func clientFor(kubeconfigPath, kubeContext string) (kubernetes.Interface, error) {
	cfg, err := kubeconfig.Load(kubeconfigPath, kubeContext, "")
	if err != nil {
		return nil, err
	}
	cfg.WarningHandler = rest.NoWarnings{}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("build client: %w", err)
	}
	return cs, nil
}
