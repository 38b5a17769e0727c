package manifests

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestFiles(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"b.yaml", "a/c.JSON", "a/d.yml", "notes.txt", "e.yaml/f.yaml"} {
		p := filepath.Join(dir, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := Files(dir, nil)
	want := []string{filepath.Join(dir, "a/c.JSON"), filepath.Join(dir, "a/d.yml"), filepath.Join(dir, "b.yaml"), filepath.Join(dir, "e.yaml/f.yaml")}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("Files(dir) = %v, %v; want %v", got, err, want)
	}
	// A file is returned as is, whatever its extension.
	if got, err := Files(filepath.Join(dir, "notes.txt"), nil); err != nil || len(got) != 1 {
		t.Fatalf("Files(file) = %v, %v", got, err)
	}
	// keep filters, and its error stops the walk.
	got, _ = Files(dir, func(p string) (bool, error) { return filepath.Ext(p) == ".yaml", nil })
	if len(got) != 2 {
		t.Fatalf("filtered: %v", got)
	}
	stop := errors.New("too many")
	if _, err := Files(dir, func(string) (bool, error) { return false, stop }); !errors.Is(err, stop) {
		t.Fatalf("keep error: %v", err)
	}
	if _, err := Files(filepath.Join(dir, "missing"), nil); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing path: %v", err)
	}
}
