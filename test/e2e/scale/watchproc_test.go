package scale

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kadmit/kadmit/test/controlplane/kadmitproc"
	"github.com/kadmit/kadmit/test/e2e/e2eenv"
	"github.com/kadmit/kadmit/test/poll"
	"github.com/kadmit/kadmit/test/procstat"
)

// watchProc is a running `kadmit watch`.
type watchProc struct {
	cmd     *exec.Cmd
	metrics string // http://addr
	log     string
	exited  chan struct{}
	// synced is how long after its start the watch logged that its
	// informers had synced, and syncedPeak its peak RSS (VmHWM) then, as
	// sampled while waiting for it to be ready (within poll.Interval).
	synced     time.Duration
	syncedPeak int64
}

// startWatch runs `kadmit watch` with args on the control plane, leader
// election in kadmit-system, metrics on a free loopback port and its log
// in Tmp/watch.log; it stops (SIGTERM, then SIGKILL after 10s) when the
// test ends. It returns once /readyz answers 200 and the replica leads,
// waiting at most ready.
func startWatch(t *testing.T, e *e2eenv.Env, ready time.Duration, args ...string) *watchProc {
	t.Helper()
	ctx := e2eenv.TestCtx(t, ready+time.Minute)
	if _, err := e.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kadmit-system"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	addr, err := kadmitproc.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	p := &watchProc{metrics: "http://" + addr, log: filepath.Join(e.Tmp, "watch.log"), exited: make(chan struct{})}
	logf, err := os.Create(p.log)
	if err != nil {
		t.Fatal(err)
	}
	p.cmd = exec.Command(e.Binary, append([]string{"watch", "--kubeconfig", e.Kubeconfig, "--metrics-addr", addr, "--namespace", "kadmit-system",
		"--identity", "watch-scale", "--log-format", "text"}, args...)...)
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	go func() { _ = p.cmd.Wait(); logf.Close(); close(p.exited) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.exited
			t.Errorf("kadmit watch did not stop within 10s of SIGTERM")
		}
		if t.Failed() {
			b, _ := os.ReadFile(p.log)
			lines := strings.Split(string(b), "\n")
			t.Logf("watch log (last 40 lines):\n%s", strings.Join(lines[max(0, len(lines)-40):], "\n"))
		}
	})
	err = poll.Until(ctx, ready, func(ctx context.Context) error {
		select {
		case <-p.exited:
			return poll.Stop(fmt.Errorf("kadmit watch exited: %v", p.cmd.ProcessState))
		default:
		}
		if p.synced == 0 {
			if b, err := os.ReadFile(p.log); err == nil && strings.Contains(string(b), "informers synced") {
				p.synced = time.Since(start)
				p.syncedPeak, _ = procstat.Status(p.cmd.Process.Pid, "VmHWM")
			}
		}
		if code, _, err := get(ctx, p.metrics+"/readyz"); err != nil || code != http.StatusOK {
			return fmt.Errorf("readyz: %d %v", code, err)
		}
		body, err := p.scrape(ctx)
		if err != nil {
			return err
		}
		if v, ok := metric(body, "kadmit_watch_leader"); !ok || v != 1 {
			return fmt.Errorf("kadmit_watch_leader = %v (present %v)", v, ok)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("kadmit watch not ready and leading: %v", err)
	}
	return p
}

func get(ctx context.Context, url string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	return resp.StatusCode, string(b), err
}

func (p *watchProc) scrape(ctx context.Context) (string, error) {
	code, body, err := get(ctx, p.metrics+"/metrics")
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("/metrics: HTTP %d", code)
	}
	return body, err
}

// metric returns the value of the first sample of name (a series without
// labels) in the text exposition format.
func metric(body, name string) (float64, bool) {
	for line := range strings.SplitSeq(body, "\n") {
		if !strings.HasPrefix(line, name+" ") && !strings.HasPrefix(line, name+"{") {
			continue
		}
		f, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		return f, err == nil
	}
	return 0, false
}

// count returns the number of samples of name.
func count(body, name string) int {
	n := 0
	for line := range strings.SplitSeq(body, "\n") {
		if strings.HasPrefix(line, name+"{") || strings.HasPrefix(line, name+" ") {
			n++
		}
	}
	return n
}
