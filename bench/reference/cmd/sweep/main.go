// Command sweep is `make bench-sweep`: how kadmit's cost grows. kadmit runs
// on 127.0.0.1 pinned to CPU 0 and `kadmit bench` on CPU 1 (when taskset
// exists and there are two CPUs), every run bounded by -d:
//
//   - object size: a pod with a padding annotation, 1 KB to 1 MB, on
//     /validate-pod and /mutate-pod, seed profile, -c 64;
//   - concurrency: 1 to 256 clients, the default 4.6 KB pod, /mutate-pod;
//   - profiles: the seed policies plus colocation with N profiles
//     (N = 0, 1, 5, 10, 25, 50), all of them matching the bench pod or none
//     of them, /mutate-pod, -c 64; kadmit is restarted with a new
//     configuration for each N.
//
// It prints Markdown tables (with the load average of each point), writes
// results.json and SVG plots of throughput and p99 against each dimension.
// With -replot FILE it only redraws the plots from a results.json.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"kadmit.local/bench/reference/internal/harness"
	"kadmit.local/bench/reference/internal/plot"
)

const (
	httpsPort   = 19453
	metricsPort = 18090
)

type config struct {
	kadmit, work, plots string
	duration            time.Duration
	profileDuration     time.Duration
	only                []string
	pin                 bool
}

// Point is one measured run.
type Point struct {
	Sweep string // size, concurrency or profiles
	// X is the size in bytes, the clients, or the number of profiles.
	X        int
	Series   string // e.g. "validate", "mutate", "all match", "none match"
	Path     string
	Conc     int
	Result   harness.Result
	RSSKB    int64 // peak VmRSS during the run
	Loadavg  string
	Duration string
}

// Results is results.json.
type Results struct {
	Machine      string
	Pinned       bool
	LoadavgStart string
	LoadavgEnd   string
	Points       []Point
}

func main() {
	var c config
	var only, replot string
	flag.StringVar(&c.kadmit, "kadmit", "bin/kadmit", "kadmit binary")
	flag.StringVar(&c.work, "work", "bin/sweep", "directory for certificates, configurations, logs, results.json")
	flag.StringVar(&c.plots, "plots", "", "directory for the SVG plots (default: -work)")
	flag.DurationVar(&c.duration, "duration", 3*time.Second, "length of each size and concurrency run (1s..1m)")
	flag.DurationVar(&c.profileDuration, "profile-duration", 5*time.Second, "length of each profiles run (1s..1m)")
	flag.StringVar(&only, "only", "size,concurrency,profiles", "sweeps to run, comma-separated")
	flag.StringVar(&replot, "replot", "", "only redraw the plots from this results.json")
	flag.Parse()
	if c.plots == "" {
		c.plots = c.work
	}
	if replot != "" {
		var r Results
		b, err := os.ReadFile(replot)
		if err == nil {
			err = json.Unmarshal(b, &r)
		}
		if err == nil {
			printTables(os.Stdout, r)
			err = writePlots(c.plots, r)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "sweep:", err)
			os.Exit(1)
		}
		return
	}
	for _, d := range []time.Duration{c.duration, c.profileDuration} {
		if d < time.Second || d > time.Minute {
			fmt.Fprintln(os.Stderr, "sweep: -duration and -profile-duration must be 1s..1m")
			os.Exit(2)
		}
	}
	c.only = strings.Split(only, ",")
	c.pin = harness.CanPin()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, c)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "sweep:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, c config) error {
	if err := os.MkdirAll(c.work, 0o755); err != nil {
		return err
	}
	if err := os.MkdirAll(c.plots, 0o755); err != nil {
		return err
	}
	r := Results{Machine: fmt.Sprintf("%d CPUs, %s", runtime.NumCPU(), runtime.Version()), Pinned: c.pin, LoadavgStart: harness.Loadavg()}
	fmt.Printf("sweep: %s, pinning %v, load average at start %s\n", r.Machine, c.pin, r.LoadavgStart)
	if slices.Contains(c.only, "size") || slices.Contains(c.only, "concurrency") {
		ps, err := sizeAndConcurrency(ctx, c)
		r.Points = append(r.Points, ps...)
		if err != nil {
			return err
		}
	}
	if slices.Contains(c.only, "profiles") {
		ps, err := profiles(ctx, c)
		r.Points = append(r.Points, ps...)
		if err != nil {
			return err
		}
	}
	r.LoadavgEnd = harness.Loadavg()
	fmt.Printf("load average at end %s\n\n", r.LoadavgEnd)
	printTables(os.Stdout, r)
	b, _ := json.MarshalIndent(r, "", "  ")
	if err := os.WriteFile(filepath.Join(c.work, "results.json"), b, 0o644); err != nil {
		return err
	}
	return writePlots(c.plots, r)
}

// server is a kadmit started for a sweep.
type server struct {
	proc *harness.Proc
	ca   string
}

// startKadmit starts kadmit with config file cfg ("" for the seed profile)
// and waits until it accepts TLS.
func startKadmit(ctx context.Context, c config, cfg, logName string) (*server, error) {
	ca := filepath.Join(c.work, "kadmit-ca.crt")
	_ = os.Remove(ca)
	argv := []string{c.kadmit, "serve", "--self-signed", "--dns-name", "127.0.0.1", "--ca-file", ca,
		"--addr", fmt.Sprintf("127.0.0.1:%d", httpsPort), "--metrics-addr", fmt.Sprintf("127.0.0.1:%d", metricsPort)}
	if cfg != "" {
		argv = append(argv, "--config", cfg)
	}
	logf, err := os.Create(filepath.Join(c.work, logName))
	if err != nil {
		return nil, err
	}
	p, err := harness.Start(harness.Pinned(c.pin, 0, argv), logf)
	_ = logf.Close() // the child has its own descriptor
	if err != nil {
		return nil, err
	}
	if err := p.WaitTLS(ctx, ca, httpsPort); err != nil {
		p.Stop()
		return nil, fmt.Errorf("%s: %w", logName, err)
	}
	return &server{proc: p, ca: ca}, nil
}

func (s *server) load(ctx context.Context, c config, path, manifest string, conc int, d time.Duration) (Point, error) {
	var peak int64
	l := harness.Load{Kadmit: c.kadmit, URL: fmt.Sprintf("https://127.0.0.1:%d%s", httpsPort, path), CAFile: s.ca,
		Manifest: manifest, Conc: conc, Duration: d, Pin: c.pin,
		Sample: func() { peak = max(peak, harness.VmRSS(s.proc.PID())) }}
	la := harness.Loadavg()
	res, err := l.Run(ctx)
	return Point{Path: path, Conc: conc, Result: res, RSSKB: peak, Loadavg: la, Duration: d.String()}, err
}

func sizeAndConcurrency(ctx context.Context, c config) ([]Point, error) {
	s, err := startKadmit(ctx, c, "", "kadmit-seed.log")
	if err != nil {
		return nil, err
	}
	defer s.proc.Stop()
	if _, err := s.load(ctx, c, "/mutate-pod", "", 64, 2*time.Second); err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	var out []Point
	if slices.Contains(c.only, "size") {
		for _, size := range []int{1 << 10, 10 << 10, 100 << 10, 1 << 20} {
			manifest, err := paddedPod(c.work, size)
			if err != nil {
				return out, err
			}
			for _, sr := range []struct{ name, path string }{{"validate", "/validate-pod"}, {"mutate", "/mutate-pod"}} {
				if ctx.Err() != nil {
					return out, ctx.Err()
				}
				p, err := s.load(ctx, c, sr.path, manifest, 64, c.duration)
				p.Sweep, p.X, p.Series = "size", size, sr.name
				out = append(out, p)
				if err != nil {
					return out, fmt.Errorf("size %d %s: %w", size, sr.path, err)
				}
				progress(p)
			}
		}
	}
	if slices.Contains(c.only, "concurrency") {
		for _, conc := range []int{1, 4, 16, 64, 256} {
			if ctx.Err() != nil {
				return out, ctx.Err()
			}
			p, err := s.load(ctx, c, "/mutate-pod", "", conc, c.duration)
			p.Sweep, p.X, p.Series = "concurrency", conc, "mutate"
			out = append(out, p)
			if err != nil {
				return out, fmt.Errorf("concurrency %d: %w", conc, err)
			}
			progress(p)
		}
	}
	return out, nil
}

// paddedPod writes a pod of exactly size bytes of JSON: a minimal pod with
// an annotation padding it out.
func paddedPod(dir string, size int) (string, error) {
	const frame = `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"d","annotations":{"pad":"%s"}},"spec":{"containers":[{"name":"c","image":"i"}]}}`
	pad := size - (len(frame) - 2)
	if pad < 0 {
		return "", fmt.Errorf("size %d is below the minimal pod", size)
	}
	file := filepath.Join(dir, fmt.Sprintf("pod-%d.json", size))
	return file, os.WriteFile(file, []byte(fmt.Sprintf(frame, strings.Repeat("x", pad))), 0o644)
}

// profileCounts are the numbers of colocation profiles measured; 0 is the
// seed profile alone (colocation disabled).
var profileCounts = []int{0, 1, 5, 10, 25, 50}

// colocationConfig returns a configuration with the seed policies and
// colocation enabled with n profiles. Each profile sets one label and one
// toleration of its own; with match, its selector is team=payments (a label
// of the default bench pod), else team=nobody-<i>, which no pod has.
func colocationConfig(n int, match bool) string {
	var b strings.Builder
	b.WriteString("apiVersion: kadmit.io/v1alpha1\nkind: Configuration\npolicies:\n")
	if n == 0 {
		b.WriteString("  colocation: {enabled: false}\n")
		return b.String()
	}
	b.WriteString("  colocation:\n    enabled: true\n    profiles:\n")
	for i := range n {
		team := "payments"
		if !match {
			team = fmt.Sprintf("nobody-%d", i)
		}
		fmt.Fprintf(&b, "    - name: p%d\n      selector: {matchLabels: {team: %s}}\n", i, team)
		fmt.Fprintf(&b, "      labels: {colocation.kadmit.io/p%d: \"true\"}\n", i)
		fmt.Fprintf(&b, "      tolerations: [{key: colocation-p%d, operator: Exists, effect: NoSchedule}]\n", i)
	}
	return b.String()
}

func profiles(ctx context.Context, c config) ([]Point, error) {
	var out []Point
	for _, n := range profileCounts {
		for _, match := range []bool{true, false} {
			if n == 0 && !match {
				continue // the seed profile has no profiles to match
			}
			if ctx.Err() != nil {
				return out, ctx.Err()
			}
			series := map[bool]string{true: "all match", false: "none match"}[match]
			if n == 0 {
				series = "seed only"
			}
			cfg := filepath.Join(c.work, fmt.Sprintf("colocation-%d-%v.yaml", n, match))
			if err := os.WriteFile(cfg, []byte(colocationConfig(n, match)), 0o644); err != nil {
				return out, err
			}
			p, err := profileRun(ctx, c, cfg, n, match)
			p.Sweep, p.X, p.Series = "profiles", n, series
			out = append(out, p)
			if err != nil {
				return out, fmt.Errorf("%d profiles (%s): %w", n, series, err)
			}
			progress(p)
		}
	}
	return out, nil
}

func profileRun(ctx context.Context, c config, cfg string, n int, match bool) (Point, error) {
	s, err := startKadmit(ctx, c, cfg, fmt.Sprintf("kadmit-profiles-%d-%v.log", n, match))
	if err != nil {
		return Point{}, err
	}
	defer s.proc.Stop()
	if _, err := s.load(ctx, c, "/mutate-pod", "", 64, time.Second); err != nil {
		return Point{}, fmt.Errorf("warm-up: %w", err)
	}
	return s.load(ctx, c, "/mutate-pod", "", 64, c.profileDuration)
}

func progress(p Point) {
	fmt.Printf("  %-12s %8d %-10s %8.0f req/s  p50 %8.2f ms  p99 %8.2f ms  load %s\n",
		p.Sweep, p.X, p.Series, p.Result.RPS, p.Result.P50, p.Result.P99, p.Loadavg)
}

func load1(la string) string { return strings.Fields(la + " ")[0] }

func sizeLabel(b float64) string {
	switch {
	case b >= 1<<20:
		return fmt.Sprintf("%g MB", b/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%g KB", b/(1<<10))
	default:
		return fmt.Sprintf("%g B", b)
	}
}

func points(r Results, sweep string) []Point {
	var out []Point
	for _, p := range r.Points {
		if p.Sweep == sweep {
			out = append(out, p)
		}
	}
	return out
}

func find(ps []Point, x int, series string) *Point {
	for i := range ps {
		if ps[i].X == x && ps[i].Series == series {
			return &ps[i]
		}
	}
	return nil
}

func xs(ps []Point) []int {
	var out []int
	for _, p := range ps {
		if !slices.Contains(out, p.X) {
			out = append(out, p.X)
		}
	}
	slices.Sort(out)
	return out
}

// printTables prints one Markdown table per sweep that has points.
func printTables(w io.Writer, r Results) {
	cell := func(p *Point) string {
		if p == nil {
			return " | | "
		}
		p99 := fmt.Sprintf("%.0f", p.Result.P99)
		if p.Result.P99 < 10 {
			p99 = fmt.Sprintf("%.1f", p.Result.P99)
		}
		return fmt.Sprintf("%s | %.1f | %s", comma(p.Result.RPS), p.Result.P50, p99)
	}
	if ps := points(r, "size"); len(ps) > 0 {
		fmt.Fprintln(w, "Object size (pod with a padding annotation; -c 64):")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| size | validate req/s | p50 ms | p99 ms | mutate req/s | p50 ms | p99 ms | load avg (1 min) |")
		fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- | --- | --- |")
		for _, x := range xs(ps) {
			v, m := find(ps, x, "validate"), find(ps, x, "mutate")
			la := ""
			if v != nil {
				la = load1(v.Loadavg)
			}
			if m != nil {
				la += "–" + load1(m.Loadavg)
			}
			fmt.Fprintf(w, "| %s | %s | %s | %s |\n", sizeLabel(float64(x)), cell(v), cell(m), la)
		}
		fmt.Fprintln(w)
	}
	if ps := points(r, "concurrency"); len(ps) > 0 {
		fmt.Fprintln(w, "Concurrency (default 4.6 KB pod, /mutate-pod):")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| clients | req/s | p50 ms | p99 ms | load avg (1 min) |")
		fmt.Fprintln(w, "| --- | --- | --- | --- | --- |")
		for _, x := range xs(ps) {
			p := find(ps, x, "mutate")
			fmt.Fprintf(w, "| %d | %s | %s |\n", x, cell(p), load1(p.Loadavg))
		}
		fmt.Fprintln(w)
	}
	if ps := points(r, "profiles"); len(ps) > 0 {
		fmt.Fprintln(w, "Colocation profiles (seed policies + colocation with N profiles; default pod, /mutate-pod, -c 64):")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| profiles | all match: req/s | p50 ms | p99 ms | none match: req/s | p50 ms | p99 ms | load avg (1 min) |")
		fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- | --- | --- |")
		for _, x := range xs(ps) {
			a, n := find(ps, x, "all match"), find(ps, x, "none match")
			label := fmt.Sprint(x)
			if x == 0 {
				a, label = find(ps, 0, "seed only"), "0 (seed only)"
			}
			la := load1(a.Loadavg)
			if n != nil {
				la += "–" + load1(n.Loadavg)
			}
			fmt.Fprintf(w, "| %s | %s | %s | %s |\n", label, cell(a), cell(n), la)
		}
		fmt.Fprintln(w)
	}
}

func comma(v float64) string {
	s := fmt.Sprintf("%.0f", v)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// writePlots writes one SVG per sweep with a throughput and a p99 panel.
func writePlots(dir string, r Results) error {
	la := func(ps []Point) string {
		lo, hi := "", ""
		for _, p := range ps {
			l := load1(p.Loadavg)
			if lo == "" || l < lo {
				lo = l
			}
			if l > hi {
				hi = l
			}
		}
		return fmt.Sprintf("%s; load average %s–%s during the runs (2 vCPUs, noisy)", r.Machine, lo, hi)
	}
	series := func(ps []Point, names []string, y func(Point) float64) []plot.Series {
		var out []plot.Series
		for _, n := range names {
			s := plot.Series{Name: n}
			for _, p := range ps {
				if p.Series == n || (n != "seed only" && p.Series == "seed only") {
					s.Points = append(s.Points, plot.Point{X: float64(p.X), Y: y(p)})
				}
			}
			if len(s.Points) > 0 {
				out = append(out, s)
			}
		}
		return out
	}
	rps := func(p Point) float64 { return p.Result.RPS }
	p99 := func(p Point) float64 { return p.Result.P99 }
	var figs []struct {
		file string
		fig  plot.Figure
	}
	if ps := points(r, "size"); len(ps) > 0 {
		var ticks []float64
		for _, x := range xs(ps) {
			ticks = append(ticks, float64(x))
		}
		names := []string{"validate (/validate-pod)", "mutate (/mutate-pod)"}
		for i := range ps {
			ps[i].Series = map[string]string{"validate": names[0], "mutate": names[1]}[ps[i].Series]
		}
		figs = append(figs, struct {
			file string
			fig  plot.Figure
		}{"size.svg", plot.Figure{
			Title: "kadmit: cost against object size (64 clients, seed profile)", Note: la(ps),
			Panels: []plot.Panel{
				{Title: "throughput", XLabel: "AdmissionReview object size", YLabel: "requests/s", LogX: true, LogY: true, XTicks: ticks, XTickLabel: sizeLabel, Series: series(ps, names, rps)},
				{Title: "p99 latency", XLabel: "AdmissionReview object size", YLabel: "p99 ms", LogX: true, LogY: true, XTicks: ticks, XTickLabel: sizeLabel, Series: series(ps, names, p99)},
			},
		}})
	}
	if ps := points(r, "concurrency"); len(ps) > 0 {
		var ticks []float64
		for _, x := range xs(ps) {
			ticks = append(ticks, float64(x))
		}
		names := []string{"mutate (/mutate-pod)"}
		for i := range ps {
			ps[i].Series = names[0]
		}
		figs = append(figs, struct {
			file string
			fig  plot.Figure
		}{"concurrency.svg", plot.Figure{
			Title: "kadmit: cost against concurrency (4.6 KB pod, seed profile)", Note: la(ps),
			Panels: []plot.Panel{
				{Title: "throughput", XLabel: "concurrent clients", YLabel: "requests/s", LogX: true, XTicks: ticks, Series: series(ps, names, rps)},
				{Title: "p99 latency", XLabel: "concurrent clients", YLabel: "p99 ms", LogX: true, LogY: true, XTicks: ticks, Series: series(ps, names, p99)},
			},
		}})
	}
	if ps := points(r, "profiles"); len(ps) > 0 {
		// 1 is measured but not labelled: it would overlap 0.
		ticks := []float64{0, 5, 10, 25, 50}
		names := []string{"all profiles match the pod", "no profile matches"}
		for i := range ps {
			if s, ok := map[string]string{"all match": names[0], "none match": names[1]}[ps[i].Series]; ok {
				ps[i].Series = s
			}
		}
		figs = append(figs, struct {
			file string
			fig  plot.Figure
		}{"profiles.svg", plot.Figure{
			Title: "kadmit: cost against colocation profiles (/mutate-pod, 64 clients)", Note: la(ps),
			Panels: []plot.Panel{
				{Title: "throughput", XLabel: "colocation profiles (0 = seed policies only)", YLabel: "requests/s", XTicks: ticks, Series: series(ps, names, rps)},
				{Title: "p99 latency", XLabel: "colocation profiles (0 = seed policies only)", YLabel: "p99 ms", XTicks: ticks, Series: series(ps, names, p99)},
			},
		}})
	}
	for _, f := range figs {
		file := filepath.Join(dir, f.file)
		out, err := os.Create(file)
		if err != nil {
			return err
		}
		err = f.fig.WriteSVG(out)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
		fmt.Println("wrote", file)
	}
	return nil
}
