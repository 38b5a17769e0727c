package controlplane

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestDefaultDirHonoursEnv(t *testing.T) {
	t.Setenv(EnvDir, "/opt/cp")
	got, err := DefaultDir()
	if err != nil || got != "/opt/cp" {
		t.Fatalf("DefaultDir() = %q, %v; want /opt/cp", got, err)
	}
	t.Setenv(EnvDir, "")
	t.Setenv("HOME", "/home/x")
	got, err = DefaultDir()
	if want := filepath.Join("/home/x", ".cache", "kadmit", "controlplane", KubeVersion); err != nil || got != want {
		t.Fatalf("DefaultDir() = %q, %v; want %q", got, err, want)
	}
}

func TestFindBinaries(t *testing.T) {
	dir := t.TempDir()
	_, err := FindBinaries(dir)
	if !errors.Is(err, ErrBinariesMissing) {
		t.Fatalf("empty dir: err = %v; want ErrBinariesMissing", err)
	}
	if !strings.Contains(err.Error(), "make controlplane") {
		t.Errorf("error %q does not tell the user to run make controlplane", err)
	}

	write := func(name string, mode os.FileMode) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\n"), mode); err != nil {
			t.Fatal(err)
		}
	}
	write(APIServerBinary, 0o755)
	write(EtcdBinary, 0o644)
	if _, err := FindBinaries(dir); !errors.Is(err, ErrBinariesMissing) || !strings.Contains(err.Error(), "not executable") {
		t.Fatalf("non-executable etcd: err = %v; want ErrBinariesMissing naming it not executable", err)
	}
	// WriteFile would keep the existing file's mode; set it directly.
	if err := os.Chmod(filepath.Join(dir, EtcdBinary), 0o755); err != nil {
		t.Fatal(err)
	}
	if got, err := FindBinaries(dir); err != nil || got != dir {
		t.Fatalf("FindBinaries = %q, %v; want %q, nil", got, err, dir)
	}
}

// A control plane whose processes exit at once is tried on new environments a
// bounded number of times, each attempt named in the output, and the error
// says how many.
func TestStartRetriesOnFreshEnvironmentsThenGivesUp(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{APIServerBinary, EtcdBinary} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\necho exiting at once >&2\nexit 1\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	out := &lockedBuilder{}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cp, err := Start(ctx, Options{Dir: dir, Output: out, StartTimeout: 10 * time.Second})
	if err == nil {
		_ = cp.Stop()
		t.Fatal("Start succeeded with binaries that exit at once")
	}
	if !strings.Contains(err.Error(), fmt.Sprintf("%d attempts", startAttempts)) {
		t.Errorf("error %q does not say how many attempts were made", err)
	}
	if got := strings.Count(out.String(), "controlplane: start attempt "); got != 2*startAttempts {
		t.Errorf("output has %d attempt lines, want %d (a header and a failure per attempt):\n%s", got, 2*startAttempts, out.String())
	}
	if !strings.Contains(out.String(), "exiting at once") {
		t.Errorf("the processes' own output is missing:\n%s", out.String())
	}
}

// lockedBuilder collects output that several process pipes write at once.
type lockedBuilder struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuilder) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuilder) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
