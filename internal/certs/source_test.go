package certs

import (
	"crypto/tls"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kadmit/kadmit/pkg/webhookcerts"
)

func issue(t *testing.T, now time.Time) *tls.Certificate {
	t.Helper()
	b, err := NewSelfSigned(SelfSignedOptions{IPs: []net.IP{net.ParseIP("127.0.0.1")}, Now: now, ServerValidity: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	c, err := b.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestHolderEmpty(t *testing.T) {
	var h webhookcerts.Holder
	if c, err := h.GetCertificate(&tls.ClientHelloInfo{}); c != nil || !errors.Is(err, webhookcerts.ErrNoCertificate) {
		t.Fatalf("GetCertificate = %v, %v", c, err)
	}
	if err := h.Check(time.Now()); !errors.Is(err, webhookcerts.ErrNoCertificate) {
		t.Fatalf("Check = %v", err)
	}
	if h.Current() != nil {
		t.Fatal("Current is not nil")
	}
	// A certificate without Leaf cannot be checked.
	h.Set(&tls.Certificate{})
	if err := h.Check(time.Now()); !errors.Is(err, webhookcerts.ErrNoCertificate) {
		t.Fatalf("Check without Leaf = %v", err)
	}
}

func TestHolderCheck(t *testing.T) {
	now := time.Now()
	var h webhookcerts.Holder

	h.Set(issue(t, now))
	if err := h.Check(now); err != nil {
		t.Fatalf("fresh certificate: %v", err)
	}

	// Issued two days ago for one day: expired.
	h.Set(issue(t, now.Add(-48*time.Hour)))
	err := h.Check(now)
	if err == nil || !strings.HasPrefix(err.Error(), "serving certificate expired at ") {
		t.Fatalf("expired: %v", err)
	}
	if want := h.Current().Leaf.NotAfter.UTC().Format(time.RFC3339); !strings.HasSuffix(err.Error(), want) {
		t.Fatalf("expired: %v, want the expiry %s", err, want)
	}

	// Issued for two days from now (valid from 1h before that): not yet valid.
	h.Set(issue(t, now.Add(48*time.Hour)))
	err = h.Check(now)
	if err == nil || !strings.HasPrefix(err.Error(), "serving certificate not valid before ") {
		t.Fatalf("not yet valid: %v", err)
	}
	if err := h.Check(now.Add(48 * time.Hour)); err != nil {
		t.Fatalf("at its issue time: %v", err)
	}
}

func TestHolderSwap(t *testing.T) {
	var h webhookcerts.Holder
	a, b := issue(t, time.Now()), issue(t, time.Now())
	h.Set(a)
	if got, err := h.GetCertificate(nil); err != nil || got != a {
		t.Fatalf("GetCertificate = %p, %v; want %p", got, err, a)
	}
	h.Set(b)
	if got, err := h.GetCertificate(nil); err != nil || got != b || h.Current() != b {
		t.Fatalf("after swap: %p, %v; want %p", got, err, b)
	}
	// Concurrent readers always see one of the two certificates, never a
	// torn value (run with -race).
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				c, err := h.GetCertificate(nil)
				if err != nil || (c != a && c != b) {
					t.Errorf("read %p, %v", c, err)
					return
				}
				_ = h.Check(time.Now())
			}
		}()
	}
	for i := range 200 {
		if i%2 == 0 {
			h.Set(a)
		} else {
			h.Set(b)
		}
	}
	close(stop)
	wg.Wait()
}

func TestLoadDir(t *testing.T) {
	b, err := NewSelfSigned(SelfSignedOptions{DNSNames: []string{"kadmit.ns.svc"}})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "tls.crt"), b.ServerCert, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadDir(dir); err == nil || !strings.Contains(err.Error(), "read serving key") || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing tls.key: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.key"), b.ServerKey, 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if c.Leaf == nil || c.Leaf.DNSNames[0] != "kadmit.ns.svc" {
		t.Fatalf("leaf %+v", c.Leaf)
	}
	var h webhookcerts.Holder
	h.Set(c)
	if err := h.Check(time.Now()); err != nil {
		t.Fatal(err)
	}

	// A key that is not the certificate's names the directory.
	other, err := NewSelfSigned(SelfSignedOptions{DNSNames: []string{"x"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.key"), other.ServerKey, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadDir(dir); err == nil || !strings.HasPrefix(err.Error(), dir+": ") {
		t.Fatalf("mismatched pair: %v", err)
	}

	empty := t.TempDir()
	if _, err := LoadDir(empty); err == nil || !strings.Contains(err.Error(), "read serving certificate") || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing tls.crt: %v", err)
	}
}
