package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"kadmit.local/bench/reference/internal/harness"
)

// The scaling phase answers two questions the pinned one-core table cannot:
// does the server's CPU per request stay flat when it gets a second core,
// and how far is its tail latency from the bare server's at the same
// concurrency. Every server runs unpinned with GOMAXPROCS 1, then 2, so
// that the core count is the only difference between the two; the load
// generator (GOMAXPROCS 1) shares the machine's cores with it, which is
// why each point is repeated and reported as the median with its range.
// CPU per request is the server's user plus system time over the run
// (/proc/PID/stat) divided by the answers: the figure least sensitive to
// a load generator on the same cores.

// scalePoint is one measured run of the scaling phase.
type scalePoint struct {
	Server, Path string
	Procs, Conc  int
	Rep          int
	RPS          float64
	P99          float64 // milliseconds
	CPUPerReq    float64 // microseconds of server CPU per answer
}

// scaleConcurrencies are the loads of the tail comparison: the default c
// and the in-flight cap's size.
var scaleConcurrencies = []int{64, 256}

// measureScaling runs kadmit's validate and mutate paths and the bare
// server at GOMAXPROCS 1 and 2, each concurrency of scaleConcurrencies,
// c.reps times, alternating servers and core counts within each
// repetition so that slow drift of the machine spreads over all of them.
func measureScaling(ctx context.Context, c config, kadmit, bare server) ([]scalePoint, error) {
	type target struct {
		s     server
		runs  []run
		label []string
	}
	targets := []target{
		{kadmit, []run{{pathValidate, "/validate-pod", c.pod}, {pathMutate, "/mutate-pod", c.pod}}, nil},
		{bare, []run{{barePod, "/", c.pod}}, nil},
	}
	var out []scalePoint
	for rep := range c.reps {
		for _, procs := range []int{1, 2} {
			for _, t := range targets {
				pts, err := scaleServer(ctx, c, t.s, t.runs, procs, rep)
				if err != nil {
					return out, fmt.Errorf("%s, GOMAXPROCS %d: %w", t.s.name, procs, err)
				}
				out = append(out, pts...)
			}
		}
	}
	return out, nil
}

// scaleServer starts s unpinned with GOMAXPROCS procs and measures each
// run at each concurrency.
func scaleServer(ctx context.Context, c config, s server, runs []run, procs, rep int) ([]scalePoint, error) {
	logf, err := os.Create(filepath.Join(c.work, fmt.Sprintf("%s-scaling-%d.log", s.name, procs)))
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	if strings.HasPrefix(s.name, "kadmit") {
		_ = os.Remove(s.caFile)
	}
	argv := append([]string{"env", fmt.Sprintf("GOMAXPROCS=%d", procs)}, s.args...)
	proc, err := startReady(ctx, s, argv, logf)
	if err != nil {
		return nil, err
	}
	defer proc.Stop()
	pid := proc.PID()
	var out []scalePoint
	for _, r := range runs {
		for _, conc := range scaleConcurrencies {
			if _, err := scaleLoad(ctx, c, s, r, conc, time.Second); err != nil {
				return out, fmt.Errorf("warm-up: %w", err)
			}
			cpu0, err := harness.CPUTime(pid)
			if err != nil {
				return out, err
			}
			res, err := scaleLoad(ctx, c, s, r, conc, c.scaleDuration)
			if err != nil {
				return out, fmt.Errorf("%s c=%d: %w", r.label, conc, err)
			}
			cpu1, err := harness.CPUTime(pid)
			if err != nil {
				return out, err
			}
			p := scalePoint{Server: s.name, Path: r.label, Procs: procs, Conc: conc, Rep: rep, RPS: res.RPS, P99: res.P99}
			if res.Requests > 0 {
				p.CPUPerReq = float64((cpu1 - cpu0).Microseconds()) / float64(res.Requests)
			}
			fmt.Printf("  %-8s %-22s GOMAXPROCS %d c=%-3d rep %d %9.0f req/s  p99 %7.2f ms  %6.1f µs CPU/req\n",
				s.name, r.label, procs, conc, rep+1, p.RPS, p.P99, p.CPUPerReq)
			out = append(out, p)
		}
	}
	return out, nil
}

// scaleLoad is one unpinned `kadmit bench` run with GOMAXPROCS 1; every
// answer must be allowed, as in load.
func scaleLoad(ctx context.Context, c config, s server, r run, conc int, d time.Duration) (harness.Result, error) {
	res, err := harness.Load{Kadmit: c.kadmit, URL: fmt.Sprintf("https://127.0.0.1:%d%s", s.port, r.path), CAFile: s.caFile,
		Manifest: r.manifest, Conc: conc, Duration: d, GOMAXPROCS: 1}.Run(ctx)
	if err == nil && (res.Denied > 0 || res.Allowed != res.Requests) {
		err = fmt.Errorf("%s: %d of %d answers allowed, %d denied; want every one allowed", r.path, res.Allowed, res.Requests, res.Denied)
	}
	return res, err
}

// spread is the median and range of one figure over the repetitions.
type spread struct{ Median, Min, Max float64 }

func spreadOf(xs []float64) spread {
	if len(xs) == 0 {
		return spread{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return spread{Median: m, Min: s[0], Max: s[len(s)-1]}
}

func (s spread) String(format string) string {
	return fmt.Sprintf(format+" ("+format+"–"+format+")", s.Median, s.Min, s.Max)
}

// pick collects one figure of the points matching server, path, procs and
// conc over the repetitions.
func pick(pts []scalePoint, server, path string, procs, conc int, f func(scalePoint) float64) []float64 {
	var out []float64
	for _, p := range pts {
		if p.Server == server && p.Path == path && p.Procs == procs && p.Conc == conc {
			out = append(out, f(p))
		}
	}
	return out
}

// printScaling prints the scaling table (medians and ranges over the
// repetitions) and returns the scaling targets for printTargets.
func printScaling(w io.Writer, pts []scalePoint, reps int) []target {
	type row struct{ server, path string }
	rows := []row{{"kadmit", pathValidate}, {"kadmit", pathMutate}, {"bare", barePod}}
	fmt.Fprintf(w, "Scaling: unpinned, GOMAXPROCS 1 and 2, load generator on the same cores; median (min–max) of %d runs\n", reps)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "server\tpath\tGOMAXPROCS\tc\treq/s\tp99 ms\tCPU µs/req\t")
	for _, r := range rows {
		for _, procs := range []int{1, 2} {
			for _, conc := range scaleConcurrencies {
				rps := spreadOf(pick(pts, r.server, r.path, procs, conc, func(p scalePoint) float64 { return p.RPS }))
				p99 := spreadOf(pick(pts, r.server, r.path, procs, conc, func(p scalePoint) float64 { return p.P99 }))
				cpu := spreadOf(pick(pts, r.server, r.path, procs, conc, func(p scalePoint) float64 { return p.CPUPerReq }))
				fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\t\n", r.server, r.path, procs, conc, rps.String("%.0f"), p99.String("%.1f"), cpu.String("%.1f"))
			}
		}
	}
	_ = tw.Flush()

	var ts []target
	for _, path := range []string{pathValidate, pathMutate} {
		// CPU per request at c=64: two cores against one, medians.
		one := spreadOf(pick(pts, "kadmit", path, 1, 64, func(p scalePoint) float64 { return p.CPUPerReq })).Median
		two := spreadOf(pick(pts, "kadmit", path, 2, 64, func(p scalePoint) float64 { return p.CPUPerReq })).Median
		if one > 0 {
			ts = append(ts, target{name: path + ": CPU per request, 2 cores / 1 core (c=64)", got: two / one, want: 1.1, atMost: true, format: "%.2f"})
		}
		for _, procs := range []int{1, 2} {
			for _, conc := range scaleConcurrencies {
				k := spreadOf(pick(pts, "kadmit", path, procs, conc, func(p scalePoint) float64 { return p.P99 })).Median
				b := spreadOf(pick(pts, "bare", barePod, procs, conc, func(p scalePoint) float64 { return p.P99 })).Median
				if b > 0 {
					ts = append(ts, target{name: fmt.Sprintf("%s: p99 / bare's, %d core(s), c=%d", path, procs, conc), got: k / b, want: 1.5, atMost: true, format: "%.2f"})
				}
			}
		}
	}
	return ts
}
