// Package certs issues and loads the serving certificates kadmit presents to
// the API server.
package certs

import (
	"crypto"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"time"
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
	// KeyType of both keys; "" means ECDSAP256.
	KeyType KeyType
}

// ErrNoSANs is returned when a serving certificate would have no SAN.
var ErrNoSANs = errors.New("a serving certificate needs at least one DNS name or IP SAN")

// NewSelfSigned creates a fresh CA and a serving certificate it signs for the
// given SANs, both with opts.KeyType keys. Returns ErrNoSANs without SANs.
func NewSelfSigned(opts SelfSignedOptions) (*Bundle, error) {
	if len(opts.DNSNames) == 0 && len(opts.IPs) == 0 {
		return nil, ErrNoSANs
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
	caCert, caKey, err := NewCA(now, opts.CAValidity, opts.KeyType)
	if err != nil {
		return nil, err
	}
	serverCert, serverKey, err := IssueServing(caCert, caKey, opts.DNSNames, opts.IPs, now, opts.ServerValidity, opts.KeyType)
	if err != nil {
		return nil, err
	}
	caKeyPEM, err := EncodeKey(caKey)
	if err != nil {
		return nil, err
	}
	return &Bundle{
		CACert:     EncodeCertificates(caCert),
		CAKey:      caKeyPEM,
		ServerCert: serverCert,
		ServerKey:  serverKey,
	}, nil
}

// backdate is how far NotBefore lies in the past, so an API server whose clock
// runs a little behind still accepts a fresh certificate: 5 minutes, or a
// tenth of a short lifetime.
func backdate(validity time.Duration) time.Duration {
	return min(5*time.Minute, validity/10)
}

// NewCA creates a self-signed CA certificate valid from now-backdate
// (tolerating clock skew with the API server) to now+validity, with a keyType
// key.
func NewCA(now time.Time, validity time.Duration, keyType KeyType) (*x509.Certificate, crypto.Signer, error) {
	key, err := GenerateKey(keyType)
	if err != nil {
		return nil, nil, fmt.Errorf("CA: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: fmt.Sprintf("kadmit-ca@%d", now.Unix())},
		NotBefore:             now.Add(-backdate(validity)),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, fmt.Errorf("self-sign CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("parse CA: %w", err)
	}
	return cert, key, nil
}

// IssueServing signs a fresh serving certificate (ExtKeyUsage serverAuth,
// keyType key) for dnsNames and ips with the CA, valid from now-backdate to
// now+validity. It returns the PEM certificate and PEM key, or ErrNoSANs.
func IssueServing(ca *x509.Certificate, caKey crypto.Signer, dnsNames []string, ips []net.IP, now time.Time, validity time.Duration, keyType KeyType) (certPEM, keyPEM []byte, err error) {
	if len(dnsNames) == 0 && len(ips) == 0 {
		return nil, nil, ErrNoSANs
	}
	key, err := GenerateKey(keyType)
	if err != nil {
		return nil, nil, fmt.Errorf("serving: %w", err)
	}
	cn := "kadmit"
	if len(dnsNames) > 0 {
		cn = dnsNames[0]
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: cn},
		DNSNames:     dnsNames,
		IPAddresses:  ips,
		NotBefore:    now.Add(-backdate(validity)),
		NotAfter:     now.Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("sign serving certificate: %w", err)
	}
	keyPEM, err = EncodeKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM, nil
}

// TLSCertificate parses the bundle's serving pair, with Leaf set.
func (b *Bundle) TLSCertificate() (*tls.Certificate, error) {
	return ParseKeyPair(b.ServerCert, b.ServerKey)
}

// ParseKeyPair parses a PEM certificate chain and key into a tls.Certificate
// with Leaf set, so expiry and SANs can be read without re-parsing.
func ParseKeyPair(certPEM, keyPEM []byte) (*tls.Certificate, error) {
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("parse key pair: %w", err)
	}
	if c.Leaf == nil {
		if c.Leaf, err = x509.ParseCertificate(c.Certificate[0]); err != nil {
			return nil, fmt.Errorf("parse leaf certificate: %w", err)
		}
	}
	return &c, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		// crypto/rand does not fail on supported platforms.
		panic(fmt.Sprintf("crypto/rand: %v", err))
	}
	return n
}
