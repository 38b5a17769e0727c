// Package mtls checks, against a real kube-apiserver and etcd on loopback,
// the two authenticated paths into kadmit (docs/security.md): the API server
// calls kadmit over mutual TLS, configured the way a cluster operator does
// it (--admission-control-config-file with a WebhookAdmission kubeConfigFile
// naming the client certificate per webhook host), while a client without
// that certificate is refused at the handshake; and /metrics on the
// --metrics-secure listener answers only bearer tokens the API server
// authenticates (TokenReview) and authorizes (SubjectAccessReview).
//
// It starts its own control plane, since the API server's admission
// configuration is fixed at start. Without the control plane binaries it
// skips, unless KADMIT_E2E_REQUIRED=1.
package mtls

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kadmit/kadmit/pkg/webhookcerts"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kadmit/kadmit/test/controlplane"
	"github.com/kadmit/kadmit/test/controlplane/kadmitproc"
	"github.com/kadmit/kadmit/test/poll"
)

// limit bounds each wait of this test.
const limit = 90 * time.Second

func skipOrFail(t *testing.T, err error) {
	t.Helper()
	if errors.Is(err, controlplane.ErrBinariesMissing) && os.Getenv("KADMIT_E2E_REQUIRED") != "1" {
		t.Skipf("control plane binaries missing (make controlplane): %v", err)
	}
	t.Fatal(err)
}

// issue writes a certificate for cn signed by ca (serverAuth or clientAuth)
// and its key as PEM files under dir/name.{crt,key}.
func issue(t *testing.T, dir, name, cn string, ca *x509.Certificate, caKey crypto.Signer, usage x509.ExtKeyUsage) (certFile, keyFile string) {
	t.Helper()
	key, err := webhookcerts.GenerateKey(webhookcerts.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := webhookcerts.EncodeKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// admissionConfig writes the kube-apiserver side of mutual TLS: an
// AdmissionConfiguration whose ValidatingAdmissionWebhook and
// MutatingAdmissionWebhook plugins read a kubeconfig that gives, for the
// webhook host kadmitHost ("host:port" of the webhook URL), the client
// certificate to present. It returns the AdmissionConfiguration's path.
func admissionConfig(t *testing.T, dir, kadmitHost, certFile, keyFile string) string {
	t.Helper()
	kubeconfig := filepath.Join(dir, "webhook-kubeconfig.yaml")
	if err := os.WriteFile(kubeconfig, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
users:
- name: %q
  user:
    client-certificate: %s
    client-key: %s
`, kadmitHost, certFile, keyFile)), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "admission-config.yaml")
	var b strings.Builder
	b.WriteString("apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n")
	for _, plugin := range []string{"ValidatingAdmissionWebhook", "MutatingAdmissionWebhook"} {
		fmt.Fprintf(&b, `- name: %s
  configuration:
    apiVersion: apiserver.config.k8s.io/v1
    kind: WebhookAdmissionConfiguration
    kubeConfigFile: %s
`, plugin, kubeconfig)
	}
	if err := os.WriteFile(cfg, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestMutualTLSAndSecureMetrics(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := controlplane.FindBinaries(""); err != nil {
		skipOrFail(t, err)
	}
	dir := t.TempDir()
	root, err := kadmitproc.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "kadmit")
	built := make(chan error, 1)
	go func() { built <- kadmitproc.Build(ctx, root, bin) }()

	clientCA, clientCAKey, err := webhookcerts.NewCA(time.Now(), time.Hour, webhookcerts.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	clientCAFile := filepath.Join(dir, "client-ca.crt")
	if err := os.WriteFile(clientCAFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: clientCA.Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	apiCert, apiKey := issue(t, dir, "kube-apiserver-client", "kube-apiserver", clientCA, clientCAKey, x509.ExtKeyUsageClientAuth)
	strayCert, strayKey := issue(t, dir, "stray-client", "someone-else", clientCA, clientCAKey, x509.ExtKeyUsageClientAuth)

	addr, metricsAddr, err := kadmitproc.FreeAddrs()
	if err != nil {
		t.Fatal(err)
	}
	cpLog, err := os.Create(filepath.Join(dir, "controlplane.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer cpLog.Close()
	cp, err := controlplane.Start(ctx, controlplane.Options{Output: cpLog, APIServerFlags: map[string]string{
		"admission-control-config-file": admissionConfig(t, dir, addr, apiCert, apiKey),
	}})
	if err != nil {
		skipOrFail(t, err)
	}
	defer func() { _ = cp.Stop() }()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := cp.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	if err := <-built; err != nil {
		t.Fatal(err)
	}

	kadmitLog, err := os.Create(filepath.Join(dir, "kadmit.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer kadmitLog.Close()
	caFile := filepath.Join(dir, "ca.crt")
	p, err := kadmitproc.Start(kadmitproc.Options{Binary: bin, Addr: addr, MetricsAddr: metricsAddr, CAFile: caFile,
		Kubeconfig: kubeconfig, Log: kadmitLog, ShutdownGrace: 5 * time.Second,
		ExtraArgs: []string{"--client-ca-file=" + clientCAFile, "--client-allowed-names=kube-apiserver"}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if code, _, err := p.Terminate(15 * time.Second); err != nil || code != 0 {
			t.Errorf("kadmit exit %d, %v", code, err)
		}
	}()
	wctx, wcancel := context.WithTimeout(ctx, limit)
	defer wcancel()
	if err := p.WaitReady(wctx); err != nil {
		t.Fatal(err)
	}
	if _, _, err := p.WaitRegistered(wctx, cp.Client); err != nil {
		t.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "mtls-e2e"}}
	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The API server reaches kadmit over mutual TLS: kadmit's policies
	// take effect on pods (WaitEffective creates probe pods and checks
	// kadmit's mutation and denial).
	if err := p.WaitEffective(wctx, cp.Client, ns.Name); err != nil {
		t.Fatalf("admission through mutual TLS: %v\nkadmit log:\n%s", err, p.Tail(30))
	}

	// Other clients are refused at the handshake.
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	handshake := func(certFile, keyFile string) error {
		cfg := &tls.Config{RootCAs: roots}
		if certFile != "" {
			pair, err := tls.LoadX509KeyPair(certFile, keyFile)
			if err != nil {
				t.Fatal(err)
			}
			cfg.Certificates = []tls.Certificate{pair}
		}
		c, err := tls.Dial("tcp", addr, cfg)
		if err != nil {
			return err
		}
		defer c.Close()
		// TLS 1.3 delivers the server's verdict on the client
		// certificate with the first read.
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err != nil && !os.IsTimeout(err) {
			return err
		}
		return nil
	}
	if err := handshake("", ""); err == nil || !strings.Contains(err.Error(), "certificate required") {
		t.Errorf("client without a certificate: %v, want the handshake refused (certificate required)", err)
	}
	if err := handshake(strayCert, strayKey); err == nil {
		t.Error("client certificate with a name not allowed: handshake succeeded")
	}
	if err := handshake(apiCert, apiKey); err != nil {
		t.Errorf("the API server's client certificate: %v", err)
	}

	t.Run("secure metrics", func(t *testing.T) { secureMetrics(t, ctx, cp, bin, kubeconfig, dir) })
}

// secureMetrics runs a second kadmit (not registered) with --metrics-secure
// and checks /metrics against real ServiceAccount tokens.
func secureMetrics(t *testing.T, ctx context.Context, cp *controlplane.ControlPlane, bin, kubeconfig, dir string) {
	addr, metricsAddr, err := kadmitproc.FreeAddrs()
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, "ca-metrics.crt")
	p, err := kadmitproc.Start(kadmitproc.Options{Binary: bin, Addr: addr, MetricsAddr: metricsAddr, Args: []string{"serve",
		"--self-signed", "--dns-name=127.0.0.1", "--ca-file=" + caFile, "--addr=" + addr, "--metrics-addr=" + metricsAddr,
		"--metrics-secure", "--kubeconfig=" + kubeconfig, "--log-format=json", "--shutdown-grace=5s"}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if code, _, err := p.Terminate(15 * time.Second); err != nil || code != 0 {
			t.Errorf("kadmit exit %d, %v", code, err)
		}
	}()
	hc := &http.Client{Timeout: 10 * time.Second}
	get := func(path, token string) (int, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+metricsAddr+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return resp.StatusCode, string(b)
	}
	deadline := time.Now().Add(limit)
	if err := poll.Until(ctx, limit, func(context.Context) error {
		caPEM, _ := os.ReadFile(caFile)
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM(caPEM) {
			return fmt.Errorf("no CA certificate in %s yet", caFile)
		}
		hc.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}
		if code, body := get("/readyz", ""); code != http.StatusOK {
			return fmt.Errorf("/readyz: HTTP %d %.200s", code, body)
		}
		return nil
	}); err != nil {
		t.Fatalf("secure metrics listener not ready: %v\n%s", err, p.Tail(20))
	}
	// Probes need no token.
	if code, body := get("/healthz", ""); code != http.StatusOK {
		t.Fatalf("/healthz without a token: %d %s", code, body)
	}

	const ns = "default"
	token := func(sa string) string {
		t.Helper()
		if _, err := cp.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		tr, err := cp.Client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	scraper, stranger := token("metrics-scraper"), token("stranger")
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "kadmit-metrics-reader"},
		Rules: []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}}}
	if _, err := cp.Client.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "kadmit-metrics-reader"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "metrics-scraper", Namespace: ns}}}
	if _, err := cp.Client.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	if code, _ := get("/metrics", ""); code != http.StatusUnauthorized {
		t.Errorf("/metrics without a token: HTTP %d, want 401", code)
	}
	if code, _ := get("/metrics", "not-a-token"); code != http.StatusUnauthorized {
		t.Errorf("/metrics with a bad token: HTTP %d, want 401", code)
	}
	if code, _ := get("/metrics", stranger); code != http.StatusForbidden {
		t.Errorf("/metrics with a token not allowed get /metrics: HTTP %d, want 403", code)
	}
	// RBAC for the binding may take a moment to reach the authorizer;
	// what is left of the readiness wait's limit.
	if err := poll.Until(ctx, max(time.Until(deadline), poll.Interval), func(context.Context) error {
		code, body := get("/metrics", scraper)
		if code != http.StatusOK || !strings.Contains(body, "kadmit_server_in_flight_requests_limit") {
			return fmt.Errorf("HTTP %d %.300s", code, body)
		}
		return nil
	}); err != nil {
		t.Fatalf("/metrics with an authorized token: %v", err)
	}
}
