// Command benchrun is `make bench`: it starts kadmit, the controller-runtime
// reference webhook and the bare TLS server one at a time on 127.0.0.1, each
// pinned to CPU 0 (taskset, when there are two CPUs or more), loads each
// with `kadmit bench` pinned to CPU 1 (HTTP/1.1 keep-alive, -c concurrency,
// -d duration) and prints one table with throughput, latency percentiles and
// the ratios to controller-runtime and to the bare server. Every server it
// started is stopped when it returns, fails or is interrupted.
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"
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
	_, err := exec.LookPath("taskset")
	c.pin = err == nil && runtime.NumCPU() >= 2
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err = runAll(ctx, c)
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

// benchJSON is the part of `kadmit bench -o json` benchrun reads.
type benchJSON struct {
	Requests   int64            `json:"requests"`
	Errors     map[string]int64 `json:"errors"`
	Throughput float64          `json:"throughput_rps"`
	Latency    struct {
		P50  float64 `json:"p50"`
		P99  float64 `json:"p99"`
		P999 float64 `json:"p999"`
	} `json:"latency_ms"`
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
	fmt.Printf("machine: %d CPUs, pinning %v; load average at start: %s\n", runtime.NumCPU(), c.pin, loadavg())
	var results []result
	for _, s := range servers {
		rs, err := measure(ctx, c, s)
		if err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		results = append(results, rs...)
	}
	fmt.Printf("load average at end: %s\n\n", loadavg())
	printTable(os.Stdout, results)
	b, _ := json.MarshalIndent(results, "", "  ")
	return os.WriteFile(filepath.Join(c.work, "results.json"), b, 0o644)
}

// measure starts s pinned to CPU 0, waits until it accepts TLS, warms it up
// for 2s and runs each of s.runs; it always stops s before returning.
func measure(ctx context.Context, c config, s server) ([]result, error) {
	argv := s.args
	if c.pin {
		argv = append([]string{"taskset", "-c", "0"}, argv...)
	}
	logf, err := os.Create(filepath.Join(c.work, s.name+".log"))
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	// One log line per decision goes to a file, not the terminal, so
	// terminal I/O does not distort the measurement.
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	defer stopServer(cmd, done)

	if err := waitReady(ctx, s, done); err != nil {
		return nil, err
	}
	pid := serverPID(cmd.Process.Pid)
	idle := vmRSS(pid)
	if _, err := load(ctx, c, s, run{path: s.runs[0].path, manifest: s.runs[0].manifest}, 2*time.Second, c.concurrency, nil); err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	var out []result
	for _, r := range s.runs {
		var peak int64
		sample := func() {
			if v := vmRSS(pid); v > peak {
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
	argv := []string{c.kadmit, "bench", "--url", fmt.Sprintf("https://127.0.0.1:%d%s", s.port, r.path),
		"--cacert", s.caFile, "-c", strconv.Itoa(conc), "-d", d.String(), "-o", "json"}
	if r.manifest != "" {
		argv = append(argv, "-f", r.manifest)
	}
	if c.pin {
		argv = append([]string{"taskset", "-c", "1"}, argv...)
	}
	// The bench bounds itself by -d; the extra minute only guards a hang.
	cctx, cancel := context.WithTimeout(ctx, d+time.Minute)
	defer cancel()
	cmd := exec.CommandContext(cctx, argv[0], argv[1:]...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		return result{}, err
	}
	stopSampling := make(chan struct{})
	var wg sync.WaitGroup
	if sample != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(time.Second)
			defer t.Stop()
			for {
				select {
				case <-stopSampling:
					return
				case <-t.C:
					sample()
				}
			}
		}()
	}
	err := cmd.Wait()
	close(stopSampling)
	wg.Wait()
	var b benchJSON
	if jerr := json.Unmarshal(stdout.Bytes(), &b); jerr != nil {
		return result{}, fmt.Errorf("kadmit bench: %v: %s", err, strings.TrimSpace(stderr.String()))
	}
	var errs int64
	for _, n := range b.Errors {
		errs += n
	}
	res := result{RPS: b.Throughput, P50: b.Latency.P50, P99: b.Latency.P99, P999: b.Latency.P999, Errors: errs}
	if err != nil || errs > 0 {
		return res, fmt.Errorf("kadmit bench reported errors %v (%v)", b.Errors, err)
	}
	return res, nil
}

// waitReady polls a TLS handshake for up to 60s (the CA file must exist
// first for kadmit, which writes it at start-up).
func waitReady(ctx context.Context, s server, done <-chan struct{}) error {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-done:
			return errors.New("server exited during start-up; see its log in the work directory")
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		if _, err := os.Stat(s.caFile); err == nil {
			d := &net.Dialer{Timeout: time.Second}
			conn, err := tls.DialWithDialer(d, "tcp", fmt.Sprintf("127.0.0.1:%d", s.port), &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // readiness probe only
			if err == nil {
				conn.Close()
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return errors.New("not accepting TLS connections after 60s")
}

// stopServer sends SIGTERM to the server's process group, then SIGKILL
// after 10s.
func stopServer(cmd *exec.Cmd, done <-chan struct{}) {
	pgid := cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-done
	}
}

// serverPID returns the server's own pid: taskset execs the server, so the
// pid is the same; kept as a function to say so.
func serverPID(pid int) int { return pid }

// vmRSS returns the process's resident set size in KiB from
// /proc/PID/status, or 0 when unavailable.
func vmRSS(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return 0
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
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
