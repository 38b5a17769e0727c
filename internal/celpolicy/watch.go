package celpolicy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Fingerprint is a hash of what Load would read at paths: the names and
// contents of the files (each read up to MaxFileBytes+1 bytes). It fails
// as Load fails to list or open them.
func Fingerprint(paths ...string) (string, error) {
	h := sha256.New()
	for _, p := range paths {
		files, err := listFiles(p)
		if err != nil {
			return "", err
		}
		for _, f := range files {
			fh, err := os.Open(f)
			if err != nil {
				return "", err
			}
			_, _ = io.WriteString(h, f+"\x00")
			_, err = io.Copy(h, io.LimitReader(fh, MaxFileBytes+1))
			fh.Close()
			if err != nil {
				return "", err
			}
			_, _ = io.WriteString(h, "\x00")
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// debounce lets a burst of events (an editor's write-rename, a ConfigMap
// volume's symlink swap) settle into one change.
const debounce = 300 * time.Millisecond

// Watch calls changed each time the Fingerprint of paths differs from the
// last one seen, until ctx ends. It watches the directories (recursively
// for directory paths, the parent for file paths) with fsnotify, so
// atomically swapped mounted volumes are seen, and re-checks every poll
// (which also catches what events miss; poll <= 0 means 30s). A listing or
// read error counts as a change, so the caller's Load reports it.
func Watch(ctx context.Context, paths []string, poll time.Duration, changed func()) {
	if poll <= 0 {
		poll = 30 * time.Second
	}
	last, _ := Fingerprint(paths...)
	w, err := fsnotify.NewWatcher()
	var events <-chan fsnotify.Event
	var errs <-chan error
	if err == nil {
		defer w.Close()
		for _, p := range paths {
			addWatches(w, p)
		}
		events, errs = w.Events, w.Errors
	}
	tick := time.NewTicker(poll)
	defer tick.Stop()
	var settle <-chan time.Time
	check := func() {
		fp, err := Fingerprint(paths...)
		if err != nil {
			fp = "error: " + err.Error()
		}
		if fp != last {
			last = fp
			changed()
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			if ev.Has(fsnotify.Create) {
				// A new directory under a watched one holds policy files too.
				if fi, err := os.Stat(ev.Name); err == nil && fi.IsDir() {
					addWatches(w, ev.Name)
				}
			}
			settle = time.After(debounce)
		case <-errs:
			// The poll covers what a failed watch misses.
		case <-settle:
			settle = nil
			check()
		case <-tick.C:
			check()
		}
	}
}

// addWatches watches path's directory, or path and every directory under
// it (at most MaxFiles of them).
func addWatches(w *fsnotify.Watcher, path string) {
	fi, err := os.Stat(path)
	if err != nil {
		_ = w.Add(filepath.Dir(path))
		return
	}
	if !fi.IsDir() {
		_ = w.Add(filepath.Dir(path))
		return
	}
	n := 0
	_ = filepath.WalkDir(path, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		if n++; n > MaxFiles {
			return filepath.SkipAll
		}
		_ = w.Add(p)
		return nil
	})
}
