package webhookcerts

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// loadDir reads CertDir's pair.
func loadDir(dir string) (*tls.Certificate, error) {
	certPEM, err := os.ReadFile(filepath.Join(dir, DefaultCertName))
	if err != nil {
		return nil, err
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, DefaultKeyName))
	if err != nil {
		return nil, err
	}
	return ParseKeyPair(certPEM, keyPEM)
}

func stat(t *testing.T, path string) os.FileInfo {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi
}

// CertDir files are replaced by rename (a new inode, never a partial
// write), only when their content changes, with the key private, and no
// temporary file is left behind.
func TestWriteCertDirAtomic(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "serving-certs") // created on demand
	spec := Spec{DNSNames: []string{"hook.sys.svc"}, ServingValidity: time.Hour, CAValidity: 2 * time.Hour}
	m1, err := NewMaterial(spec, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	d1 := m1.SecretData()
	wrote, err := writeCertDir(dir, "tls.crt", "tls.key", d1[SecretCertKey], d1[SecretKeyKey])
	if err != nil || !wrote {
		t.Fatalf("first write: wrote=%v err=%v", wrote, err)
	}
	got, err := loadDir(dir)
	if err != nil || !got.Leaf.Equal(m1.Serving.Leaf) {
		t.Fatalf("CertDir does not hold the pair: %v", err)
	}
	if fi, _ := os.Stat(filepath.Join(dir, "tls.key")); fi.Mode().Perm() != 0o600 {
		t.Errorf("key mode %v, want 0600", fi.Mode().Perm())
	}
	if fi, _ := os.Stat(filepath.Join(dir, "tls.crt")); fi.Mode().Perm() != 0o644 {
		t.Errorf("cert mode %v, want 0644", fi.Mode().Perm())
	}
	first := stat(t, filepath.Join(dir, "tls.crt"))

	// Same content: nothing written, same file.
	wrote, err = writeCertDir(dir, "tls.crt", "tls.key", d1[SecretCertKey], d1[SecretKeyKey])
	if err != nil || wrote {
		t.Fatalf("unchanged write: wrote=%v err=%v", wrote, err)
	}
	if !os.SameFile(stat(t, filepath.Join(dir, "tls.crt")), first) {
		t.Fatal("unchanged content was rewritten")
	}

	// New content: a new file renamed over the old one.
	m2, err := m1.WithServing(spec, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	d2 := m2.SecretData()
	if wrote, err = writeCertDir(dir, "tls.crt", "tls.key", d2[SecretCertKey], d2[SecretKeyKey]); err != nil || !wrote {
		t.Fatalf("changed write: wrote=%v err=%v", wrote, err)
	}
	if os.SameFile(stat(t, filepath.Join(dir, "tls.crt")), first) {
		t.Fatal("changed content written in place, not renamed")
	}
	if got, err = loadDir(dir); err != nil || !got.Leaf.Equal(m2.Serving.Leaf) {
		t.Fatalf("CertDir does not hold the new pair: %v", err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Fatalf("CertDir holds %v, want tls.crt and tls.key only", names)
	}
}

func TestWriteCertDirError(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// A CertDir below a regular file cannot be created.
	if _, err := writeCertDir(filepath.Join(file, "dir"), "tls.crt", "tls.key", []byte("c"), []byte("k")); err == nil {
		t.Fatal("want an error")
	}
}
