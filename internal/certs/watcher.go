package certs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/kadmit/kadmit/pkg/webhookcerts"

	"github.com/fsnotify/fsnotify"
)

// DirWatcher keeps a webhookcerts.Holder loaded from tls.crt and tls.key in a directory
// (cert-manager, a mounted Secret). It watches the directory, not the files:
// projected volumes swap a "..data" symlink atomically, which replaces the
// files without a write event on them. A poll catches what events miss
// (network filesystems, a watch that could not be set up).
type DirWatcher struct {
	Dir    string
	Holder *webhookcerts.Holder
	// BundleFile, when set, is a PEM CA bundle (the caBundle to register,
	// e.g. cert-manager's ca.crt) followed like the pair: Bundle returns its
	// newest content. Its directory is watched too.
	BundleFile string
	// Poll is the fallback interval; default 10s.
	Poll time.Duration
	// OnReload, when set, is called after each successful swap.
	OnReload func(*webhookcerts.Holder)
	// OnError, when set, is called when the files exist but do not load.
	OnError func(error)
	Logger  *slog.Logger

	lastCert, lastKey []byte
	bundle            atomic.Pointer[[]byte]
}

// Bundle returns the newest valid content of BundleFile, or nil.
func (w *DirWatcher) Bundle() []byte {
	if b := w.bundle.Load(); b != nil {
		return *b
	}
	return nil
}

// loadBundle reads BundleFile and keeps it when it holds a certificate. An
// unreadable or empty file keeps the previous bundle: registering nothing
// would take the webhooks down.
func (w *DirWatcher) loadBundle() error {
	if w.BundleFile == "" {
		return nil
	}
	b, err := os.ReadFile(w.BundleFile)
	if err != nil {
		return fmt.Errorf("read CA bundle: %w", err)
	}
	if _, err := webhookcerts.ParseCertificates(b); err != nil {
		return fmt.Errorf("CA bundle %s: %w", w.BundleFile, err)
	}
	if !bytes.Equal(b, w.Bundle()) {
		w.bundle.Store(&b)
	}
	return nil
}

// Load reads the pair once and swaps it in when it changed. It returns the
// error of an unreadable or invalid pair and keeps the current certificate.
func (w *DirWatcher) Load() error {
	return errors.Join(w.loadPair(), w.loadBundle())
}

func (w *DirWatcher) loadPair() error {
	certPEM, err := os.ReadFile(filepath.Join(w.Dir, "tls.crt"))
	if err != nil {
		return fmt.Errorf("read serving certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(w.Dir, "tls.key"))
	if err != nil {
		return fmt.Errorf("read serving key: %w", err)
	}
	if bytes.Equal(certPEM, w.lastCert) && bytes.Equal(keyPEM, w.lastKey) {
		return nil
	}
	c, err := webhookcerts.ParseKeyPair(certPEM, keyPEM)
	if err != nil {
		// A writer that replaces the two files one by one leaves a
		// mismatched pair for a moment; the next event or poll retries.
		return fmt.Errorf("%s: %w", w.Dir, err)
	}
	w.lastCert, w.lastKey = certPEM, keyPEM
	w.Holder.Set(c)
	if w.OnReload != nil {
		w.OnReload(w.Holder)
	}
	return nil
}

// Run reloads on every change until ctx ends. Call Load first to fail fast at
// start-up.
func (w *DirWatcher) Run(ctx context.Context) {
	log := w.Logger
	if log == nil {
		log = slog.Default()
	}
	poll := w.Poll
	if poll <= 0 {
		poll = 10 * time.Second
	}
	var events chan fsnotify.Event
	var errs chan error
	fw, err := fsnotify.NewWatcher()
	if err == nil {
		if err = fw.Add(w.Dir); err == nil && w.BundleFile != "" && filepath.Dir(w.BundleFile) != filepath.Clean(w.Dir) {
			err = fw.Add(filepath.Dir(w.BundleFile))
		}
		if err == nil {
			events, errs = fw.Events, fw.Errors
			defer fw.Close()
		} else {
			fw.Close()
		}
	}
	if err != nil {
		log.Warn("cannot watch certificate directory; polling only", "dir", w.Dir, "every", poll.String(), "error", err)
	}
	tick := time.NewTicker(poll)
	defer tick.Stop()
	reload := func() {
		if err := w.Load(); err != nil {
			log.Warn("certificate reload failed; keeping the current certificate", "error", err)
			if w.OnError != nil {
				w.OnError(err)
			}
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-events:
			reload()
		case err := <-errs:
			log.Warn("certificate directory watch error", "error", err)
		case <-tick.C:
			reload()
		}
	}
}
