package image

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// entry is what a test expects of one tar entry of the layer.
type entry struct {
	typ      byte
	mode     int64
	uid, gid int
	data     string
}

// readBack opens archive with go-containerregistry as ref (failing when
// the tag is not in it) and returns its config and single layer's entries.
func readBack(t *testing.T, archive, ref string) (*v1.ConfigFile, map[string]entry) {
	t.Helper()
	tag, err := name.NewTag(ref, name.StrictValidation)
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(archive, &tag)
	if err != nil {
		t.Fatalf("read %s as %s: %v", archive, ref, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 1 {
		t.Fatalf("%d layers, want 1", len(layers))
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	got := map[string]entry{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if _, dup := got[h.Name]; dup {
			t.Errorf("entry %s twice", h.Name)
		}
		got[h.Name] = entry{typ: h.Typeflag, mode: h.Mode, uid: h.Uid, gid: h.Gid, data: string(b)}
	}
	return cf, got
}

// repoTags is manifest.json's RepoTags: what containerd's importer names
// the image after.
func repoTags(t *testing.T, archive string) []string {
	t.Helper()
	m, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(archive) })
	if err != nil {
		t.Fatal(err)
	}
	if len(m) != 1 {
		t.Fatalf("manifest.json has %d images, want 1", len(m))
	}
	return m[0].RepoTags
}

func TestWrite(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "prog")
	if err := os.WriteFile(src, []byte("#!binary"), 0o600); err != nil {
		t.Fatal(err)
	}
	files := append(BaseFiles(),
		File{Path: "/usr/bin/prog", Mode: 0o755, Source: src},
		File{Path: "/etc/app/conf", Data: []byte("k=v\n")}, // Mode 0 means 0644
		File{Path: "/var/run/app", Mode: os.ModeDir | 0o750, UID: 65532, GID: 65532},
		File{Path: "/opt/empty", Data: []byte{}},
	)
	cfg := Config{
		Entrypoint: []string{"/usr/bin/prog"},
		Cmd:        []string{"serve", "--x"},
		Env:        []string{"A=1"},
		User:       NonRoot,
		WorkingDir: "/var/run/app",
		Labels:     map[string]string{"l": "v"},
	}
	archive := filepath.Join(dir, "img.tar")
	const ref = "kadmit.test/sub/prog:v1.2"
	if err := Write(archive, ref, files, cfg); err != nil {
		t.Fatal(err)
	}
	if got := repoTags(t, archive); !reflect.DeepEqual(got, []string{ref}) {
		t.Errorf("RepoTags %q, want [%q]", got, ref)
	}
	cf, got := readBack(t, archive, ref)
	if cf.OS != "linux" || cf.Architecture != runtime.GOARCH {
		t.Errorf("platform %s/%s", cf.OS, cf.Architecture)
	}
	c := cf.Config
	if !reflect.DeepEqual(c.Entrypoint, cfg.Entrypoint) || !reflect.DeepEqual(c.Cmd, cfg.Cmd) ||
		!reflect.DeepEqual(c.Env, cfg.Env) || c.User != cfg.User || c.WorkingDir != cfg.WorkingDir ||
		!reflect.DeepEqual(c.Labels, cfg.Labels) {
		t.Errorf("config %+v, want %+v", c, cfg)
	}
	want := map[string]entry{
		"etc/":          {typ: tar.TypeDir, mode: 0o755},
		"etc/passwd":    {typ: tar.TypeReg, mode: 0o644, data: Passwd},
		"etc/group":     {typ: tar.TypeReg, mode: 0o644, data: Group},
		"etc/app/":      {typ: tar.TypeDir, mode: 0o755},
		"etc/app/conf":  {typ: tar.TypeReg, mode: 0o644, data: "k=v\n"},
		"home/":         {typ: tar.TypeDir, mode: 0o755},
		"home/nonroot/": {typ: tar.TypeDir, mode: 0o700, uid: 65532, gid: 65532},
		"tmp/":          {typ: tar.TypeDir, mode: 0o1777},
		"usr/":          {typ: tar.TypeDir, mode: 0o755},
		"usr/bin/":      {typ: tar.TypeDir, mode: 0o755},
		"usr/bin/prog":  {typ: tar.TypeReg, mode: 0o755, data: "#!binary"},
		"var/":          {typ: tar.TypeDir, mode: 0o755},
		"var/run/":      {typ: tar.TypeDir, mode: 0o755},
		"var/run/app/":  {typ: tar.TypeDir, mode: 0o750, uid: 65532, gid: 65532},
		"opt/":          {typ: tar.TypeDir, mode: 0o755},
		"opt/empty":     {typ: tar.TypeReg, mode: 0o644},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("layer entries\n got %+v\nwant %+v", got, want)
	}

	// The same input gives the same archive: an unchanged image re-imports
	// as the same ID.
	again := filepath.Join(dir, "again.tar")
	if err := Write(again, ref, files, cfg); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(archive)
	b, _ := os.ReadFile(again)
	if string(a) != string(b) {
		t.Error("two writes of the same image differ")
	}

	// Retag: same image (same config digest, i.e. image ID), new name only.
	re := filepath.Join(dir, "re.tar")
	const ref2 = "kadmit.test/sub/prog:v1.3"
	if err := Retag(archive, re, ref2); err != nil {
		t.Fatal(err)
	}
	if got := repoTags(t, re); !reflect.DeepEqual(got, []string{ref2}) {
		t.Errorf("retagged RepoTags %q", got)
	}
	if id1, id2 := configDigest(t, archive), configDigest(t, re); id1 != id2 {
		t.Errorf("retag changed the image ID: %s -> %s", id1, id2)
	}
}

func configDigest(t *testing.T, archive string) v1.Hash {
	t.Helper()
	img, err := tarball.ImageFromPath(archive, nil)
	if err != nil {
		t.Fatal(err)
	}
	h, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestWriteRejects(t *testing.T) {
	dir := t.TempDir()
	ok := []File{{Path: "/a", Data: []byte("a")}}
	for ref, why := range map[string]string{
		"pause:1":                    "no registry: containerd says docker.io/library/pause:1",
		"kadmit/pause:1":             "no registry: the first part has no dot",
		"kadmit.test/pause":          "no tag",
		"docker.io/library/pause:1":  "Docker Hub",
		"index.docker.io/x/pause:1":  "Docker Hub",
		"kadmit.test/Pause:1":        "upper case",
		"kadmit.test/pause@sha256:0": "digest",
	} {
		if err := Write(filepath.Join(dir, "x.tar"), ref, ok, Config{}); err == nil {
			t.Errorf("Write accepted %q (%s)", ref, why)
		}
	}
	for _, files := range [][]File{
		{{Path: "a", Data: []byte("x")}},
		{{Path: "/a/../b", Data: []byte("x")}},
		{{Path: "/a", Data: []byte("x")}, {Path: "/a", Data: []byte("y")}},
		{{Path: "/a"}},
		{{Path: "/a", Source: filepath.Join(dir, "missing")}},
		{{Path: "/a", Data: []byte("x")}, {Path: "/a/b", Data: []byte("y")}},
	} {
		if err := Write(filepath.Join(dir, "x.tar"), "kadmit.test/x:1", files, Config{}); err == nil {
			t.Errorf("Write accepted files %+v", files)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "x.tar")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a failed Write left an archive: %v", err)
	}
	for _, ref := range []string{"localhost/x:1", "localhost:5000/x/y:tag", "kadmit.test/pause:1"} {
		if _, err := ParseRef(ref); err != nil {
			t.Errorf("ParseRef(%q): %v", ref, err)
		}
	}
}

func TestBuildGoStatic(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a Go program")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	mod, err := TestModuleDir(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(mod, "go.mod")); err != nil || !strings.Contains(string(b), "module github.com/kadmit/kadmit/test\n") {
		t.Fatalf("TestModuleDir %s: not the test module (%v)", mod, err)
	}
	out := filepath.Join(t.TempDir(), "pause")
	if err := BuildGo(ctx, mod, "./cluster/pause", out); err != nil {
		t.Fatal(err)
	}
	// CheckStatic is not vacuous: a dynamically linked executable (the go
	// command's own tests do not matter; any dynamic ELF on the host does).
	for _, dyn := range []string{"/bin/sh", "/usr/bin/env"} {
		if _, err := os.Stat(dyn); err == nil {
			if err := CheckStatic(dyn); err == nil {
				t.Errorf("CheckStatic accepted %s", dyn)
			}
			break
		}
	}
	if err := BuildGo(ctx, mod, "./no/such/package", out); err == nil {
		t.Error("BuildGo of a missing package succeeded")
	}
}

func TestPauseAndForeign(t *testing.T) {
	if testing.Short() {
		t.Skip("builds Go programs")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	for _, tc := range []struct {
		build func(context.Context, string) (string, error)
		ref   string
		prog  string
		user  string
	}{
		{Pause, PauseRef, "pause", ""},
		{Foreign, ForeignRef, "foreign", NonRoot},
	} {
		archive, err := tc.build(ctx, dir)
		if err != nil {
			t.Fatal(err)
		}
		if got := repoTags(t, archive); !reflect.DeepEqual(got, []string{tc.ref}) {
			t.Errorf("%s: RepoTags %q", tc.prog, got)
		}
		cf, files := readBack(t, archive, tc.ref)
		if !reflect.DeepEqual(cf.Config.Entrypoint, []string{"/" + tc.prog}) || cf.Config.User != tc.user {
			t.Errorf("%s: entrypoint %q user %q", tc.prog, cf.Config.Entrypoint, cf.Config.User)
		}
		bin := files[tc.prog]
		if bin.typ != tar.TypeReg || bin.mode != 0o755 || !strings.HasPrefix(bin.data, "\x7fELF") {
			t.Errorf("%s: /%s is %c %o, %d bytes", tc.prog, tc.prog, bin.typ, bin.mode, len(bin.data))
		}
		if !strings.Contains(files["etc/passwd"].data, "nonroot:x:65532:65532:") || !strings.Contains(files["etc/passwd"].data, "root:x:0:0:") ||
			!strings.Contains(files["etc/group"].data, "nonroot:x:65532:") {
			t.Errorf("%s: /etc/passwd or /etc/group lacks root or nonroot", tc.prog)
		}
	}
}

// TestWriteJSONShape guards what containerd's docker-archive importer
// reads: manifest.json entries with Config, RepoTags and Layers.
func TestWriteJSONShape(t *testing.T) {
	archive := filepath.Join(t.TempDir(), "x.tar")
	if err := Write(archive, "kadmit.test/x:1", []File{{Path: "/x", Data: []byte("x")}}, Config{}); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("no manifest.json: %v", err)
		}
		if h.Name != "manifest.json" {
			continue
		}
		var m []map[string]any
		if err := json.NewDecoder(tr).Decode(&m); err != nil {
			t.Fatal(err)
		}
		if len(m) != 1 || m[0]["Config"] == nil || m[0]["Layers"] == nil || m[0]["RepoTags"] == nil {
			t.Fatalf("manifest.json %v", m)
		}
		return
	}
}

// TestLayerOrder: every directory comes before any file, each parent
// before its children, whether listed or implied, so an extracting
// snapshotter never creates a directory with a default mode first.
func TestLayerOrder(t *testing.T) {
	b, err := layerBytes([]File{
		{Path: "/z", Data: []byte("z")},
		{Path: "/a/b/c", Mode: os.ModeDir | 0o700},
		{Path: "/a/b/c/f", Data: []byte("f")},
		{Path: "/a", Mode: os.ModeDir | 0o711},
		{Path: "/a-b/g", Data: []byte("g")},
	})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	tr := tar.NewReader(strings.NewReader(string(b)))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
	}
	want := []string{"a/", "a-b/", "a/b/", "a/b/c/", "z", "a/b/c/f", "a-b/g"}
	if !reflect.DeepEqual(names, want) {
		t.Errorf("entries %q, want %q", names, want)
	}
}
