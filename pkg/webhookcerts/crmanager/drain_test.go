package crmanager

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/kadmit/kadmit/pkg/webhookcerts"
)

// A drained server goes on answering after its context ends, each answer
// with Connection: close, fails ReadyzCheck's drain test, and stops only
// after the drain; Start then returns.
func TestDrainKeepsServingThenStops(t *testing.T) {
	now := time.Now()
	mat, err := webhookcerts.NewMaterial(webhookcerts.Spec{IPs: []net.IP{net.ParseIP("127.0.0.1")}, ServingValidity: time.Hour, CAValidity: 2 * time.Hour}, now)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	inner := webhook.NewServer(webhook.Options{Host: "127.0.0.1", Port: port, TLSOpts: []func(*tls.Config){func(c *tls.Config) {
		c.GetCertificate = func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return mat.Serving, nil }
		c.NextProtos = []string{"http/1.1"}
	}}})
	const drain = 600 * time.Millisecond
	srv := Drain(inner, drain)
	srv.Register("/x", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	started := make(chan error, 1)
	go func() { started <- srv.Start(ctx) }()

	roots := x509.NewCertPool()
	roots.AddCert(mat.Bundle[0])
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	url := "https://127.0.0.1:" + strconv.Itoa(port) + "/x"
	get := func() (*http.Response, error) {
		resp, err := client.Get(url)
		if err == nil {
			resp.Body.Close()
		}
		return resp, err
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if srv.StartedChecker()(nil) == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("server did not start")
		}
	}
	resp, err := get()
	if err != nil || resp.Close {
		t.Fatalf("before the context ended: err=%v close=%v, want an open keep-alive answer", err, resp != nil && resp.Close)
	}
	cancel()
	stoppedAt := time.Now()
	for !srv.Draining() {
		time.Sleep(time.Millisecond)
	}
	for time.Since(stoppedAt) < drain/2 {
		resp, err := get()
		if err != nil {
			t.Fatalf("%s after the context ended, within the drain: %v", time.Since(stoppedAt).Round(time.Millisecond), err)
		}
		if !resp.Close {
			t.Fatal("answer while draining lacks Connection: close")
		}
		time.Sleep(50 * time.Millisecond)
	}
	select {
	case err := <-started:
		if err != nil {
			t.Fatalf("Start: %v", err)
		}
		if took := time.Since(stoppedAt); took < drain {
			t.Fatalf("Start returned %s after the context ended, before the %s drain", took, drain)
		}
	case <-time.After(drain + 5*time.Second):
		t.Fatal("Start did not return after the drain")
	}
	if _, err := get(); err == nil {
		t.Fatal("server still answers after the drain")
	}
}
