package certs

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
)

// DirWatcher keeps a Holder loaded from tls.crt and tls.key in a directory
// (cert-manager, a mounted Secret). It watches the directory, not the files:
// projected volumes swap a "..data" symlink atomically, which replaces the
// files without a write event on them. A poll catches what events miss
// (network filesystems, a watch that could not be set up).
type DirWatcher struct {
	Dir    string
	Holder *Holder
	// Poll is the fallback interval; default 10s.
	Poll time.Duration
	// OnReload, when set, is called after each successful swap.
	OnReload func(*Holder)
	// OnError, when set, is called when the files exist but do not load.
	OnError func(error)
	Logger  *slog.Logger

	lastCert, lastKey []byte
}

// Load reads the pair once and swaps it in when it changed. It returns the
// error of an unreadable or invalid pair and keeps the current certificate.
func (w *DirWatcher) Load() error {
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
	c, err := ParseKeyPair(certPEM, keyPEM)
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
		if err = fw.Add(w.Dir); err == nil {
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
