// Package harness is what the bench programs (benchrun, sweep, soak) share:
// starting a server on 127.0.0.1 in its own process group, optionally pinned
// to a CPU, waiting until it accepts TLS, loading it with `kadmit bench`
// (always bounded by -d), and reading VmRSS and the load average.
package harness

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// CanPin reports whether servers and load can be pinned to different CPUs
// (taskset exists and there are two CPUs or more).
func CanPin() bool {
	_, err := exec.LookPath("taskset")
	return err == nil && runtime.NumCPU() >= 2
}

// Pinned prefixes argv with `taskset -c cpu` when pin is true.
func Pinned(pin bool, cpu int, argv []string) []string {
	if !pin {
		return argv
	}
	return append([]string{"taskset", "-c", strconv.Itoa(cpu)}, argv...)
}

// Proc is a server started by Start.
type Proc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// Start starts argv in its own process group with stdout and stderr going
// to log (nil: discarded). Call Stop, always.
func Start(argv []string, log io.Writer) (*Proc, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &Proc{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	return p, nil
}

// PID is the server's pid (taskset execs the server, so it is the same).
func (p *Proc) PID() int { return p.cmd.Process.Pid }

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Stop sends SIGTERM to the process group, then SIGKILL after 10s, and waits.
func (p *Proc) Stop() {
	pgid := p.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-p.done
	}
}

// WaitTLS polls a TLS handshake to 127.0.0.1:port for up to 60s, once
// caFile exists (kadmit writes it at start-up).
func (p *Proc) WaitTLS(ctx context.Context, caFile string, port int) error {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			return errors.New("server exited during start-up; see its log")
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		if _, err := os.Stat(caFile); err == nil {
			d := &net.Dialer{Timeout: time.Second}
			conn, err := tls.DialWithDialer(d, "tcp", fmt.Sprintf("127.0.0.1:%d", port), &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // readiness probe only
			if err == nil {
				conn.Close()
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return errors.New("not accepting TLS connections after 60s")
}

// Load is one `kadmit bench` run.
type Load struct {
	Kadmit   string // kadmit binary
	URL      string // https://127.0.0.1:PORT/PATH
	CAFile   string
	Manifest string // -f; empty: the default pod
	Conc     int
	Duration time.Duration
	Pin      bool // pin to CPU 1
	// GOMAXPROCS, when positive, is the load generator's GOMAXPROCS.
	GOMAXPROCS int
	// Sample, when set, is called every second while the run lasts.
	Sample func()
}

// Result is what a run measured.
type Result struct {
	Requests   int64
	RPS        float64
	P50, P99   float64 // milliseconds
	P999       float64
	Errors     int64
	ErrorKinds map[string]int64 `json:",omitempty"`
	// Allowed and Denied count the correct answers by response.allowed,
	// so a caller can check each answer's decision, not only its form.
	Allowed, Denied int64
	// GenCPU is the load generator's own user plus system CPU time over
	// the run; GenCPU / Duration near the cores it may use means the
	// generator, not the server, set the pace.
	GenCPU time.Duration
}

// benchJSON is the part of `kadmit bench -o json` read here.
type benchJSON struct {
	Requests   int64            `json:"requests"`
	Errors     map[string]int64 `json:"errors"`
	Allowed    int64            `json:"allowed"`
	Denied     int64            `json:"denied"`
	Throughput float64          `json:"throughput_rps"`
	Latency    struct {
		P50  float64 `json:"p50"`
		P99  float64 `json:"p99"`
		P999 float64 `json:"p999"`
	} `json:"latency_ms"`
}

// Run runs l; the bench bounds itself with -d, and a context deadline one
// minute later guards against a hang. An error is returned, with the
// result, when any request failed.
func (l Load) Run(ctx context.Context) (Result, error) {
	argv := []string{l.Kadmit, "bench", "--url", l.URL, "--cacert", l.CAFile,
		"-c", strconv.Itoa(l.Conc), "-d", l.Duration.String(), "-o", "json"}
	if l.Manifest != "" {
		argv = append(argv, "-f", l.Manifest)
	}
	argv = Pinned(l.Pin, 1, argv)
	cctx, cancel := context.WithTimeout(ctx, l.Duration+time.Minute)
	defer cancel()
	cmd := exec.CommandContext(cctx, argv[0], argv[1:]...)
	if l.GOMAXPROCS > 0 {
		cmd.Env = append(os.Environ(), "GOMAXPROCS="+strconv.Itoa(l.GOMAXPROCS))
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		return Result{}, err
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	if l.Sample != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(time.Second)
			defer t.Stop()
			for {
				select {
				case <-stop:
					return
				case <-t.C:
					l.Sample()
				}
			}
		}()
	}
	err := cmd.Wait()
	close(stop)
	wg.Wait()
	var b benchJSON
	if jerr := json.Unmarshal(stdout.Bytes(), &b); jerr != nil {
		return Result{}, fmt.Errorf("kadmit bench: %v: %s", err, strings.TrimSpace(stderr.String()))
	}
	res := Result{Requests: b.Requests, RPS: b.Throughput, P50: b.Latency.P50, P99: b.Latency.P99, P999: b.Latency.P999,
		Allowed: b.Allowed, Denied: b.Denied}
	if ps := cmd.ProcessState; ps != nil {
		res.GenCPU = ps.UserTime() + ps.SystemTime()
	}
	for _, n := range b.Errors {
		res.Errors += n
	}
	if res.Errors > 0 {
		res.ErrorKinds = b.Errors
	}
	if err != nil || res.Errors > 0 {
		return res, fmt.Errorf("kadmit bench reported errors %v (%v)", b.Errors, err)
	}
	return res, nil
}

// VmRSS returns the process's resident set size in KiB from
// /proc/PID/status, or 0 when unavailable.
func VmRSS(pid int) int64 {
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

// Loadavg returns the 1, 5 and 15 minute load averages, "unknown" when
// /proc/loadavg is unreadable.
func Loadavg() string {
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

// Load1 returns the 1-minute load average, 0 when unknown.
func Load1() float64 {
	v, _ := strconv.ParseFloat(strings.Fields(Loadavg() + " ")[0], 64)
	return v
}

// TailWriter keeps the last Max bytes written to it (a server's log that
// would otherwise grow by one line per request).
type TailWriter struct {
	Max int
	mu  sync.Mutex
	buf []byte
}

func (t *TailWriter) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.Max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

// Bytes returns a copy of what is kept.
func (t *TailWriter) Bytes() []byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]byte(nil), t.buf...)
}

// userHZ is the unit of /proc/PID/stat's utime and stime: USER_HZ, 100 on
// every Linux architecture Go supports (sysconf(_SC_CLK_TCK)).
const userHZ = 100

// CPUTime returns the user plus system CPU time the process has used, from
// fields 14 and 15 of /proc/PID/stat (after the parenthesised command,
// which may contain spaces), or an error when it is unreadable.
func CPUTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseStatCPU(string(b))
}

func parseStatCPU(stat string) (time.Duration, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, errors.New("/proc/PID/stat: no command field")
	}
	// After ") ": state is field 3, utime 14, stime 15.
	f := strings.Fields(stat[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/PID/stat: %d fields after the command, want 13 or more", len(f))
	}
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/PID/stat: %w", err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}
