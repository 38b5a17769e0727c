package webhookcerts

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// errReadOnlyDir is wrapped by writeCertDir when the directory cannot be
// written because it is read-only (typically the Secret itself mounted
// there, which the kubelet keeps up to date).
var errReadOnlyDir = errors.New("certificate directory is read-only")

// writeCertDir writes the serving chain and key (PEM) to dir/certName and
// dir/keyName, each only when its content differs, each atomically: a
// temporary file in dir, synced, then renamed over the old one, so a reader
// never sees a partial file. The key is written first (mode 0600), then the
// chain (0644). It reports whether anything was written; an error names the
// file and wraps errReadOnlyDir on a read-only file system.
func writeCertDir(dir, certName, keyName string, certPEM, keyPEM []byte) (bool, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, dirErr(fmt.Errorf("create certificate directory: %w", err))
	}
	wroteKey, err := writeFileAtomic(filepath.Join(dir, keyName), keyPEM, 0o600)
	if err != nil {
		return false, err
	}
	wroteCert, err := writeFileAtomic(filepath.Join(dir, certName), certPEM, 0o644)
	if err != nil {
		return wroteKey, err
	}
	return wroteKey || wroteCert, nil
}

// writeFileAtomic replaces path with data unless it already holds exactly
// data. See writeCertDir.
func writeFileAtomic(path string, data []byte, mode fs.FileMode) (bool, error) {
	if cur, err := os.ReadFile(path); err == nil && bytes.Equal(cur, data) {
		return false, nil
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return false, dirErr(fmt.Errorf("write %s: %w", path, err))
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if _, err := f.Write(data); err != nil {
		return false, dirErr(fmt.Errorf("write %s: %w", tmp, err))
	}
	if err := f.Chmod(mode); err != nil {
		return false, dirErr(fmt.Errorf("chmod %s: %w", tmp, err))
	}
	if err := f.Sync(); err != nil {
		return false, dirErr(fmt.Errorf("sync %s: %w", tmp, err))
	}
	if err := f.Close(); err != nil {
		return false, dirErr(fmt.Errorf("close %s: %w", tmp, err))
	}
	if err := os.Rename(tmp, path); err != nil {
		return false, dirErr(fmt.Errorf("rename %s to %s: %w", tmp, path, err))
	}
	ok = true
	return true, nil
}

func dirErr(err error) error {
	if errors.Is(err, syscall.EROFS) {
		return fmt.Errorf("%w: %w", errReadOnlyDir, err)
	}
	return err
}
