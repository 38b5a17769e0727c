// Package certs issues and loads the serving certificates kadmit presents to
// the API server.
package certs

import (
	"crypto/tls"
	"net"
	"time"

	"github.com/kadmit/kadmit/pkg/webhookcerts"
)

// Bundle is a CA and a serving certificate it signed, PEM-encoded.
type Bundle struct {
	CACert     []byte // PEM "CERTIFICATE"
	CAKey      []byte // PEM "EC PRIVATE KEY" or "RSA PRIVATE KEY"
	ServerCert []byte // PEM "CERTIFICATE", the leaf only
	ServerKey  []byte // PEM private key
}

// SelfSignedOptions describe what NewSelfSigned issues.
type SelfSignedOptions struct {
	// DNSNames and IPs become the serving certificate's SANs; at least one
	// is required. The API server verifies the name it dials against them.
	DNSNames []string
	IPs      []net.IP
	// CAValidity and ServerValidity are the certificate lifetimes; zero
	// means 10 years and 1 year.
	CAValidity, ServerValidity time.Duration
	// Now is the issue time; zero means time.Now().
	Now time.Time
	// KeyType of both keys; "" means webhookcerts.ECDSAP256.
	KeyType webhookcerts.KeyType
}

// NewSelfSigned creates a fresh CA and a serving certificate it signs for the
// given SANs, both with opts.KeyType keys. Returns webhookcerts.ErrNoSANs without SANs.
func NewSelfSigned(opts SelfSignedOptions) (*Bundle, error) {
	if len(opts.DNSNames) == 0 && len(opts.IPs) == 0 {
		return nil, webhookcerts.ErrNoSANs
	}
	now := opts.Now
	if now.IsZero() {
		now = time.Now()
	}
	if opts.CAValidity == 0 {
		opts.CAValidity = 10 * 365 * 24 * time.Hour
	}
	if opts.ServerValidity == 0 {
		opts.ServerValidity = 365 * 24 * time.Hour
	}
	caCert, caKey, err := webhookcerts.NewCA(now, opts.CAValidity, opts.KeyType)
	if err != nil {
		return nil, err
	}
	serverCert, serverKey, err := webhookcerts.IssueServing(caCert, caKey, opts.DNSNames, opts.IPs, now, opts.ServerValidity, opts.KeyType)
	if err != nil {
		return nil, err
	}
	caKeyPEM, err := webhookcerts.EncodeKey(caKey)
	if err != nil {
		return nil, err
	}
	return &Bundle{
		CACert:     webhookcerts.EncodeCertificates(caCert),
		CAKey:      caKeyPEM,
		ServerCert: serverCert,
		ServerKey:  serverKey,
	}, nil
}

// TLSCertificate parses the bundle's serving pair, with Leaf set.
func (b *Bundle) TLSCertificate() (*tls.Certificate, error) {
	return webhookcerts.ParseKeyPair(b.ServerCert, b.ServerKey)
}
