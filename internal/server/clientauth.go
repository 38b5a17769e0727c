package server

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

// clientCA verifies admission clients (the API server) against the CA
// bundle in a PEM file, re-read when the file changes so a rotated client
// CA needs no restart. A file that stops parsing keeps the last good pool.
type clientCA struct {
	path    string
	allowed []string
	// refused, when set, is told why each refused handshake was refused:
	// "no-certificate", "untrusted" or "name-not-allowed".
	refused func(reason string)

	mu      sync.Mutex
	modTime time.Time
	size    int64
	pool    *x509.CertPool
}

func newClientCA(path string, allowed []string, refused func(reason string)) (*clientCA, error) {
	c := &clientCA{path: path, allowed: allowed, refused: refused}
	if _, err := c.current(); err != nil {
		return nil, err
	}
	return c, nil
}

// current returns the pool for the file as it is now.
func (c *clientCA) current() (*x509.CertPool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	fi, err := os.Stat(c.path)
	if err != nil {
		if c.pool != nil {
			return c.pool, nil
		}
		return nil, fmt.Errorf("client CA file: %w", err)
	}
	if c.pool != nil && fi.ModTime().Equal(c.modTime) && fi.Size() == c.size {
		return c.pool, nil
	}
	pem, err := os.ReadFile(c.path)
	if err != nil {
		if c.pool != nil {
			return c.pool, nil
		}
		return nil, fmt.Errorf("client CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		if c.pool != nil {
			return c.pool, nil
		}
		return nil, fmt.Errorf("client CA file %s: no PEM certificate", c.path)
	}
	c.pool, c.modTime, c.size = pool, fi.ModTime(), fi.Size()
	return pool, nil
}

// configure makes base require a client certificate signed by the CA and,
// with allowed names, one whose subject CN or a DNS SAN is among them.
//
// crypto/tls refuses a client without a certificate itself
// (tls.RequireAnyClientCert: TLS 1.3 clients get the certificate_required
// alert, which the API server shows in its "failed calling webhook" error);
// VerifyConnection then does what tls.RequireAndVerifyClientCert would
// (the same x509.VerifyOptions as crypto/tls's server handshake, Go 1.26
// handshake_server.go processCertsFromClient: the client CA pool, the
// other presented certificates as intermediates, client-auth key usage)
// and checks the name, so that each refusal is counted with its reason
// (bad_certificate alert, as before). crypto/tls refuses a missing
// certificate before any callback: noCertificate counts those from
// net/http's handshake error line.
func (c *clientCA) configure(base *tls.Config) {
	base.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		pool, err := c.current()
		if err != nil {
			return nil, err
		}
		cfg := base.Clone()
		cfg.GetConfigForClient = nil
		cfg.ClientAuth = tls.RequireAnyClientCert
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			reason, err := c.verify(pool, cs)
			if err != nil && c.refused != nil {
				c.refused(reason)
			}
			return err
		}
		return cfg, nil
	}
}

// noCertificateError is crypto/tls's error for a client that sent no
// certificate when one is required (Go 1.26 handshake_server.go
// processCertsFromClient), which net/http logs as "http: TLS handshake
// error from ADDR: tls: client didn't provide a certificate".
const noCertificateError = "tls: client didn't provide a certificate"

// handshakeLogLine is told each net/http error line of the admission
// listener and counts the refusals crypto/tls made before VerifyConnection.
func (c *clientCA) handshakeLogLine(line string) {
	if c.refused != nil && strings.Contains(line, "TLS handshake error") && strings.HasSuffix(strings.TrimSpace(line), noCertificateError) {
		c.refused("no-certificate")
	}
}

// verify checks the client's certificate chain against pool and its name
// against the allowed ones; it returns the refusal's reason with the error.
func (c *clientCA) verify(pool *x509.CertPool, cs tls.ConnectionState) (string, error) {
	if len(cs.PeerCertificates) == 0 {
		return "no-certificate", errors.New("no client certificate")
	}
	opts := x509.VerifyOptions{
		Roots:         pool,
		Intermediates: x509.NewCertPool(),
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	for _, ic := range cs.PeerCertificates[1:] {
		opts.Intermediates.AddCert(ic)
	}
	if _, err := cs.PeerCertificates[0].Verify(opts); err != nil {
		return "untrusted", fmt.Errorf("client certificate: %w", err)
	}
	if len(c.allowed) > 0 {
		if err := c.verifyName(cs); err != nil {
			return "name-not-allowed", err
		}
	}
	return "", nil
}

func (c *clientCA) verifyName(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("no client certificate")
	}
	leaf := cs.PeerCertificates[0]
	if slices.Contains(c.allowed, leaf.Subject.CommonName) {
		return nil
	}
	for _, n := range leaf.DNSNames {
		if slices.Contains(c.allowed, n) {
			return nil
		}
	}
	return fmt.Errorf("client certificate subject %q is not among the allowed names", leaf.Subject.CommonName)
}
