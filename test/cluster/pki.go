package cluster

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/keyutil"
)

// pki is the cluster's one certificate authority and the files every
// component reads: what kubeadm lays out in /etc/kubernetes/pki, cut to what
// a test cluster needs (one CA for serving and client certificates, the
// service-account key pair). Everything lives in dir and dies with the test.
type pki struct {
	dir    string
	ca     *x509.Certificate
	caKey  crypto.Signer
	CAFile string
}

func newPKI(dir string) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("cluster: pki dir: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("cluster: CA key: %w", err)
	}
	ca, err := certutil.NewSelfSignedCACert(certutil.Config{CommonName: "kadmit-test-cluster-ca"}, key)
	if err != nil {
		return nil, fmt.Errorf("cluster: CA certificate: %w", err)
	}
	p := &pki{dir: dir, ca: ca, caKey: key, CAFile: filepath.Join(dir, "ca.crt")}
	if err := os.WriteFile(p.CAFile, pemBlock("CERTIFICATE", ca.Raw), 0o644); err != nil {
		return nil, fmt.Errorf("cluster: write CA: %w", err)
	}
	// The service-account signer: RSA, as kube-apiserver's
	// --service-account-signing-key-file requires RS256 by default.
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, fmt.Errorf("cluster: service-account key: %w", err)
	}
	saPEM, err := keyutil.MarshalPrivateKeyToPEM(saKey)
	if err != nil {
		return nil, fmt.Errorf("cluster: service-account key: %w", err)
	}
	if err := os.WriteFile(p.path("sa.key"), saPEM, 0o600); err != nil {
		return nil, fmt.Errorf("cluster: write service-account key: %w", err)
	}
	der, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return nil, fmt.Errorf("cluster: service-account public key: %w", err)
	}
	if err := os.WriteFile(p.path("sa.pub"), pemBlock("PUBLIC KEY", der), 0o644); err != nil {
		return nil, fmt.Errorf("cluster: write service-account public key: %w", err)
	}
	return p, nil
}

func (p *pki) path(name string) string { return filepath.Join(p.dir, name) }

// issue writes name.crt and name.key, signed by the CA: a client certificate
// when ips and dns are empty (CN = user, O = groups, which is how the API
// server's x509 authenticator names the user), else a serving certificate
// with those SANs. It returns the two paths.
func (p *pki) issue(name, cn string, groups []string, ips []net.IP, dns []string) (certFile, keyFile string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", fmt.Errorf("cluster: key for %s: %w", name, err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return "", "", fmt.Errorf("cluster: serial for %s: %w", name, err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn, Organization: groups},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		IPAddresses:  ips,
		DNSNames:     dns,
	}
	if len(ips) > 0 || len(dns) > 0 {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, key.Public(), p.caKey)
	if err != nil {
		return "", "", fmt.Errorf("cluster: certificate for %s: %w", name, err)
	}
	keyPEM, err := keyutil.MarshalPrivateKeyToPEM(key)
	if err != nil {
		return "", "", fmt.Errorf("cluster: key for %s: %w", name, err)
	}
	certFile, keyFile = p.path(name+".crt"), p.path(name+".key")
	if err := os.WriteFile(certFile, pemBlock("CERTIFICATE", der), 0o644); err != nil {
		return "", "", fmt.Errorf("cluster: write %s: %w", certFile, err)
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		return "", "", fmt.Errorf("cluster: write %s: %w", keyFile, err)
	}
	return certFile, keyFile, nil
}

// kubeconfig issues a client certificate for user (in groups) and writes a
// kubeconfig for it that reaches server; it returns the kubeconfig's path.
func (p *pki) kubeconfig(name, server, user string, groups ...string) (string, error) {
	certFile, keyFile, err := p.issue(name, user, groups, nil, nil)
	if err != nil {
		return "", err
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["kadmit-test"] = &clientcmdapi.Cluster{Server: server, CertificateAuthority: p.CAFile}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificate: certFile, ClientKey: keyFile}
	cfg.Contexts["kadmit-test"] = &clientcmdapi.Context{Cluster: "kadmit-test", AuthInfo: user}
	cfg.CurrentContext = "kadmit-test"
	path := p.path(name + ".kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return "", fmt.Errorf("cluster: write kubeconfig %s: %w", path, err)
	}
	return path, nil
}

func pemBlock(kind string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der})
}
