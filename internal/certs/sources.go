package certs

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/kadmit/kadmit/pkg/webhookcerts"
)

// Source is where the serving certificate comes from: one implementation
// per `kadmit serve --tls` mode (FilesSource, SelfSignedSource, and
// daemon's rotatorSource, a webhookcerts.Rotator, for self-managed). The
// daemon serves Holder, registers CABundle and composes Ready into /readyz;
// nothing else differs by mode.
type Source interface {
	// Holder serves the current certificate; its GetCertificate goes into
	// the HTTPS listener's tls.Config.
	Holder() *webhookcerts.Holder
	// CABundle is the PEM bundle of CAs the API server must trust to verify
	// the served certificate, as the source knows it now, newest first; nil
	// when the source has none (files without a bundle file).
	CABundle() []byte
	// Start loads the first certificate and runs the source's background
	// work (file watch, Secret informer, rotation) until ctx ends. It
	// returns once a certificate is served, or the error why none can be.
	Start(ctx context.Context) error
	// Ready returns nil when the source is usable: caches synced and a
	// certificate loaded that is Fresh; else why not.
	Ready() error
	// SANs lists the DNS names and IPs the served certificate covers.
	SANs() []string
}

// Fresh returns nil when h holds a certificate valid at now and not within
// the last tenth of its lifetime (a source that stopped renewing must show
// before the API server starts failing calls); else why not.
func Fresh(h *webhookcerts.Holder, now time.Time) error {
	if err := h.Check(now); err != nil {
		return err
	}
	leaf := h.Current().Leaf
	if margin := leaf.NotAfter.Sub(leaf.NotBefore) / 10; now.After(leaf.NotAfter.Add(-margin)) {
		return fmt.Errorf("serving certificate expires at %s, within the last tenth of its lifetime", leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	return nil
}

// VerifyServed checks that the certificate h serves verifies for serverName
// against bundle at now, as the API server would with that caBundle; where
// names the bundle in the error.
func VerifyServed(h *webhookcerts.Holder, where string, bundle []byte, serverName string, now time.Time) error {
	cur := h.Current()
	if cur == nil || cur.Leaf == nil {
		return webhookcerts.ErrNoCertificate
	}
	if err := webhookcerts.Verify(cur.Leaf, bundle, serverName, now); err != nil {
		return fmt.Errorf("served certificate does not verify against the caBundle of %s for %s: %w", where, serverName, err)
	}
	return nil
}

func leafSANs(h *webhookcerts.Holder) []string {
	if cur := h.Current(); cur != nil {
		return LeafSANs(cur.Leaf)
	}
	return nil
}

// FilesSource serves tls.crt and tls.key from a directory, reloaded on
// change (cert-manager, a mounted Secret): --tls=files. The caBundle is
// BundleFile's content, followed the same way.
type FilesSource struct {
	w DirWatcher
	h webhookcerts.Holder
}

// FilesOptions configure NewFilesSource.
type FilesOptions struct {
	// Dir holds tls.crt and tls.key; required.
	Dir string
	// BundleFile is the PEM CA bundle to register (e.g. Dir/ca.crt);
	// optional.
	BundleFile string
	// OnReload is called after each certificate swap; OnError when the
	// files exist but do not load (the current certificate is kept).
	OnReload func(*tls.Certificate)
	OnError  func(error)
	Logger   *slog.Logger
}

// NewFilesSource checks opts; Start loads the files.
func NewFilesSource(opts FilesOptions) (*FilesSource, error) {
	if opts.Dir == "" {
		return nil, errors.New("a certificate directory is required")
	}
	s := &FilesSource{}
	s.w = DirWatcher{Dir: opts.Dir, BundleFile: opts.BundleFile, Holder: &s.h, Logger: opts.Logger, OnError: opts.OnError}
	if opts.OnReload != nil {
		s.w.OnReload = func(h *webhookcerts.Holder) { opts.OnReload(h.Current()) }
	}
	return s, nil
}

// Holder implements Source.
func (s *FilesSource) Holder() *webhookcerts.Holder { return &s.h }

// CABundle implements Source: BundleFile's newest valid content.
func (s *FilesSource) CABundle() []byte { return s.w.Bundle() }

// Start loads the pair (and bundle) once, failing fast when they do not
// load, then follows the directory until ctx ends.
func (s *FilesSource) Start(ctx context.Context) error {
	if err := s.w.Load(); err != nil {
		return err
	}
	go s.w.Run(ctx)
	return nil
}

// Ready implements Source.
func (s *FilesSource) Ready() error { return Fresh(&s.h, time.Now()) }

// SANs implements Source: the loaded certificate's.
func (s *FilesSource) SANs() []string { return leafSANs(&s.h) }

// SelfSignedSource serves an in-memory CA and serving certificate issued at
// start: --tls=self-signed, for development.
type SelfSignedSource struct {
	b *Bundle
	h webhookcerts.Holder
}

// NewSelfSignedSource issues the CA and certificate for opts; it returns
// webhookcerts.ErrNoSANs without SANs.
func NewSelfSignedSource(opts SelfSignedOptions) (*SelfSignedSource, error) {
	b, err := NewSelfSigned(opts)
	if err != nil {
		return nil, err
	}
	c, err := b.TLSCertificate()
	if err != nil {
		return nil, err
	}
	s := &SelfSignedSource{b: b}
	s.h.Set(c)
	return s, nil
}

// Holder implements Source.
func (s *SelfSignedSource) Holder() *webhookcerts.Holder { return &s.h }

// CABundle implements Source: the in-memory CA.
func (s *SelfSignedSource) CABundle() []byte { return s.b.CACert }

// Start implements Source; the certificate exists from construction.
func (s *SelfSignedSource) Start(context.Context) error { return nil }

// Ready implements Source.
func (s *SelfSignedSource) Ready() error { return Fresh(&s.h, time.Now()) }

// SANs implements Source.
func (s *SelfSignedSource) SANs() []string { return leafSANs(&s.h) }

// WriteCA writes the CA (PEM) to path with mode 0644, for the caller to
// trust (--ca-file).
func (s *SelfSignedSource) WriteCA(path string) error {
	if err := os.WriteFile(path, s.b.CACert, 0o644); err != nil {
		return fmt.Errorf("write CA to %s: %w", path, err)
	}
	return nil
}

// Leaf is the served certificate.
func (s *SelfSignedSource) Leaf() *x509.Certificate { return s.h.Current().Leaf }
