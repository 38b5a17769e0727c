package certs

import (
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kadmit/kadmit/pkg/webhookcerts"
)

// LoadDir reads tls.crt and tls.key from dir (the layout of a kubernetes.io/tls
// Secret volume and of cert-manager) and returns the pair with Leaf set.
func LoadDir(dir string) (*tls.Certificate, error) {
	certPEM, err := os.ReadFile(filepath.Join(dir, "tls.crt"))
	if err != nil {
		return nil, fmt.Errorf("read serving certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, "tls.key"))
	if err != nil {
		return nil, fmt.Errorf("read serving key: %w", err)
	}
	c, err := webhookcerts.ParseKeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	return c, nil
}
