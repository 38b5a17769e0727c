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

	mu      sync.Mutex
	modTime time.Time
	size    int64
	pool    *x509.CertPool
}

func newClientCA(path string, allowed []string) (*clientCA, error) {
	c := &clientCA{path: path, allowed: allowed}
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
func (c *clientCA) configure(base *tls.Config) {
	base.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		pool, err := c.current()
		if err != nil {
			return nil, err
		}
		cfg := base.Clone()
		cfg.GetConfigForClient = nil
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
		cfg.ClientCAs = pool
		if len(c.allowed) > 0 {
			cfg.VerifyConnection = c.verifyName
		}
		return cfg, nil
	}
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
