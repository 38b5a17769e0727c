// Package kadmitproc builds the kadmit binary and runs `kadmit serve` as a
// child process against a control plane, for the end-to-end tests and the
// demo. It exists so both drive kadmit exactly as an operator would: through
// its command line, its readiness endpoint and the webhook configurations it
// registers, never through its Go packages.
package kadmitproc

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/mod/modfile"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kadmit/kadmit/test/poll"
)

// ConfigName is the name of the MutatingWebhookConfiguration and the
// ValidatingWebhookConfiguration `kadmit serve --register` writes.
const ConfigName = "kadmit"

// maxLogLines bounds the log lines kept in memory; older ones are dropped.
const maxLogLines = 20000

// MainModule is the module path of kadmit itself, whose root RepoRoot finds.
const MainModule = "github.com/kadmit/kadmit"

// RepoRoot walks up from the working directory to the root of kadmit's main
// module: the first directory whose go.mod declares MainModule. `go test`
// runs in the package directory and `go run` wherever the user stands, and
// the test module's own go.mod (test/go.mod) sits below the root, so the
// nearest go.mod is not necessarily the one wanted.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("kadmitproc: working directory: %w", err)
	}
	for {
		if data, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && modfile.ModulePath(data) == MainModule {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("kadmitproc: no go.mod of module %s in the working directory or any parent", MainModule)
		}
		dir = parent
	}
}

// Build compiles ./cmd/kadmit of the module at repoRoot into out. The
// compiler's output is part of the error so a broken build explains itself.
func Build(ctx context.Context, repoRoot, out string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "./cmd/kadmit")
	cmd.Dir = repoRoot
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("kadmitproc: go build ./cmd/kadmit: %w\n%s", err, strings.TrimSpace(buf.String()))
	}
	return nil
}

// FreeAddr returns "127.0.0.1:<port>" for a loopback port that was free a
// moment ago, chosen at random below the kernel's ephemeral port range
// (net.ipv4.ip_local_port_range) and at or above minFreePort when the
// range leaves room there. A port the kernel hands out for ":0" is in the
// ephemeral range, and so is the local port of every outgoing connection:
// a control plane's clients (the API server to etcd, a webhook client)
// took such a port before kadmit bound it ("bind: address already in use",
// seen once in CI). Below the range only another listener that names its
// port can; one may still, and callers accept that. Without room below the
// range (or without /proc), the kernel's choice.
func FreeAddr() (string, error) {
	if low, ok := ephemeralLow(); ok && low-minFreePort >= 1000 {
		for range 64 {
			addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(minFreePort+rand.IntN(low-minFreePort)))
			if ln, err := net.Listen("tcp", addr); err == nil {
				_ = ln.Close()
				return addr, nil
			}
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("kadmitproc: find a free loopback port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// minFreePort is the lowest port FreeAddr picks: above the well-known and
// the commonly configured service ports (10250 and the like).
const minFreePort = 20000

// ephemeralLow is the low end of this network namespace's ephemeral port
// range ("32768	60999" in /proc/sys/net/ipv4/ip_local_port_range).
func ephemeralLow() (int, bool) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, false
	}
	low, err := strconv.Atoi(f[0])
	return low, err == nil && low > 0 && low <= 65535
}

// FreeAddrs returns two free loopback addresses for a kadmit process: one
// for admission (--addr) and one for metrics and health (--metrics-addr).
// Another process may take them before kadmit binds; callers accept that.
func FreeAddrs() (addr, metricsAddr string, err error) {
	if addr, err = FreeAddr(); err != nil {
		return "", "", err
	}
	// FreeAddr closes what it tried, so it may pick the same port twice.
	for range 8 {
		if metricsAddr, err = FreeAddr(); err != nil || metricsAddr != addr {
			return addr, metricsAddr, err
		}
	}
	return "", "", fmt.Errorf("kadmitproc: FreeAddr gave %s eight times", addr)
}

// HTTPSClient is a client for kadmit's admission port that trusts only the
// CA certificate in caFile (PEM, as kadmit serve --ca-file writes it), with
// a 30s timeout per request and at most maxIdlePerHost idle connections.
func HTTPSClient(caFile string, maxIdlePerHost int) (*http.Client, error) {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("kadmitproc: read kadmit's CA: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("kadmitproc: no PEM certificate in %s", caFile)
	}
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots}, MaxIdleConnsPerHost: maxIdlePerHost}}, nil
}

// AddrFree reports whether addr (host:port) can be listened on right now.
func AddrFree(addr string) bool {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return false
	}
	_ = ln.Close()
	return true
}

// Options describe one `kadmit serve` process.
type Options struct {
	// Binary is the kadmit executable; required.
	Binary string
	// Addr is the HTTPS admission address (--addr), e.g. 127.0.0.1:9443; required.
	Addr string
	// MetricsAddr is the plain-HTTP metrics and health address
	// (--metrics-addr); required, since readiness is read from it.
	MetricsAddr string
	// CAFile receives the self-signed CA (--ca-file); required.
	CAFile string
	// Kubeconfig, when set, turns on --register with --webhook-url
	// https://<Addr> and --kubeconfig Kubeconfig.
	Kubeconfig string
	// ShutdownGrace, when positive, is passed as --shutdown-grace.
	ShutdownGrace time.Duration
	// ExtraArgs are appended to the command line.
	ExtraArgs []string
	// Args, when set, is the whole command line after the binary (e.g.
	// "serve", "--tls=self-managed", ...), replacing the one Start derives:
	// CAFile, Kubeconfig, ShutdownGrace and ExtraArgs are then ignored. Addr
	// and MetricsAddr are still required and must match the --addr and
	// --metrics-addr in Args, since WebhookURL and WaitReady use them.
	Args []string
	// Log, when set, receives a copy of everything kadmit writes.
	Log io.Writer
}

// Process is a running `kadmit serve`.
type Process struct {
	// Args is the full command line, for messages.
	Args []string
	// WebhookURL is https://<Addr>, the base of the registered URLs.
	WebhookURL string

	opts   Options
	cmd    *exec.Cmd
	logs   *lineBuffer
	exited chan struct{}
	state  *os.ProcessState
}

// Start runs `kadmit serve --self-signed --dns-name 127.0.0.1 --ca-file ...
// --addr ... --metrics-addr ... --log-format json` (plus the --register flags
// when opts.Kubeconfig is set), or `kadmit <opts.Args>` when Args is set. It returns once the process is started, not
// ready: call WaitReady. The process is not tied to ctx, so that the caller
// decides how it ends (Terminate); on Linux it receives SIGTERM should the
// caller die first.
func Start(opts Options) (*Process, error) {
	if opts.Binary == "" || opts.Addr == "" || opts.MetricsAddr == "" || (opts.CAFile == "" && opts.Args == nil) {
		return nil, errors.New("kadmitproc: Binary, Addr, MetricsAddr and CAFile (or Args) are required")
	}
	webhookURL := "https://" + opts.Addr
	args := opts.Args
	if args == nil {
		args = []string{"serve",
			"--self-signed", "--dns-name", "127.0.0.1", "--ca-file", opts.CAFile,
			"--addr", opts.Addr, "--metrics-addr", opts.MetricsAddr,
			"--log-format", "json",
		}
		if opts.Kubeconfig != "" {
			args = append(args, "--register", "--webhook-url", webhookURL, "--kubeconfig", opts.Kubeconfig)
		}
		if opts.ShutdownGrace > 0 {
			args = append(args, "--shutdown-grace", opts.ShutdownGrace.String())
		}
		args = append(args, opts.ExtraArgs...)
	}

	logs := &lineBuffer{tee: opts.Log}
	cmd := exec.Command(opts.Binary, args...)
	cmd.Stdout, cmd.Stderr = logs, logs
	setParentDeathSignal(cmd)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("kadmitproc: start %s: %w", opts.Binary, err)
	}
	p := &Process{
		Args:       append([]string{opts.Binary}, args...),
		WebhookURL: webhookURL,
		opts:       opts,
		cmd:        cmd,
		logs:       logs,
		exited:     make(chan struct{}),
	}
	go func() {
		_ = cmd.Wait()
		p.state = cmd.ProcessState
		logs.flush()
		close(p.exited)
	}()
	return p, nil
}

// PID is the process id.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Exited is closed once the process has ended.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// ExitCode is the exit status once Exited is closed: -1 when a signal killed
// the process, and also -1 while it is still running.
func (p *Process) ExitCode() int {
	select {
	case <-p.exited:
		return p.state.ExitCode()
	default:
		return -1
	}
}

// WaitReady polls http://<MetricsAddr>/readyz until it answers 200. It fails
// when ctx ends or the process exits first; the error carries kadmit's last
// log lines.
func (p *Process) WaitReady(ctx context.Context) error {
	url := "http://" + p.opts.MetricsAddr + "/readyz"
	hc := &http.Client{Timeout: 2 * time.Second}
	err := poll.Until(ctx, 0, func(ctx context.Context) error {
		if err := p.exitErr(); err != nil {
			return poll.Stop(err)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return poll.Stop(fmt.Errorf("readiness request: %w", err))
		}
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(body)))
		}
		return nil
	})
	if err != nil {
		return p.waitErr(url+" not ready", err)
	}
	return nil
}

// WaitRegistered polls until the MutatingWebhookConfiguration and the
// ValidatingWebhookConfiguration named "kadmit" exist, each webhook with a
// caBundle and a URL under p.WebhookURL, and returns them. It fails when ctx
// ends or the process exits first.
func (p *Process) WaitRegistered(ctx context.Context, client kubernetes.Interface) (*admissionregistrationv1.MutatingWebhookConfiguration, *admissionregistrationv1.ValidatingWebhookConfiguration, error) {
	var (
		m *admissionregistrationv1.MutatingWebhookConfiguration
		v *admissionregistrationv1.ValidatingWebhookConfiguration
	)
	err := poll.Until(ctx, 0, func(ctx context.Context) error {
		if err := p.exitErr(); err != nil {
			return poll.Stop(err)
		}
		var err error
		m, v, err = p.registration(ctx, client)
		return err
	})
	if err != nil {
		return nil, nil, p.waitErr(fmt.Sprintf("webhook configurations %q not registered", ConfigName), err)
	}
	return m, v, nil
}

func (p *Process) registration(ctx context.Context, client kubernetes.Interface) (*admissionregistrationv1.MutatingWebhookConfiguration, *admissionregistrationv1.ValidatingWebhookConfiguration, error) {
	reg := client.AdmissionregistrationV1()
	m, err := reg.MutatingWebhookConfigurations().Get(ctx, ConfigName, metav1.GetOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("get MutatingWebhookConfiguration: %w", err)
	}
	v, err := reg.ValidatingWebhookConfigurations().Get(ctx, ConfigName, metav1.GetOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("get ValidatingWebhookConfiguration: %w", err)
	}
	var configs []admissionregistrationv1.WebhookClientConfig
	for _, w := range m.Webhooks {
		configs = append(configs, w.ClientConfig)
	}
	for _, w := range v.Webhooks {
		configs = append(configs, w.ClientConfig)
	}
	if len(configs) == 0 {
		return nil, nil, errors.New("configurations have no webhooks")
	}
	for _, c := range configs {
		if c.URL == nil || !strings.HasPrefix(*c.URL, p.WebhookURL+"/") {
			return nil, nil, fmt.Errorf("a webhook's clientConfig.url is %v, want it under %s", deref(c.URL), p.WebhookURL)
		}
		if len(c.CABundle) == 0 {
			return nil, nil, fmt.Errorf("webhook %s has no caBundle", *c.URL)
		}
	}
	return m, v, nil
}

// ProbePodName is the name WaitEffective dry-runs; it contains "offensive" so
// that kadmit's pod-name webhook denies it.
const ProbePodName = "kadmit-probe-offensive"

// WaitEffective waits until the API server actually calls kadmit's webhooks,
// which lags registration by a few seconds while its informers catch up. It
// dry-runs (nothing is stored) the creation of a pod in namespace: one named
// ProbePodName until the validating pod-name webhook denies it, and one
// plain pod until the mutating lifespan webhook adds its toleration.
func (p *Process) WaitEffective(ctx context.Context, client kubernetes.Interface, namespace string) error {
	pods := client.CoreV1().Pods(namespace)
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	err := poll.Until(ctx, 0, func(ctx context.Context) error {
		if err := p.exitErr(); err != nil {
			return poll.Stop(err)
		}
		_, err := pods.Create(ctx, probePod(ProbePodName), dry)
		// The pod's own name shows up in unrelated errors too; only the
		// policy's message proves the webhook answered.
		switch {
		case err == nil:
			return errors.New("pod-name webhook: offensive probe pod was admitted")
		case !strings.Contains(err.Error(), `pod name contains "offensive"`):
			return fmt.Errorf("pod-name webhook: %w", err)
		}
		got, err := pods.Create(ctx, probePod("kadmit-probe"), dry)
		switch {
		case err != nil:
			return fmt.Errorf("lifespan webhook: %w", err)
		case !hasTolerationKey(got.Spec.Tolerations, "acme.com/lifespan-remaining"):
			return errors.New("lifespan webhook: probe pod got no acme.com/lifespan-remaining toleration")
		}
		return nil
	})
	if err != nil {
		return p.waitErr("webhooks not in effect", err)
	}
	return nil
}

func probePod(name string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "pause", Image: "registry.k8s.io/pause:3.10",
		}}},
	}
}

func hasTolerationKey(ts []corev1.Toleration, key string) bool {
	for _, t := range ts {
		if t.Key == key {
			return true
		}
	}
	return false
}

// exitErr is ErrExited, with the exit code, once the process has ended:
// waiting on it any longer is futile.
func (p *Process) exitErr() error {
	select {
	case <-p.exited:
		return fmt.Errorf("%w with code %d", ErrExited, p.ExitCode())
	default:
		return nil
	}
}

// waitErr reports a failed wait with kadmit's last log lines.
func (p *Process) waitErr(what string, err error) error {
	return fmt.Errorf("kadmitproc: %s: %w; kadmit's last log lines:\n%s", what, err, p.Tail(15))
}

// ErrExited reports that kadmit ended while something waited on it.
var ErrExited = errors.New("kadmit exited")

// Terminate sends SIGTERM, as a kubelet does, and waits up to timeout for the
// process to end; past that it sends SIGKILL and reports the timeout. It
// returns the exit code (-1 when killed by a signal) and how long the exit
// took. Calling it on an ended process just returns its code.
func (p *Process) Terminate(timeout time.Duration) (int, time.Duration, error) {
	start := time.Now()
	select {
	case <-p.exited:
		return p.ExitCode(), 0, nil
	default:
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return -1, 0, fmt.Errorf("kadmitproc: SIGTERM pid %d: %w", p.PID(), err)
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.exited:
		return p.ExitCode(), time.Since(start), nil
	case <-t.C:
	}
	_ = p.cmd.Process.Kill()
	select {
	case <-p.exited:
	case <-time.After(5 * time.Second):
		// Only an unkillable (D-state) process gets here; report it rather
		// than hang the caller.
		return -1, time.Since(start), fmt.Errorf("kadmitproc: pid %d survived SIGKILL", p.PID())
	}
	return p.ExitCode(), time.Since(start), fmt.Errorf("kadmitproc: pid %d did not exit within %s of SIGTERM; killed", p.PID(), timeout)
}

// Kill sends SIGKILL, as when a node or container dies without warning, and
// waits up to 5s for the process to end. Calling it on an ended process is a
// no-op.
func (p *Process) Kill() error {
	select {
	case <-p.exited:
		return nil
	default:
	}
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("kadmitproc: SIGKILL pid %d: %w", p.PID(), err)
	}
	select {
	case <-p.exited:
		return nil
	case <-time.After(5 * time.Second):
		return fmt.Errorf("kadmitproc: pid %d survived SIGKILL", p.PID())
	}
}

// Logs returns every line kadmit has written so far (up to the last 20000).
func (p *Process) Logs() []string { return p.logs.snapshot() }

// Tail returns kadmit's last n log lines joined by newlines.
func (p *Process) Tail(n int) string {
	lines := p.logs.snapshot()
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Decision is one "admission decision" log line of kadmit's JSON log.
type Decision struct {
	Time      string `json:"time"`
	Webhook   string `json:"webhook"` // the path, e.g. /validate-pod
	UID       string `json:"uid"`
	Kind      string `json:"kind"`
	Object    string `json:"object"` // namespace/name or name
	Operation string `json:"operation"`
	Allowed   bool   `json:"allowed"`
	Policy    string `json:"policy"`
	Code      int    `json:"code"`
	Message   string `json:"message"`
	Patched   bool   `json:"patched"`
	// Latency is kept raw: slog's JSON handler writes a duration as
	// nanoseconds, its text handler as a string.
	Latency json.RawMessage `json:"latency"`
}

// LatencyString renders Latency for people.
func (d Decision) LatencyString() string {
	var ns int64
	if err := json.Unmarshal(d.Latency, &ns); err == nil {
		return time.Duration(ns).Round(10 * time.Microsecond).String()
	}
	var s string
	if err := json.Unmarshal(d.Latency, &s); err == nil {
		return s
	}
	return string(d.Latency)
}

// Decisions parses the "admission decision" lines logged so far; other lines
// are skipped. kadmit samples allowed decisions past 10 a second per webhook
// by default: start it with --log-allowed-sample=1 (or --log-level debug)
// to count every one.
func (p *Process) Decisions() []Decision {
	var out []Decision
	for _, l := range p.logs.snapshot() {
		if !strings.Contains(l, `"admission decision"`) {
			continue
		}
		var d struct {
			Msg string `json:"msg"`
			Decision
		}
		if err := json.Unmarshal([]byte(l), &d); err != nil || d.Msg != "admission decision" {
			continue
		}
		out = append(out, d.Decision)
	}
	return out
}

// lineBuffer collects a process's output as lines, keeping the most recent
// maxLogLines, and copies it to tee.
type lineBuffer struct {
	mu      sync.Mutex
	tee     io.Writer
	partial []byte
	lines   []string
}

func (b *lineBuffer) Write(data []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.tee != nil {
		// A failing copy must not block or kill kadmit's output pipe.
		_, _ = b.tee.Write(data)
	}
	b.partial = append(b.partial, data...)
	for {
		i := bytes.IndexByte(b.partial, '\n')
		if i < 0 {
			break
		}
		b.add(string(b.partial[:i]))
		b.partial = b.partial[i+1:]
	}
	return len(data), nil
}

func (b *lineBuffer) add(line string) {
	b.lines = append(b.lines, line)
	if len(b.lines) > maxLogLines {
		b.lines = append([]string(nil), b.lines[len(b.lines)-maxLogLines:]...)
	}
}

func (b *lineBuffer) flush() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.partial) > 0 {
		b.add(string(b.partial))
		b.partial = nil
	}
}

func (b *lineBuffer) snapshot() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.lines...)
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}
