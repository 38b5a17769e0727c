package main

import (
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/kadmit/kadmit/internal/cmdexit"

	"github.com/spf13/cobra"
	admissionv1 "k8s.io/api/admission/v1"

	"github.com/kadmit/kadmit/internal/bench"
	"github.com/kadmit/kadmit/internal/otlpreceiver"
)

func newBenchCmd() *cobra.Command {
	var (
		opts                                     bench.Options
		caFile, manifest, operation, output, svg string
		api                                      bench.APIServerOptions
		throughAPIServer                         bool
	)
	cmd := &cobra.Command{
		Use:   "bench --url https://HOST:PORT/PATH | --through-apiserver",
		Short: "Load-test an admission webhook with AdmissionReview requests",
		Long: `Send AdmissionReview requests to a webhook as the API server does (HTTPS POST,
keep-alive connections, a fresh uid per request) and check every answer: HTTP
200, the AdmissionReview apiVersion and kind of the request, the uid echoed,
response.allowed present, and any patch base64 of a JSONPatch with patchType
JSONPatch. An answer equal byte for byte to one already checked, but for its
uid in the same place, counts as that answer without being decoded again, so
that the generator does not spend more per answer than the webhook. Reports
requests, errors by kind, throughput, latency percentiles of the correct
answers and a latency histogram.

The object under review is the one in -f (YAML or JSON, exactly one object), or
by default a ~4.6 KB pod as a Deployment's ReplicaSet creates it.

The run stops after -n requests or -d, whichever comes first (default -d 10s;
at most 10m and 10000000 requests). Only loopback targets are accepted unless
--allow-remote: every address the host resolves to must be loopback.

With --through-apiserver, kadmit bench instead creates the object through the
API server of the kubeconfig with server-side dry-run (dryRun=All: the whole
admission chain runs, webhooks included, nothing is stored), open loop at
--rate creates per second for -d (exactly rate × duration creates, at most
--max-in-flight awaiting an answer), and reports the latency the client saw
next to each webhook's latency from the API server's own
apiserver_admission_webhook_admission_duration_seconds histogram (read from
/metrics before and after; p50/p99 bucket-interpolated as PromQL's
histogram_quantile). The default object is the same pod labelled
acme.com/lifespan-requested: "3". The user needs "create" on the resource and
"get" on the nonResourceURL /metrics.

With --trace-receiver 127.0.0.1:PORT, the run also listens there for OTLP/gRPC
traces (loopback only, plaintext, at most --max-spans kept) and reports per
webhook the exact distribution (count, p50/p90/p99/max, mean) of the API
server's own webhook call spans ("Call mutating webhook" / "Call validating
webhook"), split into the time inside kadmit (its "kadmit.review" span, from
kadmit serve --tracing-endpoint at the same address), network and TLS (the API
server's HTTP client span minus kadmit's) and the API server's own handling
(the call span minus its client span: encoding, decoding, patch). The API
server must export there: --tracing-config-file with a TracingConfiguration
(apiserver.config.k8s.io/v1) whose endpoint is this address and
samplingRatePerMillion 1000000. After the last answer the run waits up to 20 s
for the last span batches.

Exit status: 0 when every request was answered correctly (with
--through-apiserver: every planned create sent and created), 1 when any failed,
2 on usage errors or when the run cannot start.`,
		Example: `  kadmit bench --url https://127.0.0.1:9443/mutate-pod --cacert ca.crt -d 30s -c 64
  kadmit bench --url https://localhost:9443/validate-pod --insecure -n 100000 --http2 -o json
  kadmit bench --url https://127.0.0.1:9443/mutate-pod --insecure -f pod.yaml --histogram lat.svg
  kadmit bench --through-apiserver --kubeconfig kind.kubeconfig --rate 100 -d 60s --namespace shop
  kadmit bench --through-apiserver --rate 1000 -d 40s --trace-receiver 127.0.0.1:4317`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "text" && output != "json" {
				return cmdexit.New(2, fmt.Errorf("-o %q: must be text or json", output))
			}
			if throughAPIServer {
				return runThroughAPIServer(cmd, api, opts, manifest, output)
			}
			for _, name := range apiServerOnlyFlags {
				if cmd.Flags().Changed(name) {
					return cmdexit.New(2, fmt.Errorf("--%s needs --through-apiserver", name))
				}
			}
			if opts.URL == "" {
				return cmdexit.New(2, errors.New("--url is required (or --through-apiserver)"))
			}
			if cmd.Flags().Changed("requests") && opts.Requests < 1 {
				return cmdexit.New(2, fmt.Errorf("-n %d: must be 1..%d", opts.Requests, bench.MaxRequests))
			}
			if cmd.Flags().Changed("duration") && opts.Duration <= 0 {
				return cmdexit.New(2, fmt.Errorf("-d %s: must be %s..%s", opts.Duration, bench.MinDuration, bench.MaxDuration))
			}
			if cmd.Flags().Changed("concurrency") && opts.Concurrency < 1 {
				return cmdexit.New(2, fmt.Errorf("-c %d: must be 1..%d", opts.Concurrency, bench.MaxConcurrency))
			}
			opts.Operation = admissionv1.Operation(operation)
			if caFile != "" {
				pem, err := os.ReadFile(caFile)
				if err != nil {
					return cmdexit.New(2, fmt.Errorf("--cacert: %w", err))
				}
				opts.RootCAs = x509.NewCertPool()
				if !opts.RootCAs.AppendCertsFromPEM(pem) {
					return cmdexit.New(2, fmt.Errorf("--cacert %s: no PEM certificate found", caFile))
				}
			}
			var err error
			if opts.Manifest, err = readManifest(cmd, manifest); err != nil {
				return err
			}
			stderr := cmd.ErrOrStderr()
			pl := &progressLine{w: stderr}
			if isTerminal(stderr) {
				opts.Progress = pl.update
			}

			rep, err := bench.Run(cmd.Context(), opts)
			pl.clear()
			if err != nil {
				return cmdexit.New(2, err)
			}
			if err := writeReport(cmd, output, rep); err != nil {
				return err
			}
			if svg != "" {
				if err := writeSVGFile(svg, rep); err != nil {
					return cmdexit.New(2, err)
				}
			}
			if n := rep.ErrorCount(); n > 0 {
				return cmdexit.New(1, fmt.Errorf("%d of %d requests failed", n, rep.Requests))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.URL, "url", "", "webhook URL, https://HOST:PORT/PATH (loopback only unless --allow-remote)")
	f.StringVar(&caFile, "cacert", "", "PEM file of the CA that signed the webhook's certificate; default: system roots")
	f.BoolVar(&opts.Insecure, "insecure", false, "skip verification of the webhook's certificate")
	f.StringVarP(&manifest, "filename", "f", "", `manifest with the one object to review (YAML or JSON, "-" for stdin); default: a built-in Deployment pod`)
	f.StringVar(&operation, "operation", "CREATE", "operation to review as: CREATE, UPDATE or DELETE")
	f.StringVar(&opts.APIVersion, "api-version", "v1", "AdmissionReview version: v1 or v1beta1")
	f.IntVarP(&opts.Concurrency, "concurrency", "c", bench.DefaultConcurrency, fmt.Sprintf("requests in flight, 1..%d", bench.MaxConcurrency))
	f.DurationVarP(&opts.Duration, "duration", "d", 0, fmt.Sprintf("stop issuing requests after this long, %s..%s (default %s, or %s with -n)", bench.MinDuration, bench.MaxDuration, bench.DefaultDuration, bench.MaxDuration))
	f.Int64VarP(&opts.Requests, "requests", "n", 0, fmt.Sprintf("stop after this many requests, 1..%d", bench.MaxRequests))
	f.DurationVar(&opts.Timeout, "timeout", bench.DefaultTimeout, fmt.Sprintf("per-request timeout, up to %s (with --through-apiserver: 1s..%s, default %s)", bench.MaxTimeout, bench.MaxTimeout, bench.DefaultAPITimeout))
	f.BoolVar(&opts.HTTP2, "http2", false, "use HTTP/2 (ALPN h2) instead of HTTP/1.1 (kadmit serve offers it only with --http2)")
	f.BoolVar(&opts.AllowRemote, "allow-remote", false, "allow a host that resolves to non-loopback addresses")
	f.StringVarP(&output, "output", "o", "text", "report format: text or json")
	f.StringVar(&svg, "histogram", "", "also write the latency histogram to this SVG file")
	f.BoolVar(&throughAPIServer, "through-apiserver", false, "create the object through the kubeconfig's API server with server-side dry-run and report the webhooks' latency from the API server's metrics")
	f.StringVar(&api.Kubeconfig, "kubeconfig", "", "with --through-apiserver: kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
	f.StringVar(&api.Context, "context", "", "with --through-apiserver: kubeconfig context (default: the current context)")
	f.StringVar(&api.Namespace, "namespace", "", "with --through-apiserver: namespace to create in (default: the object's, else default)")
	f.IntVar(&api.Rate, "rate", bench.DefaultRate, fmt.Sprintf("with --through-apiserver: creates per second, 1..%d", bench.MaxRate))
	f.IntVar(&api.MaxInFlight, "max-in-flight", bench.DefaultMaxInFlight, fmt.Sprintf("with --through-apiserver: creates awaiting an answer at most, 1..%d", bench.MaxInFlight))
	f.StringVar(&api.TraceReceiver, "trace-receiver", "", "with --through-apiserver: loopback IP:PORT to receive the API server's and kadmit's OTLP/gRPC spans on, for the exact per-call split")
	f.IntVar(&api.MaxSpans, "max-spans", otlpreceiver.DefaultMaxSpans, fmt.Sprintf("with --trace-receiver: spans kept at most, 1..%d (about 90 bytes each)", otlpreceiver.MaxMaxSpans))
	return cmd
}

// apiServerOnlyFlags take effect only with --through-apiserver;
// urlOnlyFlags only without it.
var (
	apiServerOnlyFlags = []string{"kubeconfig", "context", "namespace", "rate", "max-in-flight", "trace-receiver", "max-spans"}
	urlOnlyFlags       = []string{"url", "cacert", "insecure", "operation", "api-version", "concurrency", "requests", "http2", "histogram"}
)

// readManifest reads -f: nothing, "-" for stdin, or a file.
func readManifest(cmd *cobra.Command, manifest string) ([]byte, error) {
	switch manifest {
	case "":
		return nil, nil
	case "-":
		b, err := io.ReadAll(io.LimitReader(cmd.InOrStdin(), maxManifestBytes+1))
		if err != nil {
			return nil, cmdexit.New(2, fmt.Errorf("read manifest from stdin: %w", err))
		}
		if len(b) > maxManifestBytes {
			return nil, cmdexit.New(2, fmt.Errorf("-f -: manifest longer than %d bytes", maxManifestBytes))
		}
		return b, nil
	default:
		b, err := os.ReadFile(manifest)
		if err != nil {
			return nil, cmdexit.New(2, fmt.Errorf("-f: %w", err))
		}
		return b, nil
	}
}

// maxManifestBytes bounds a manifest read from stdin: the API server's
// request limit is 3 MiB.
const maxManifestBytes = 16 << 20

// runThroughAPIServer wires `kadmit bench --through-apiserver`.
func runThroughAPIServer(cmd *cobra.Command, api bench.APIServerOptions, opts bench.Options, manifest, output string) error {
	for _, name := range urlOnlyFlags {
		if cmd.Flags().Changed(name) {
			return cmdexit.New(2, fmt.Errorf("--%s does not apply with --through-apiserver (the load is --rate, bounded by --max-in-flight)", name))
		}
	}
	api.Duration, api.Timeout, api.AllowRemote = opts.Duration, 0, opts.AllowRemote
	if cmd.Flags().Changed("timeout") {
		api.Timeout = opts.Timeout
	}
	if cmd.Flags().Changed("duration") && opts.Duration <= 0 {
		return cmdexit.New(2, fmt.Errorf("-d %s: must be %s..%s", opts.Duration, bench.MinAPIDuration, bench.MaxDuration))
	}
	if cmd.Flags().Changed("rate") && api.Rate < 1 {
		return cmdexit.New(2, fmt.Errorf("--rate %d: must be 1..%d creates per second", api.Rate, bench.MaxRate))
	}
	if cmd.Flags().Changed("max-spans") && api.TraceReceiver == "" {
		return cmdexit.New(2, errors.New("--max-spans needs --trace-receiver"))
	}
	if cmd.Flags().Changed("max-spans") && api.MaxSpans < 1 {
		return cmdexit.New(2, fmt.Errorf("--max-spans %d: must be 1..%d", api.MaxSpans, otlpreceiver.MaxMaxSpans))
	}
	if cmd.Flags().Changed("max-in-flight") && api.MaxInFlight < 1 {
		return cmdexit.New(2, fmt.Errorf("--max-in-flight %d: must be 1..%d", api.MaxInFlight, bench.MaxInFlight))
	}
	var err error
	if api.Manifest, err = readManifest(cmd, manifest); err != nil {
		return err
	}
	stderr := cmd.ErrOrStderr()
	pl := &progressLine{w: stderr}
	if isTerminal(stderr) {
		api.Progress = pl.update
	}
	rep, err := bench.RunAPIServer(cmd.Context(), api)
	pl.clear()
	if err != nil {
		return cmdexit.New(2, err)
	}
	if err := writeReport(cmd, output, rep); err != nil {
		return err
	}
	if !rep.Complete() {
		return cmdexit.New(1, fmt.Errorf("%d of %d planned creates sent, %d failed", rep.Sent, rep.Planned, rep.ErrorCount()))
	}
	return nil
}

func writeSVGFile(path string, rep *bench.Report) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--histogram: %w", err)
	}
	if err := rep.WriteSVG(f); err != nil {
		_ = f.Close()
		return fmt.Errorf("--histogram %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("--histogram %s: %w", path, err)
	}
	return nil
}

// isTerminal reports whether w is a character device, so a \r progress line
// does not end up in a log file or pipe.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// progressLine rewrites one stderr line in place with \r.
type progressLine struct {
	mu      sync.Mutex
	w       io.Writer
	written bool
}

func (p *progressLine) update(pr bench.Progress) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, "\r%-72s", fmt.Sprintf("  %s  %d requests  %d errors  %.0f req/s",
		pr.Elapsed.Round(time.Second), pr.Requests, pr.Errors, pr.RPS))
	p.written = true
}

func (p *progressLine) clear() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.written {
		fmt.Fprintf(p.w, "\r%72s\r", "")
	}
}

// writeReport writes either bench report as JSON (-o json) or text.
func writeReport(cmd *cobra.Command, output string, rep interface {
	WriteJSON(io.Writer) error
	WriteText(io.Writer) error
}) error {
	var err error
	if output == "json" {
		err = rep.WriteJSON(cmd.OutOrStdout())
	} else {
		err = rep.WriteText(cmd.OutOrStdout())
	}
	if err != nil {
		return cmdexit.New(2, err)
	}
	return nil
}
