package main

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kadmit/kadmit/pkg/webhookcerts"

	"github.com/kadmit/kadmit/internal/certs"
)

// rotationBound is how long a rotated certificate in files mode may take to
// reach a new TLS handshake (fsnotify on the directory; the 10 s poll is the
// fallback, not waited for here).
const rotationBound = 3 * time.Second

// writePair writes a fresh pair for 127.0.0.1 into dir by rename, as
// cert-manager and the kubelet replace files, and returns its leaf.
func writePair(t *testing.T, dir string) *x509.Certificate {
	t.Helper()
	b, err := certs.NewSelfSigned(certs.SelfSignedOptions{IPs: []net.IP{net.ParseIP("127.0.0.1")}})
	if err != nil {
		t.Fatal(err)
	}
	// Key first: the moment with a new key and the old certificate is a
	// mismatched pair, which kadmit must refuse and then retry.
	for _, f := range []struct {
		name string
		data []byte
	}{{"tls.key", b.ServerKey}, {"tls.crt", b.ServerCert}, {"ca.crt", b.CACert}} {
		tmp := filepath.Join(dir, "."+f.name+".tmp")
		if err := os.WriteFile(tmp, f.data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, f.name)); err != nil {
			t.Fatal(err)
		}
	}
	leaf, err := webhookcerts.ParseCertificates(b.ServerCert)
	if err != nil {
		t.Fatal(err)
	}
	return leaf[0]
}

// TestHostileFilesRotation runs `kadmit serve --tls=files` and rotates
// tls.crt/tls.key/ca.crt after start, three times: each new certificate
// must be served in a new TLS handshake within rotationBound, with no
// restart, and each load logged.
func TestHostileFilesRotation(t *testing.T) {
	dir := t.TempDir()
	first := writePair(t, dir)
	addr, metrics := freePort(t), freePort(t)
	logPath := filepath.Join(t.TempDir(), "kadmit.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	bin, args := os.Args[0], []string{"serve", "--tls=files", "--cert-dir=" + dir, "--ca-bundle-file=" + filepath.Join(dir, "ca.crt"),
		"--addr=" + addr, "--metrics-addr=" + metrics, "--log-format=json"}
	if external != "" {
		bin = external
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "KADMIT_HOSTILE_EXEC=1")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); logFile.Close(); close(done) }()
	t.Cleanup(func() {
		select {
		case <-done:
		default:
			_ = cmd.Process.Kill()
			<-done
		}
	})
	logs := func() string { b, _ := os.ReadFile(logPath); return string(tail(b, 4000)) }
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if resp, err := http.Get("http://" + metrics + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("kadmit not ready after 20s:\n%s", logs())
		}
	}
	served := func() *x509.Certificate {
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // reads the served certificate
		if err != nil {
			t.Fatalf("handshake: %v\n%s", err, logs())
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0]
	}
	if !served().Equal(first) {
		t.Fatal("not serving tls.crt at start")
	}
	for round := range 3 {
		want := writePair(t, dir)
		start := time.Now()
		for !served().Equal(want) {
			if time.Since(start) > rotationBound {
				t.Fatalf("round %d: rotated certificate not served after %s\n%s", round, rotationBound, logs())
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Logf("round %d: rotated certificate served in a new handshake after %s", round, time.Since(start).Round(time.Millisecond))
	}
	select {
	case <-done:
		t.Fatalf("kadmit exited\n%s", logs())
	default:
	}
	time.Sleep(300 * time.Millisecond) // the log writer flushes every 100 ms
	// Counted over the whole log: the reload failures logged while the
	// pair is half-written (cert and key are renamed one by one) can push
	// the start's line out of logs()'s tail.
	all, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(all), `"msg":"serving certificate loaded"`); n < 4 {
		t.Errorf("%d certificate loads logged, want the start and 3 rotations\n%s", n, logs())
	}
}
