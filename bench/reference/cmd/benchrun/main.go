// Command benchrun is `make bench`: it starts kadmit, the controller-runtime
// reference webhook and the bare TLS server one at a time on 127.0.0.1, each
// pinned to CPU 0 (taskset, when there are two CPUs or more), loads each
// with `kadmit bench` pinned to CPU 1 (HTTP/1.1 keep-alive, -c concurrency,
// -d duration) and prints one table with throughput, latency percentiles and
// the ratios to controller-runtime and to the bare server. Every server it
// started is stopped when it returns, fails or is interrupted.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"kadmit.local/bench/reference/internal/harness"
)

type config struct {
	kadmit, reference, node, work string
	duration                      time.Duration
	concurrency                   int
	pin                           bool
}

func main() {
	var c config
	flag.StringVar(&c.kadmit, "kadmit", "bin/kadmit", "kadmit binary")
	flag.StringVar(&c.reference, "reference", "bin/bench-reference", "reference binary (bench/reference)")
	flag.StringVar(&c.node, "node", "internal/admission/testdata/node.json", "node manifest for the node-status path")
	flag.StringVar(&c.work, "work", "bin/bench", "directory for certificates, logs and results.json")
	flag.DurationVar(&c.duration, "duration", 10*time.Second, "length of each measured run (1s..2m)")
	flag.IntVar(&c.concurrency, "c", 64, "requests in flight per run")
	flag.Parse()
	if c.duration < time.Second || c.duration > 2*time.Minute {
		fmt.Fprintln(os.Stderr, "benchrun: -duration must be 1s..2m")
		os.Exit(2)
	}
	c.pin = harness.CanPin()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := runAll(ctx, c)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchrun:", err)
		os.Exit(1)
	}
}

// result is one measured run.
type result struct {
	Server, Path string
	RPS          float64
	P50, P99     float64 // milliseconds
	P999         float64
	Errors       int64
	RSSIdleKB    int64 `json:",omitempty"`
	RSSLoadKB    int64 `json:",omitempty"`
}

type server struct {
	name   string
	args   []string // command line, without taskset
	caFile string
	port   int
	runs   []run // paths to load
}

type run struct {
	label, path, manifest string
}

func runAll(ctx context.Context, c config) error {
	if err := os.MkdirAll(c.work, 0o755); err != nil {
		return err
	}
	refCerts := filepath.Join(c.work, "reference-certs")
	if out, err := exec.CommandContext(ctx, c.reference, "certs", refCerts).CombinedOutput(); err != nil {
		return fmt.Errorf("reference certs: %v: %s", err, out)
	}
	kadmitCA := filepath.Join(c.work, "kadmit-ca.crt")
	_ = os.Remove(kadmitCA)
	servers := []server{
		{
			name: "kadmit", port: 19443, caFile: kadmitCA,
			args: []string{c.kadmit, "serve", "--self-signed", "--dns-name", "127.0.0.1", "--ca-file", kadmitCA,
				"--addr", "127.0.0.1:19443", "--metrics-addr", "127.0.0.1:18080"},
			runs: []run{
				{"validating (pod-name)", "/validate-pod", ""},
				{"mutating (lifespan)", "/mutate-pod", ""},
				{"node-status (node-overcommit)", "/mutate-node-status", c.node},
				{"seed profile, 3 paths at once", "", ""},
			},
		},
		{
			name: "controller-runtime", port: 19444, caFile: filepath.Join(refCerts, "tls.crt"),
			args: []string{c.reference, "controller-runtime", "-port", "19444", "-cert-dir", refCerts},
			runs: []run{
				{"validating (pod-name)", "/validate-pod", ""},
				{"mutating (lifespan)", "/mutate-pod", ""},
			},
		},
		{
			name: "bare", port: 19445, caFile: filepath.Join(refCerts, "tls.crt"),
			args: []string{c.reference, "bare", "-port", "19445", "-cert-dir", refCerts},
			runs: []run{
				{"pod (uid only)", "/", ""},
				{"node (uid only)", "/", c.node},
			},
		},
	}
	fmt.Printf("machine: %d CPUs, pinning %v; load average at start: %s\n", runtime.NumCPU(), c.pin, harness.Loadavg())
	var results []result
	for _, s := range servers {
		rs, err := measure(ctx, c, s)
		if err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		results = append(results, rs...)
	}
	fmt.Printf("load average at end: %s\n\n", harness.Loadavg())
	printTable(os.Stdout, results)
	b, _ := json.MarshalIndent(results, "", "  ")
	return os.WriteFile(filepath.Join(c.work, "results.json"), b, 0o644)
}

// measure starts s pinned to CPU 0, waits until it accepts TLS, warms it up
// for 2s and runs each of s.runs; it always stops s before returning.
func measure(ctx context.Context, c config, s server) ([]result, error) {
	logf, err := os.Create(filepath.Join(c.work, s.name+".log"))
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	// One log line per decision goes to a file, not the terminal, so
	// terminal I/O does not distort the measurement.
	proc, err := harness.Start(harness.Pinned(c.pin, 0, s.args), logf)
	if err != nil {
		return nil, err
	}
	defer proc.Stop()
	if err := proc.WaitTLS(ctx, s.caFile, s.port); err != nil {
		return nil, fmt.Errorf("%w (log: %s)", err, logf.Name())
	}
	pid := proc.PID()
	idle := harness.VmRSS(pid)
	if _, err := load(ctx, c, s, run{path: s.runs[0].path, manifest: s.runs[0].manifest}, 2*time.Second, c.concurrency, nil); err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	var out []result
	for _, r := range s.runs {
		var peak int64
		sample := func() {
			if v := harness.VmRSS(pid); v > peak {
				peak = v
			}
		}
		var res result
		if r.path == "" {
			res, err = loadMixed(ctx, c, s, sample)
		} else {
			res, err = load(ctx, c, s, r, c.duration, c.concurrency, sample)
		}
		if err != nil {
			return out, fmt.Errorf("%s: %w", r.label, err)
		}
		res.Server, res.Path = s.name, r.label
		res.RSSIdleKB, res.RSSLoadKB = idle, peak
		out = append(out, res)
		fmt.Printf("  %-20s %-32s %9.0f req/s  p99 %6.2f ms\n", s.name, r.label, res.RPS, res.P99)
	}
	return out, nil
}

// loadMixed loads the seed profile's three busy paths at once, splitting the
// concurrency between them; throughput is the sum, percentiles the worst.
func loadMixed(ctx context.Context, c config, s server, sample func()) (result, error) {
	runs := []run{{path: "/validate-pod"}, {path: "/mutate-pod"}, {path: "/mutate-node-status", manifest: c.node}}
	var (
		mu    sync.Mutex
		total result
		first error
		wg    sync.WaitGroup
	)
	for i, r := range runs {
		conc := c.concurrency / len(runs)
		if i < c.concurrency%len(runs) {
			conc++
		}
		var smp func()
		if i == 0 {
			smp = sample
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := load(ctx, c, s, r, c.duration, max(conc, 1), smp)
			mu.Lock()
			defer mu.Unlock()
			if err != nil && first == nil {
				first = err
			}
			total.RPS += res.RPS
			total.P50 = max(total.P50, res.P50)
			total.P99 = max(total.P99, res.P99)
			total.P999 = max(total.P999, res.P999)
			total.Errors += res.Errors
		}()
	}
	wg.Wait()
	return total, first
}

// load runs `kadmit bench` pinned to CPU 1 against one path of s, calling
// sample every second while it runs.
func load(ctx context.Context, c config, s server, r run, d time.Duration, conc int, sample func()) (result, error) {
	res, err := harness.Load{Kadmit: c.kadmit, URL: fmt.Sprintf("https://127.0.0.1:%d%s", s.port, r.path), CAFile: s.caFile,
		Manifest: r.manifest, Conc: conc, Duration: d, Pin: c.pin, Sample: sample}.Run(ctx)
	return result{RPS: res.RPS, P50: res.P50, P99: res.P99, P999: res.P999, Errors: res.Errors}, err
}

// printTable prints the results with kadmit's ratios to the
// controller-runtime row of the same path and to the bare row of the same
// object kind.
func printTable(w io.Writer, rs []result) {
	find := func(server, path string) float64 {
		for _, r := range rs {
			if r.Server == server && r.Path == path {
				return r.RPS
			}
		}
		return 0
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "server\tpath\treq/s\tp50 ms\tp99 ms\tp99.9 ms\tvs controller-runtime\tvs bare\tRSS idle/load MiB\t")
	for _, r := range rs {
		vsCR, vsBare := "", ""
		if r.Server != "controller-runtime" {
			if cr := find("controller-runtime", r.Path); cr > 0 {
				vsCR = fmt.Sprintf("%.2fx", r.RPS/cr)
			}
		}
		if r.Server != "bare" {
			bare := find("bare", "pod (uid only)")
			if strings.HasPrefix(r.Path, "node") {
				bare = find("bare", "node (uid only)")
			}
			if bare > 0 {
				vsBare = fmt.Sprintf("%.0f%%", 100*r.RPS/bare)
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%.0f\t%.2f\t%.2f\t%.2f\t%s\t%s\t%.0f/%.0f\t\n", r.Server, r.Path, r.RPS, r.P50, r.P99, r.P999,
			vsCR, vsBare, float64(r.RSSIdleKB)/1024, float64(r.RSSLoadKB)/1024)
	}
	_ = tw.Flush()
}
