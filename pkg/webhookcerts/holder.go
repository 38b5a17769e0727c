package webhookcerts

import (
	"crypto/tls"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// ErrNoCertificate is returned while no serving certificate is loaded.
var ErrNoCertificate = errors.New("no serving certificate loaded")

// Holder serves the current certificate to tls.Config.GetCertificate and
// swaps it atomically, so a reload never drops a connection or races a
// handshake.
type Holder struct {
	cur atomic.Pointer[tls.Certificate]
}

// Set replaces the served certificate; cert must have Leaf set.
func (h *Holder) Set(cert *tls.Certificate) { h.cur.Store(cert) }

// Current returns the served certificate or nil.
func (h *Holder) Current() *tls.Certificate { return h.cur.Load() }

// GetCertificate is a tls.Config.GetCertificate.
func (h *Holder) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c := h.cur.Load()
	if c == nil {
		return nil, ErrNoCertificate
	}
	return c, nil
}

// Check returns nil when a certificate is loaded and valid at now, else an
// error saying why (none loaded, not yet valid, expired).
func (h *Holder) Check(now time.Time) error {
	c := h.cur.Load()
	if c == nil || c.Leaf == nil {
		return ErrNoCertificate
	}
	if now.Before(c.Leaf.NotBefore) {
		return fmt.Errorf("serving certificate not valid before %s", c.Leaf.NotBefore.UTC().Format(time.RFC3339))
	}
	if now.After(c.Leaf.NotAfter) {
		return fmt.Errorf("serving certificate expired at %s", c.Leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	return nil
}
