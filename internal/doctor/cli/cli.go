// Package cli is the `doctor` command line, shared by `kadmit doctor` and the
// kubectl plugin `kubectl-kadmit` (so `kubectl kadmit doctor` works). It lives
// outside package main so that both binaries build the same command.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/kadmit/kadmit/internal/cmdexit"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kadmit/kadmit/internal/doctor"
	"github.com/kadmit/kadmit/internal/kubeconfig"
)

// NewCommand returns the `doctor` command. Its RunE returns nil (exit 0) when
// no finding is an error, and a *cmdexit.Error otherwise.
func NewCommand() *cobra.Command {
	var kubeconfig, kubeContext, output, fromError string
	var probe bool
	var probeCount, burst, concurrency, maxHandshakes int
	var qps float32
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

--from-error 'MESSAGE' takes an error the API server printed (kubectl output,
a ReplicaSet event, an audit log line; '-' reads it from stdin, at most 64 KiB),
finds the webhook or admission policy it names, checks only that one, and
leads with the finding that explains the message.

Doctor dials, from where it runs, every ready endpoint of a webhook Service
(at most 10 per webhook) and the host and port of every clientConfig.url,
whatever they name: a TCP connect and a TLS handshake, no request, 3s each,
--concurrency at once, at most --max-handshakes endpoints per run. What it
finds there is in the report.

Where doctor may not read something (403 Forbidden), it says so (KD001) and
what it could not tell, and raises no error that rests on it.

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
			msg, err := readFromError(cmd.InOrStdin(), fromError)
			if err != nil {
				return cmdexit.New(2, err)
			}
			if qps <= 0 || burst <= 0 || concurrency <= 0 || concurrency > doctor.MaxConcurrency || maxHandshakes <= 0 {
				return cmdexit.New(2, fmt.Errorf("--qps, --burst, --max-handshakes and --concurrency must be positive, --concurrency at most %d", doctor.MaxConcurrency))
			}
			cs, err := clientFor(kubeconfig, kubeContext, qps, burst)
			if err != nil {
				return cmdexit.New(2, err)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			rep, err := doctor.Run(ctx, cs, doctor.Options{
				Names: names, Probe: probe, ProbeCount: probeCount, ExpiryWarning: expiryWarning, FromError: msg,
				Concurrency: concurrency, MaxHandshakes: maxHandshakes,
			})
			if errors.Is(err, context.DeadlineExceeded) {
				err = fmt.Errorf("%w (raise --timeout, now %s)", err, timeout)
			}
			if rep == nil {
				return cmdexit.New(2, err)
			}
			// A run cut short by --timeout still prints what it checked;
			// the webhooks it did not are KD003 findings.
			var werr error
			if output == "json" {
				werr = doctor.WriteJSON(cmd.OutOrStdout(), rep)
			} else {
				werr = doctor.WriteTable(cmd.OutOrStdout(), rep)
			}
			if err != nil {
				return cmdexit.New(2, err)
			}
			if werr != nil {
				return cmdexit.New(2, werr)
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
	f.StringVar(&fromError, "from-error", "", "an API server error message about a webhook or admission policy ('-': read from stdin); diagnose what it names and lead with the finding that explains it")
	f.BoolVar(&probe, "probe", false, "let the API server call each webhook via a server-side dry-run create")
	f.IntVar(&probeCount, "probe-count", 3, "probes per webhook with --probe; more catch intermittent errors")
	f.StringVarP(&output, "output", "o", "table", "output: table or json")
	f.DurationVar(&timeout, "timeout", 2*time.Minute, "bound for the whole run (API calls, handshakes, probes); when it ends during the checks, the report so far is printed, with the webhooks not checked as KD003 (exit status 2)")
	// doctor only reads (and, with --probe, dry-runs): client-go's default
	// 5 requests per second made large clusters take minutes.
	f.Float32Var(&qps, "qps", 50, "API requests per second (client-side rate limit)")
	f.IntVar(&burst, "burst", 100, "API requests allowed in a burst above --qps")
	f.IntVar(&concurrency, "concurrency", doctor.DefaultConcurrency, fmt.Sprintf("webhooks checked at once: their TLS handshakes and probes run in parallel (at most %d)", doctor.MaxConcurrency))
	f.IntVar(&maxHandshakes, "max-handshakes", doctor.DefaultMaxHandshakes, "distinct endpoints dialed (TCP connect and TLS handshake, no request) per run; those past it are KD003")
	f.DurationVar(&expiryWarning, "expiry-warning", doctor.DefaultExpiryWarning, "warn when a serving certificate expires within this (and is in the last third of its life)")
	return cmd
}

// readFromError returns --from-error's message: the flag's value, or stdin
// for "-", at most doctor.MaxErrorMessage bytes (more is refused, never
// truncated: a cut message could name the wrong webhook).
func readFromError(stdin io.Reader, v string) (string, error) {
	if v != "-" {
		if len(v) > doctor.MaxErrorMessage {
			return "", fmt.Errorf("--from-error: %d bytes, more than %d: pass only the error message", len(v), doctor.MaxErrorMessage)
		}
		return v, nil
	}
	b, err := io.ReadAll(io.LimitReader(stdin, doctor.MaxErrorMessage+1))
	if err != nil {
		return "", fmt.Errorf("--from-error -: read stdin: %w", err)
	}
	if len(b) > doctor.MaxErrorMessage {
		return "", fmt.Errorf("--from-error -: stdin has more than %d bytes: pass only the error message", doctor.MaxErrorMessage)
	}
	if len(strings.TrimSpace(string(b))) == 0 {
		return "", errors.New("--from-error -: stdin is empty")
	}
	return string(b), nil
}

// clientFor loads a kubeconfig the way kubectl does: --kubeconfig, else
// $KUBECONFIG, else ~/.kube/config; --context overrides the current context.
// Server warnings (which a probe may trigger) are dropped: the report says
// what matters.
func clientFor(kubeconfigPath, kubeContext string, qps float32, burst int) (kubernetes.Interface, error) {
	cfg, err := kubeconfig.Load(kubeconfigPath, kubeContext, "")
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = qps, burst
	cfg.WarningHandler = rest.NoWarnings{}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("build client: %w", err)
	}
	return cs, nil
}
