// Command soak is `make soak`: a bounded memory soak of kadmit with the
// seed profile. It starts `kadmit serve --pprof` on 127.0.0.1 (admission
// 19463, metrics 18093), warms it up, takes a heap profile
// (/debug/pprof/heap?gc=1, so after a GC), loads /mutate-pod and
// /validate-pod with `kadmit bench` at a moderate concurrency for
// -duration in runs of at most one minute, records VmRSS every -interval,
// takes a second heap profile after the load and prints inuse_space and
// VmRSS before and after. The server is stopped when it returns, fails or
// is interrupted.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/google/pprof/profile"

	"kadmit.local/bench/reference/internal/harness"
)

const (
	httpsPort   = 19463
	metricsPort = 18093
	maxDuration = time.Hour
)

type config struct {
	kadmit, work       string
	duration, interval time.Duration
	warmup             time.Duration
	concurrency        int
	pin                bool
}

func main() {
	var c config
	flag.StringVar(&c.kadmit, "kadmit", "bin/kadmit", "kadmit binary")
	flag.StringVar(&c.work, "work", "bin/soak", "directory for the CA, heap profiles, the log tail and soak.json")
	flag.DurationVar(&c.duration, "duration", 10*time.Minute, "length of the soak under load (1m..1h)")
	flag.DurationVar(&c.interval, "interval", 10*time.Second, "VmRSS sampling interval")
	flag.DurationVar(&c.warmup, "warmup", 20*time.Second, "load before the first heap profile")
	flag.IntVar(&c.concurrency, "c", 4, "requests in flight per path (two paths)")
	flag.Parse()
	if c.duration < time.Minute || c.duration > maxDuration || c.interval < time.Second || c.warmup < time.Second || c.warmup > 2*time.Minute ||
		c.concurrency < 1 || c.concurrency > 64 {
		fmt.Fprintln(os.Stderr, "soak: -duration must be 1m..1h, -interval >= 1s, -warmup 1s..2m, -c 1..64")
		os.Exit(2)
	}
	c.pin = harness.CanPin()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, c)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
}

type sample struct {
	Elapsed string
	RSSKB   int64
	Load1   float64
}

type heap struct {
	File                     string
	InuseBytes, InuseObjects int64 // from the (sampled) heap profile
	RSSKB                    int64
	// HeapInuseBytes and Goroutines are go_memstats_heap_inuse_bytes and
	// go_goroutines from /metrics, read right after the profile.
	HeapInuseBytes, Goroutines int64
	Loadavg                    string
}

type summary struct {
	Duration     string
	Concurrency  int // per path
	Requests     int64
	RPS          float64
	IdleRSSKB    int64
	Start, End   heap
	Samples      []sample
	LoadavgStart string
	LoadavgEnd   string
}

func run(ctx context.Context, c config) error {
	if err := os.MkdirAll(c.work, 0o755); err != nil {
		return err
	}
	ca := filepath.Join(c.work, "kadmit-ca.crt")
	_ = os.Remove(ca)
	argv := harness.Pinned(c.pin, 0, []string{c.kadmit, "serve", "--self-signed", "--dns-name", "127.0.0.1", "--ca-file", ca,
		"--addr", fmt.Sprintf("127.0.0.1:%d", httpsPort), "--metrics-addr", fmt.Sprintf("127.0.0.1:%d", metricsPort), "--pprof"})
	// One JSON line per decision: at ~2,000 req/s for 10 minutes that is
	// hundreds of MB, so keep only the tail (written to kadmit.log at the end).
	logTail := &harness.TailWriter{Max: 256 << 10}
	srv, err := harness.Start(argv, logTail)
	if err != nil {
		return err
	}
	defer func() {
		srv.Stop()
		_ = os.WriteFile(filepath.Join(c.work, "kadmit.log"), logTail.Bytes(), 0o644)
	}()
	if err := srv.WaitTLS(ctx, ca, httpsPort); err != nil {
		return err
	}
	pid := srv.PID()
	time.Sleep(time.Second)
	s := summary{Duration: c.duration.String(), Concurrency: c.concurrency, LoadavgStart: harness.Loadavg(), IdleRSSKB: harness.VmRSS(pid)}
	fmt.Printf("soak: kadmit pid %d, pinning %v, load average %s, idle VmRSS %d kB\n", pid, c.pin, s.LoadavgStart, s.IdleRSSKB)

	loads := func(d time.Duration) []harness.Load {
		var ls []harness.Load
		for _, p := range []string{"/mutate-pod", "/validate-pod"} {
			ls = append(ls, harness.Load{Kadmit: c.kadmit, URL: fmt.Sprintf("https://127.0.0.1:%d%s", httpsPort, p), CAFile: ca,
				Conc: c.concurrency, Duration: d, Pin: c.pin})
		}
		return ls
	}
	fmt.Printf("soak: warm-up %s\n", c.warmup)
	if _, err := runAll(ctx, loads(c.warmup)); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	if s.Start, err = heapProfile(ctx, filepath.Join(c.work, "heap-start.pb.gz"), pid); err != nil {
		return err
	}
	fmt.Printf("soak: heap at start: inuse_space %s, inuse_objects %d, heap_inuse %s, goroutines %d, VmRSS %d kB\n",
		mib(s.Start.InuseBytes), s.Start.InuseObjects, mib(s.Start.HeapInuseBytes), s.Start.Goroutines, s.Start.RSSKB)

	begin := time.Now()
	ticker := time.NewTicker(c.interval)
	defer ticker.Stop()
	stopSampling := make(chan struct{})
	sampled := make(chan []sample)
	go func() {
		var out []sample
		for {
			select {
			case <-stopSampling:
				sampled <- out
				return
			case <-ticker.C:
				sm := sample{Elapsed: time.Since(begin).Round(time.Second).String(), RSSKB: harness.VmRSS(pid), Load1: harness.Load1()}
				fmt.Printf("  %6s  VmRSS %6d kB  load %.2f\n", sm.Elapsed, sm.RSSKB, sm.Load1)
				out = append(out, sm)
			}
		}
	}()
	var loadErr error
	for left := c.duration; left > 0 && loadErr == nil; {
		d := min(left, time.Minute)
		left -= d
		var rs []harness.Result
		rs, loadErr = runAll(ctx, loads(d))
		for _, r := range rs {
			s.Requests += r.Requests
		}
	}
	elapsed := time.Since(begin)
	close(stopSampling)
	s.Samples = <-sampled
	if loadErr != nil {
		return fmt.Errorf("load: %w", loadErr)
	}
	s.RPS = float64(s.Requests) / elapsed.Seconds()
	if s.End, err = heapProfile(ctx, filepath.Join(c.work, "heap-end.pb.gz"), pid); err != nil {
		return err
	}
	s.LoadavgEnd = harness.Loadavg()

	fmt.Printf("\nsoak: %s under load (%d+%d clients), %d requests, %.0f req/s, load average %s at start, %s at end\n",
		elapsed.Round(time.Second), c.concurrency, c.concurrency, s.Requests, s.RPS, s.LoadavgStart, s.LoadavgEnd)
	fmt.Printf("  %-20s VmRSS %6d kB\n", "idle", s.IdleRSSKB)
	for _, h := range []struct {
		when string
		h    heap
	}{{"after warm-up", s.Start}, {"after " + elapsed.Round(time.Second).String(), s.End}} {
		fmt.Printf("  %-20s VmRSS %6d kB  inuse_space %9s  inuse_objects %6d  heap_inuse %9s  goroutines %d\n",
			h.when, h.h.RSSKB, mib(h.h.InuseBytes), h.h.InuseObjects, mib(h.h.HeapInuseBytes), h.h.Goroutines)
	}
	var rss []string
	for _, sm := range s.Samples {
		rss = append(rss, fmt.Sprint(sm.RSSKB))
	}
	fmt.Printf("  VmRSS every %s (kB): %s\n", c.interval, strings.Join(rss, " "))
	if err := printTopDelta(os.Stdout, s.Start.File, s.End.File, 8); err != nil {
		return err
	}
	b, _ := json.MarshalIndent(s, "", "  ")
	return os.WriteFile(filepath.Join(c.work, "soak.json"), b, 0o644)
}

// runAll runs the loads side by side and returns their results and the
// first error.
func runAll(ctx context.Context, ls []harness.Load) ([]harness.Result, error) {
	type out struct {
		r   harness.Result
		err error
	}
	ch := make(chan out, len(ls))
	for _, l := range ls {
		go func() {
			r, err := l.Run(ctx)
			ch <- out{r, err}
		}()
	}
	var rs []harness.Result
	var first error
	for range ls {
		o := <-ch
		rs = append(rs, o.r)
		if o.err != nil && first == nil {
			first = o.err
		}
	}
	return rs, first
}

// heapProfile fetches /debug/pprof/heap?gc=1 into file and sums its
// inuse_space and inuse_objects.
func heapProfile(ctx context.Context, file string, pid int) (heap, error) {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(cctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/heap?gc=1", metricsPort), nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return heap{}, fmt.Errorf("heap profile: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return heap{}, fmt.Errorf("heap profile: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return heap{}, fmt.Errorf("heap profile: HTTP %d: %.200s", resp.StatusCode, body)
	}
	if err := os.WriteFile(file, body, 0o644); err != nil {
		return heap{}, err
	}
	p, err := profile.Parse(bytes.NewReader(body))
	if err != nil {
		return heap{}, fmt.Errorf("heap profile: %w", err)
	}
	space, objects := index(p, "inuse_space"), index(p, "inuse_objects")
	if space < 0 || objects < 0 {
		return heap{}, errors.New("heap profile: no inuse_space/inuse_objects sample types")
	}
	h := heap{File: file, RSSKB: harness.VmRSS(pid), Loadavg: harness.Loadavg()}
	for _, smp := range p.Sample {
		h.InuseBytes += smp.Value[space]
		h.InuseObjects += smp.Value[objects]
	}
	m, err := metrics(cctx)
	if err != nil {
		return heap{}, err
	}
	h.HeapInuseBytes, h.Goroutines = int64(m["go_memstats_heap_inuse_bytes"]), int64(m["go_goroutines"])
	return h, nil
}

// metrics reads the unlabelled samples of kadmit's /metrics.
func metrics(ctx context.Context) (map[string]float64, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort), nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(body), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 || strings.HasPrefix(line, "#") || strings.Contains(f[0], "{") {
			continue
		}
		var v float64
		if _, err := fmt.Sscan(f[1], &v); err == nil {
			out[f[0]] = v
		}
	}
	return out, nil
}

func index(p *profile.Profile, typ string) int {
	for i, st := range p.SampleType {
		if st.Type == typ {
			return i
		}
	}
	return -1
}

// printTopDelta prints the n functions holding the most inuse_space (flat,
// by the allocation's innermost frame) at the end, with their value at the
// start: the place to look if anything grows.
func printTopDelta(w io.Writer, startFile, endFile string, n int) error {
	flat := func(file string) (map[string]int64, error) {
		f, err := os.Open(file)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		p, err := profile.Parse(f)
		if err != nil {
			return nil, err
		}
		i := index(p, "inuse_space")
		m := map[string]int64{}
		for _, s := range p.Sample {
			name := "?"
			if len(s.Location) > 0 && len(s.Location[0].Line) > 0 && s.Location[0].Line[0].Function != nil {
				name = s.Location[0].Line[0].Function.Name
			}
			m[name] += s.Value[i]
		}
		return m, nil
	}
	before, err := flat(startFile)
	if err != nil {
		return err
	}
	after, err := flat(endFile)
	if err != nil {
		return err
	}
	names := make([]string, 0, len(after))
	for k := range after {
		names = append(names, k)
	}
	sort.Slice(names, func(i, j int) bool { return after[names[i]] > after[names[j]] })
	fmt.Fprintf(w, "  top inuse_space at the end (flat), start -> end:\n")
	for _, k := range names[:min(n, len(names))] {
		fmt.Fprintf(w, "    %9s -> %9s  %s\n", mib(before[k]), mib(after[k]), k)
	}
	return nil
}

func mib(b int64) string { return fmt.Sprintf("%.2f MiB", float64(b)/(1<<20)) }
