package server

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"slices"
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
// The handshake asks for a certificate (tls.RequestClientCert) and
// VerifyConnection does what tls.RequireAndVerifyClientCert would (the same
// x509.VerifyOptions as crypto/tls's server handshake, Go 1.26
// handshake_server.go processCertsFromClient: the client CA pool, the
// other presented certificates as intermediates, client-auth key usage),
// so that each refusal is counted with its reason; crypto/tls refuses
// before any callback runs and says nothing. A refused client sees a
// bad_certificate alert.
func (c *clientCA) configure(base *tls.Config) {
	base.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		pool, err := c.current()
		if err != nil {
			return nil, err
		}
		cfg := base.Clone()
		cfg.GetConfigForClient = nil
		cfg.ClientAuth = tls.RequestClientCert
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
