package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kadmit/kadmit/internal/certs"
	"github.com/kadmit/kadmit/test/controlplane/kadmitproc"
	"github.com/kadmit/kadmit/test/e2e/e2eenv"
	"github.com/kadmit/kadmit/test/poll"
)

// TestFilesReplicaUntrustedByCABundleIsNotReady starts a replica serving a
// cert-manager style certificate (--tls=files) from a CA that kadmit's
// registered webhooks do not trust: /readyz must say so, since the API
// server would fail every call with "x509: certificate signed by unknown
// authority".
func TestFilesReplicaUntrustedByCABundleIsNotReady(t *testing.T) {
	e := world(t)
	ctx := e2eenv.TestCtx(t, time.Minute)
	dir := t.TempDir()
	b, err := certs.NewSelfSigned(certs.SelfSignedOptions{DNSNames: []string{"localhost"}})
	if err != nil {
		t.Fatal(err)
	}
	// Its bundle file is yet another CA, so its registrar never takes over
	// the shared kadmit's configurations: it only writes a bundle that
	// verifies its own certificate.
	other, err := certs.NewSelfSigned(certs.SelfSignedOptions{DNSNames: []string{"localhost"}})
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"tls.crt": b.ServerCert, "tls.key": b.ServerKey, "ca.crt": other.CACert} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := e.CP.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	addr, metricsAddr, err := e2eenv.FreeAddrs()
	if err != nil {
		t.Fatal(err)
	}
	// --webhook-url names this replica, so it could only register itself
	// once ready; the shared kadmit's configurations are what it checks.
	p, err := kadmitproc.Start(kadmitproc.Options{
		Binary: e.Binary, Addr: addr, MetricsAddr: metricsAddr,
		Args: []string{"serve", "--tls=files", "--cert-dir", dir, "--ca-bundle-file", filepath.Join(dir, "ca.crt"),
			"--register", "--webhook-url", "https://localhost:" + strings.Split(addr, ":")[1], "--kubeconfig", kubeconfig,
			"--addr", addr, "--metrics-addr", metricsAddr, "--log-format", "json"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _, _ = p.Terminate(10 * time.Second) })

	hc := &http.Client{Timeout: 2 * time.Second}
	err = poll.Until(ctx, 20*time.Second, func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+metricsAddr+"/readyz", nil)
		if err != nil {
			return poll.Stop(err)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			return poll.Stop(errors.New("replica untrusted by the registered caBundle reports ready"))
		}
		if !strings.Contains(string(body), "does not verify against the caBundle of") || !strings.Contains(string(body), "unknown authority") {
			return fmt.Errorf("/readyz answered %d %q", resp.StatusCode, body)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("/readyz never said the certificate is untrusted: %v\n%s", err, p.Tail(10))
	}
}
