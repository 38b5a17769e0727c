// Package proc runs kadmit as a child process with an exact command line
// and environment, as a kubelet would start the rendered container: the
// shared kadmitproc helper takes no environment, and every replica here
// needs its own POD_NAME from the downward API.
package proc

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Process is one running kadmit.
type Process struct {
	Name        string
	Args        []string
	Env         []string
	Addr        string // HTTPS admission address
	MetricsAddr string

	cmd    *exec.Cmd
	mu     sync.Mutex
	out    bytes.Buffer
	exited chan struct{}
	code   int
}

// Start runs binary with args and env (which replaces the environment,
// except PATH and HOME so Go's runtime and the user cache resolve).
func Start(name, binary string, args, env []string, addr, metricsAddr string, tee io.Writer) (*Process, error) {
	p := &Process{Name: name, Args: args, Env: env, Addr: addr, MetricsAddr: metricsAddr, exited: make(chan struct{})}
	p.cmd = exec.Command(binary, args...)
	p.cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}, env...)
	var w io.Writer = &lockedWriter{p: p}
	if tee != nil {
		w = io.MultiWriter(w, tee)
	}
	p.cmd.Stdout, p.cmd.Stderr = w, w
	// A test that dies must not leave kadmit running.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		_ = p.cmd.Wait()
		p.code = p.cmd.ProcessState.ExitCode()
		close(p.exited)
	}()
	return p, nil
}

type lockedWriter struct{ p *Process }

func (w *lockedWriter) Write(b []byte) (int, error) {
	w.p.mu.Lock()
	defer w.p.mu.Unlock()
	return w.p.out.Write(b)
}

// Output is everything the process wrote so far.
func (p *Process) Output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// Tail is the last n lines of Output.
func (p *Process) Tail(n int) string {
	lines := strings.Split(strings.TrimRight(p.Output(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Exited is closed when the process ended.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// ExitCode is valid once Exited is closed.
func (p *Process) ExitCode() int { <-p.exited; return p.code }

// Terminate sends SIGTERM (as the kubelet does after preStop) and waits up
// to timeout, then SIGKILLs. It returns the exit code.
func (p *Process) Terminate(timeout time.Duration) (int, error) {
	select {
	case <-p.exited:
		return p.code, nil
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		return p.code, nil
	case <-time.After(timeout):
		_ = p.cmd.Process.Kill()
		<-p.exited
		return p.code, fmt.Errorf("%s did not exit within %s of SIGTERM; killed", p.Name, timeout)
	}
}

// Ready GETs /readyz once.
func (p *Process) Ready(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.MetricsAddr+"/readyz", nil)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Timeout: 2 * time.Second}).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 2048))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("readyz %d: %s", resp.StatusCode, strings.TrimSpace(string(body)))
	}
	return nil
}

// Metrics GETs /metrics.
func (p *Process) Metrics(ctx context.Context) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.MetricsAddr+"/metrics", nil)
	if err != nil {
		return "", err
	}
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// ServedLeaf handshakes with the HTTPS listener and returns the leaf it
// serves; verification is the caller's (it compares with the Secret).
func (p *Process) ServedLeaf(ctx context.Context, serverName string) (*x509.Certificate, error) {
	d := tls.Dialer{Config: &tls.Config{ServerName: serverName, InsecureSkipVerify: true}} //nolint:gosec // compared by the caller
	dctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	c, err := d.DialContext(dctx, "tcp", p.Addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	st := c.(*tls.Conn).ConnectionState()
	if len(st.PeerCertificates) == 0 {
		return nil, errors.New("no certificate served")
	}
	return st.PeerCertificates[0], nil
}
