package certs

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kadmit/kadmit/internal/testkit"
	"github.com/kadmit/kadmit/pkg/webhookcerts"
)

// pair issues a serving pair for 127.0.0.1 and its CA, in PEM.
func pair(t *testing.T) (certPEM, keyPEM, caPEM []byte) {
	t.Helper()
	now := time.Now()
	ca, caKey, err := webhookcerts.NewCA(now, 24*time.Hour, webhookcerts.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err = webhookcerts.IssueServing(ca, caKey, nil, []net.IP{net.ParseIP("127.0.0.1")}, now, time.Hour, webhookcerts.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	return certPEM, keyPEM, webhookcerts.EncodeCertificates(ca)
}

// writeAtomic replaces path by a rename, as cert-manager's and kubelet's
// writers do (no write event on the old file).
func writeAtomic(t *testing.T, path string, data []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// servedLeaf serves holder on loopback and returns the certificate a new
// TLS handshake receives.
func servedLeaf(t *testing.T, h *webhookcerts.Holder) func() *x509.Certificate {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{GetCertificate: h.GetCertificate, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				_ = c.(*tls.Conn).Handshake()
				c.Close()
			}()
		}
	}()
	return func() *x509.Certificate {
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", ln.Addr().String(), &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // the test reads the served certificate, it does not trust it
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0]
	}
}

// In files mode a rotated tls.crt/tls.key and ca.crt, replaced after start
// by rename (the directory's fsnotify event), are served in the next TLS
// handshake and returned as the CA bundle within a bound; the poll is an
// hour, so only the event can have reloaded them.
func TestFilesSourceReloadsOnEvent(t *testing.T) {
	dir := t.TempDir()
	c1, k1, ca1 := pair(t)
	writeAtomic(t, filepath.Join(dir, "tls.crt"), c1)
	writeAtomic(t, filepath.Join(dir, "tls.key"), k1)
	writeAtomic(t, filepath.Join(dir, "ca.crt"), ca1)
	reloads := make(chan struct{}, 16)
	s, err := NewFilesSource(FilesOptions{Dir: dir, BundleFile: filepath.Join(dir, "ca.crt"), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		OnReload: func(*tls.Certificate) { reloads <- struct{}{} }})
	if err != nil {
		t.Fatal(err)
	}
	s.w.Poll = time.Hour
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	leaf := servedLeaf(t, s.Holder())
	first := leaf()
	if want, _ := webhookcerts.ParseCertificates(c1); !first.Equal(want[0]) {
		t.Fatal("not serving tls.crt at start")
	}
	// Let the watch start before rotating (Run adds the watch in its own
	// goroutine).
	time.Sleep(100 * time.Millisecond)

	c2, k2, ca2 := pair(t)
	// Key first, then certificate: the mismatched moment in between is
	// refused and retried at the next event.
	writeAtomic(t, filepath.Join(dir, "tls.key"), k2)
	writeAtomic(t, filepath.Join(dir, "tls.crt"), c2)
	writeAtomic(t, filepath.Join(dir, "ca.crt"), ca2)
	want, _ := webhookcerts.ParseCertificates(c2)
	testkit.Eventually(t, 5*time.Second, "rotated tls.crt served in a new handshake", func() bool { return leaf().Equal(want[0]) })
	testkit.Eventually(t, 5*time.Second, "rotated ca.crt returned as the bundle", func() bool { return string(s.CABundle()) == string(ca2) })
	if len(reloads) < 2 {
		t.Fatalf("OnReload called %d times, want the start and the rotation", len(reloads))
	}
}

// A change no event in the directory reports (a file replaced behind a
// symlink in a subdirectory, as a projected volume's "..data" target can
// be on some filesystems) is caught by the poll.
func TestDirWatcherReloadsOnPoll(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatal(err)
	}
	c1, k1, _ := pair(t)
	writeAtomic(t, filepath.Join(data, "tls.crt"), c1)
	writeAtomic(t, filepath.Join(data, "tls.key"), k1)
	for _, f := range []string{"tls.crt", "tls.key"} {
		if err := os.Symlink(filepath.Join("data", f), filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	var h webhookcerts.Holder
	w := &DirWatcher{Dir: dir, Holder: &h, Poll: 50 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if err := w.Load(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go w.Run(ctx)
	leaf := servedLeaf(t, &h)
	time.Sleep(100 * time.Millisecond)
	c2, k2, _ := pair(t)
	// In-place writes inside data/: events there only, and data/ is not
	// watched.
	if err := os.WriteFile(filepath.Join(data, "tls.key"), k2, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(data, "tls.crt"), c2, 0o600); err != nil {
		t.Fatal(err)
	}
	want, _ := webhookcerts.ParseCertificates(c2)
	testkit.Eventually(t, 5*time.Second, "certificate changed behind a symlink served after a poll", func() bool { return leaf().Equal(want[0]) })
}
