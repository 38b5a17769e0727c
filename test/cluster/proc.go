package cluster

import (
	"bytes"
	"context"

	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kadmit/kadmit/test/poll"
)

// proc is one process the cluster started, with its log file. When it runs
// inside a node's PID namespace, cmd is nsenter (which forks, so the
// component is nsenter's child) and pid is the component's own PID in the
// host's namespace: signals go to pid, and cmd.Wait returns when it exits.
type proc struct {
	name string
	cmd  *exec.Cmd
	pid  int
	log  string
	done chan struct{}
	err  error // valid after done is closed
}

// startProc starts argv with its output in logDir/name.log.
func startProc(logDir, name string, argv []string, env []string) (*proc, error) {
	logPath := filepath.Join(logDir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("cluster: log for %s: %w", name, err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	// Its own process group, so a ^C to the test does not reach the
	// components before Stop ends them in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("cluster: start %s (%s): %w", name, argv[0], err)
	}
	p := &proc{name: name, cmd: cmd, pid: cmd.Process.Pid, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// childOf waits (up to timeout) for the only child of pid to appear and
// returns its PID: nsenter --pid and unshare --fork fork once and wait.
func childOf(pid int, timeout time.Duration) (int, error) {
	deadline := time.Now().Add(timeout)
	path := fmt.Sprintf("/proc/%d/task/%d/children", pid, pid)
	for {
		data, err := os.ReadFile(path)
		if err == nil {
			if f := strings.Fields(string(data)); len(f) > 0 {
				return strconv.Atoi(f[0])
			}
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("cluster: process %d forked no child within %s", pid, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM to the component, waits up to grace, then SIGKILL.
func (p *proc) stop(grace time.Duration) {
	if p == nil || p.exited() {
		return
	}
	_ = syscall.Kill(p.pid, syscall.SIGTERM)
	select {
	case <-p.done:
		return
	case <-time.After(grace):
	}
	_ = syscall.Kill(p.pid, syscall.SIGKILL)
	if p.pid != p.cmd.Process.Pid {
		_ = p.cmd.Process.Kill()
	}
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
	}
}

// tail returns the last n lines of the process's log.
func (p *proc) tail(n int) string { return logTail(p.log, n) }

func logTail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	lines := bytes.Split(bytes.TrimRight(data, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// runBound bounds a command run with a context that has no deadline.
const runBound = 60 * time.Second

// run runs a command and returns its combined output, with the command line
// in the error. It ends at ctx's deadline, or after runBound when ctx has
// none (a kubectl drain waiting out disruption budgets and preStop hooks
// takes longer than a minute: its caller gives ctx the deadline it needs).
func run(ctx context.Context, argv ...string) (string, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, runBound)
		defer cancel()
	}
	out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("cluster: %s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// wait is poll.Until bounded by ctx alone, with what it waited for named
// in the error.
func wait(ctx context.Context, what string, cond func(context.Context) error) error {
	if err := poll.Until(ctx, 0, cond); err != nil {
		return fmt.Errorf("cluster: %s: %w", what, err)
	}
	return nil
}
