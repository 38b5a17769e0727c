package main

import (
	"crypto/x509"
	"errors"
	"fmt"
	"github.com/kadmit/kadmit/internal/cmdexit"
	"io"
	"os"
	"sync"
	"time"

	"github.com/spf13/cobra"
	admissionv1 "k8s.io/api/admission/v1"

	"github.com/kadmit/kadmit/internal/bench"
)

func newBenchCmd() *cobra.Command {
	var (
		opts                                     bench.Options
		caFile, manifest, operation, output, svg string
	)
	cmd := &cobra.Command{
		Use:   "bench --url https://HOST:PORT/PATH",
		Short: "Load-test an admission webhook with AdmissionReview requests",
		Long: `Send AdmissionReview requests to a webhook as the API server does (HTTPS POST,
keep-alive connections, a fresh uid per request) and check every answer: HTTP
200, the AdmissionReview apiVersion and kind of the request, the uid echoed,
response.allowed present, and any patch base64 of a JSONPatch with patchType
JSONPatch. Reports requests, errors by kind, throughput, latency percentiles of
the correct answers and a latency histogram.

The object under review is the one in -f (YAML or JSON, exactly one object), or
by default a ~4.6 KB pod as a Deployment's ReplicaSet creates it.

The run stops after -n requests or -d, whichever comes first (default -d 10s;
at most 10m and 10000000 requests). Only loopback targets are accepted unless
--allow-remote: every address the host resolves to must be loopback.

Exit status: 0 when every request was answered correctly, 1 when any failed,
2 on usage errors or when the run cannot start.`,
		Example: `  kadmit bench --url https://127.0.0.1:9443/mutate-pod --cacert ca.crt -d 30s -c 64
  kadmit bench --url https://localhost:9443/validate-pod --insecure -n 100000 --http2 -o json
  kadmit bench --url https://127.0.0.1:9443/mutate-pod --insecure -f pod.yaml --histogram lat.svg`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if opts.URL == "" {
				return cmdexit.New(2, errors.New("--url is required"))
			}
			if output != "text" && output != "json" {
				return cmdexit.New(2, fmt.Errorf("-o %q: must be text or json", output))
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
			switch manifest {
			case "":
			case "-":
				b, err := io.ReadAll(cmd.InOrStdin())
				if err != nil {
					return cmdexit.New(2, fmt.Errorf("read manifest from stdin: %w", err))
				}
				opts.Manifest = b
			default:
				b, err := os.ReadFile(manifest)
				if err != nil {
					return cmdexit.New(2, fmt.Errorf("-f: %w", err))
				}
				opts.Manifest = b
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
			out := cmd.OutOrStdout()
			if output == "json" {
				err = rep.WriteJSON(out)
			} else {
				err = rep.WriteText(out)
			}
			if err != nil {
				return cmdexit.New(2, err)
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
	f.DurationVar(&opts.Timeout, "timeout", bench.DefaultTimeout, fmt.Sprintf("per-request timeout, up to %s", bench.MaxTimeout))
	f.BoolVar(&opts.HTTP2, "http2", false, "use HTTP/2 (ALPN h2) instead of HTTP/1.1 (kadmit serve offers it only with --http2)")
	f.BoolVar(&opts.AllowRemote, "allow-remote", false, "allow a host that resolves to non-loopback addresses")
	f.StringVarP(&output, "output", "o", "text", "report format: text or json")
	f.StringVar(&svg, "histogram", "", "also write the latency histogram to this SVG file")
	return cmd
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
