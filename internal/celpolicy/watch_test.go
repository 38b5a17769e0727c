package celpolicy

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// An edit of a policy file is reported once it settles; an unchanged
// rewrite is not.
func TestWatch(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "p.yaml")
	if err := os.WriteFile(f, []byte("a: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	changes := make(chan struct{}, 10)
	done := make(chan struct{})
	go func() {
		defer close(done)
		Watch(ctx, []string{dir}, time.Hour, func() { changes <- struct{}{} })
	}()
	time.Sleep(200 * time.Millisecond) // let the watch be set up
	if err := os.WriteFile(f, []byte("a: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "q.yaml"), []byte("b: 2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changes:
	case <-time.After(20 * time.Second):
		t.Fatal("no change reported")
	}
	select {
	case <-changes:
		t.Fatal("one edit reported twice")
	case <-time.After(2 * debounce):
	}
	cancel()
	<-done
}
