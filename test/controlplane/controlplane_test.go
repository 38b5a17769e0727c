package controlplane

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
