package kadmitproc

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestLineBufferSplitsAcrossWrites(t *testing.T) {
	var tee strings.Builder
	b := &lineBuffer{tee: &tee}
	for _, chunk := range []string{"one\ntw", "o\n", "thr", "ee"} {
		if _, err := b.Write([]byte(chunk)); err != nil {
			t.Fatal(err)
		}
	}
	b.flush()
	if got := strings.Join(b.snapshot(), "|"); got != "one|two|three" {
		t.Fatalf("lines = %q; want one|two|three", got)
	}
	if tee.String() != "one\ntwo\nthree" {
		t.Fatalf("tee = %q", tee.String())
	}
}

func TestLineBufferKeepsTheLatest(t *testing.T) {
	b := &lineBuffer{}
	for i := range maxLogLines + 10 {
		fmt.Fprintf(b, "%d\n", i)
	}
	lines := b.snapshot()
	if len(lines) != maxLogLines || lines[0] != "10" {
		t.Fatalf("kept %d lines starting at %q; want %d starting at 10", len(lines), lines[0], maxLogLines)
	}
}

func TestDecisions(t *testing.T) {
	p := &Process{logs: &lineBuffer{}}
	fmt.Fprintln(p.logs, `{"time":"t","level":"INFO","msg":"serving admission webhooks"}`)
	fmt.Fprintln(p.logs, `{"time":"t","level":"INFO","msg":"admission decision","webhook":"/validate-pod","uid":"u","kind":"Pod","object":"default/offensive-pod","operation":"CREATE","http":200,"latency":160000,"allowed":false,"policy":"pod-name","code":403,"message":"pod name contains \"offensive\""}`)
	fmt.Fprintln(p.logs, `not json mentioning "admission decision"`)
	ds := p.Decisions()
	if len(ds) != 1 {
		t.Fatalf("got %d decisions; want 1: %+v", len(ds), ds)
	}
	d := ds[0]
	if d.Webhook != "/validate-pod" || d.Object != "default/offensive-pod" || d.Allowed || d.Code != 403 || d.LatencyString() != "160µs" {
		t.Fatalf("decision = %+v (latency %s)", d, d.LatencyString())
	}
}

func TestRepoRootSkipsNestedModules(t *testing.T) {
	root := t.TempDir()
	nested := filepath.Join(root, "test", "e2e")
	if err := os.MkdirAll(nested, 0o755); err != nil {
		t.Fatal(err)
	}
	for dir, mod := range map[string]string{root: MainModule, filepath.Join(root, "test"): MainModule + "/test"} {
		if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module "+mod+"\n\ngo 1.26.0\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Chdir(nested)
	got, err := RepoRoot()
	if err != nil || got != root {
		t.Fatalf("RepoRoot() = %q, %v; want %q", got, err, root)
	}
	t.Chdir(t.TempDir())
	if _, err := RepoRoot(); err == nil {
		t.Fatal("RepoRoot() outside any kadmit module succeeded")
	}
}

// FreeAddr picks ports below the ephemeral range, where outgoing
// connections never take them, and each can be listened on.
func TestFreeAddrBelowEphemeralRange(t *testing.T) {
	low, ok := ephemeralLow()
	if !ok || low-minFreePort < 1000 {
		t.Skipf("no room below the ephemeral range (low end %d, ok %v)", low, ok)
	}
	seen := map[string]bool{}
	for range 20 {
		addr, err := FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		_, port, _ := net.SplitHostPort(addr)
		n, err := strconv.Atoi(port)
		if err != nil || n < minFreePort || n >= low {
			t.Fatalf("FreeAddr %s: want a port in [%d, %d)", addr, minFreePort, low)
		}
		if !AddrFree(addr) {
			t.Fatalf("FreeAddr %s: cannot listen on it", addr)
		}
		seen[addr] = true
	}
	if len(seen) < 10 {
		t.Fatalf("20 calls gave %d addresses: not random", len(seen))
	}
}
