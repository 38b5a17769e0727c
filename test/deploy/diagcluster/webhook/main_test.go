package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kadmit/kadmit/pkg/webhookcerts"
)

func TestAdmitAllowsAReview(t *testing.T) {
	body := `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u-1","operation":"CREATE"}}`
	rec := httptest.NewRecorder()
	admit(rec, httptest.NewRequest(http.MethodPost, "/validate", strings.NewReader(body)))
	var got review
	if err := json.NewDecoder(rec.Body).Decode(&got); err != nil || rec.Code != http.StatusOK {
		t.Fatalf("HTTP %d, %v", rec.Code, err)
	}
	if got.Response == nil || got.Response.UID != "u-1" || !got.Response.Allowed || got.Request != nil {
		t.Errorf("answer %+v", got)
	}
	for _, bad := range []string{`{}`, `{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"x"}}`, `not json`} {
		rec := httptest.NewRecorder()
		admit(rec, httptest.NewRequest(http.MethodPost, "/validate", strings.NewReader(bad)))
		if rec.Code != http.StatusBadRequest {
			t.Errorf("%s: HTTP %d, want 400", bad, rec.Code)
		}
	}
}

// TestStallerHoldsAtMostMax: a handshake with the stalling port times out;
// connections beyond the bound are closed at once.
func TestStallerHoldsAtMostMax(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := newStaller(ln, 2)
	go s.run()
	defer s.close()
	var conns []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	deadline := time.Now().Add(5 * time.Second)
	for s.held() < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	third, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	_ = third.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := third.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("third connection: read %v, want EOF (closed at the bound)", err)
	}
	tc := tls.Client(conns[0], &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // the handshake is to time out
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := tc.HandshakeContext(ctx); err == nil {
		t.Error("handshake with the stalling port succeeded")
	}
	if n := s.held(); n > 2 {
		t.Errorf("%d connections held, bound 2", n)
	}
	for _, c := range conns {
		_ = c.Close()
	}
}

// TestRunServesTLSAndHealth runs the program's server on free ports.
func TestRunServesTLSAndHealth(t *testing.T) {
	dir := t.TempDir()
	ca, key, err := webhookcerts.NewCA(time.Now(), time.Hour, webhookcerts.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	crt, k, err := webhookcerts.IssueServing(ca, key, []string{"wh.ns.svc"}, nil, time.Now(), time.Hour, webhookcerts.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.crt"), crt, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.key"), k, 0o600); err != nil {
		t.Fatal(err)
	}
	addrs := make(chan string, 2)
	c := config{certDir: dir, addr: "127.0.0.1:0", healthAddr: "127.0.0.1:0", onListen: func(_ string, a net.Addr) { addrs <- a.String() }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, c, log.New(io.Discard, "", 0)) }()
	health, hook := <-addrs, <-addrs
	resp, err := http.Get("http://" + health + "/readyz")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/readyz: %v %v", resp, err)
	}
	resp.Body.Close()
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: "wh.ns.svc"}}}
	body := `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u-2"}}`
	resp, err = hc.Post("https://"+hook+"/mutate", "application/json", bytes.NewBufferString(body))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), `"allowed":true`) {
		t.Errorf("answer %s", b)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return after its context ended")
	}
}
