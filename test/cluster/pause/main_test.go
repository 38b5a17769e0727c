package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestReap: exited children are zombies until reap collects them all.
func TestReap(t *testing.T) {
	var pids []int
	for range 3 {
		cmd := exec.Command("true")
		if err := cmd.Start(); err != nil {
			t.Skip("no true(1):", err)
		}
		pids = append(pids, cmd.Process.Pid) // never Waited: left to reap
	}
	time.Sleep(200 * time.Millisecond)
	for _, pid := range pids {
		if st := state(pid); st != "Z" {
			t.Fatalf("child %d in state %q before reap, want a zombie", pid, st)
		}
	}
	reap()
	for _, pid := range pids {
		if st := state(pid); st != "" {
			t.Errorf("child %d in state %q after reap", pid, st)
		}
	}
}

// state is the one-letter state of pid from /proc, "" when it is gone.
func state(pid int) string {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return ""
	}
	s := string(b)
	return strings.Fields(s[strings.LastIndexByte(s, ')')+1:])[0]
}

// TestProgram builds the program, waits for its ready file and stops it
// with SIGTERM: exit status 0.
func TestProgram(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the program")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "pause")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		ready := filepath.Join(dir, "ready-"+sig.String())
		cmd := exec.Command(bin, "-ready-file", ready)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			if _, err := os.Stat(ready); err == nil {
				break
			} else if !errors.Is(err, os.ErrNotExist) || time.Now().After(deadline) {
				cmd.Process.Kill()
				t.Fatalf("ready file: %v", err)
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err := cmd.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
		if err := cmd.Wait(); err != nil {
			t.Errorf("after %s: %v, want exit 0", sig, err)
		}
	}
}
