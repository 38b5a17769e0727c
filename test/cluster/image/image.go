// Package image builds single-layer container image archives that
// containerd imports with `ctr -n k8s.io images import <archive>`, so a
// test cluster runs images without a registry or a container engine.
//
// The archive is a docker-archive tarball (what `docker save` writes:
// manifest.json with RepoTags, the config, one gzip layer) produced by
// github.com/google/go-containerregistry; only the layer's tar stream is
// assembled here, from a list of files.
//
// # Naming
//
// containerd's importer reads the archive's RepoTags and normalises each
// with the Docker reference rules (reference/docker.ParseDockerRef): a name
// whose first component has no "." or ":" and is not "localhost" is put
// under docker.io/library/, and a missing tag becomes ":latest". The CRI
// plugin normalises the image of a pod spec with the same rules, so the
// pod and the import agree whatever the form; but `ctr images ls`, the
// kubelet's logs and containerd's pinned sandbox image show the normalised
// name. Write therefore only accepts references that are already in
// normal form and not on Docker Hub — registry.with.dot/path:tag, such as
// "kadmit.test/pause:1" — so the name in containerd is byte for byte the
// string a pod spec carries. Use imagePullPolicy IfNotPresent or Never:
// kadmit.test does not resolve, there is no registry to pull from.
//
// Import into the namespace the CRI plugin reads, and without --base-name
// (which keeps only the images under that prefix):
//
//	ctr --address <sock> -n k8s.io images import <archive>
//
// ctr unpacks for the default snapshotter on import. TestContainerdImport
// checks all of this against a real containerd when one is built.
package image

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// File is one entry of the image's single layer.
type File struct {
	// Path is absolute inside the image ("/etc/passwd"). Parent directories
	// that are not listed are created 0755 root:root.
	Path string
	// Mode holds the permission bits, plus os.ModeDir for a directory and
	// os.ModeSticky, os.ModeSetuid or os.ModeSetgid when wanted ("/tmp" is
	// os.ModeDir|os.ModeSticky|0o777). Zero means 0644 for a file.
	Mode os.FileMode
	// Data is the file's content. When nil (and the entry is not a
	// directory) the content is read from Source on the host.
	Data []byte
	// Source is a host path read when Data is nil.
	Source string
	// UID and GID own the entry; zero is root.
	UID, GID int
}

// Config is the part of the image configuration a pod cares about; the
// fields mean what they mean in a Dockerfile (ENTRYPOINT, CMD, ENV, USER,
// WORKDIR, LABEL).
type Config struct {
	Entrypoint, Cmd, Env []string
	User, WorkingDir     string
	Labels               map[string]string
}

// layerTime is every entry's mtime and the image's creation time: a fixed
// value keeps archives of the same files identical (same layer digest), so
// re-importing an unchanged image is a no-op in containerd.
var layerTime = time.Unix(0, 0).UTC()

// Write writes a docker-archive tarball to archive (created or replaced)
// holding one image tagged ref, for linux on the host's architecture, with
// one layer made of files and the given configuration.
//
// ref must be in the normal form containerd stores (see the package
// documentation): a registry host with a "." or ":" (or "localhost"), a
// repository and an explicit tag, and must not be on Docker Hub; otherwise
// Write returns an error without writing. Other errors: a duplicate or
// relative path, an unreadable Source, or a failure writing archive.
func Write(archive, ref string, files []File, cfg Config) error {
	tag, err := ParseRef(ref)
	if err != nil {
		return err
	}
	img, err := build(files, cfg)
	if err != nil {
		return fmt.Errorf("image %s: %w", ref, err)
	}
	return writeArchive(archive, tag, img)
}

// Retag writes to archive (created or replaced) the image of the
// single-image archive src under ref, checked as Write checks it. Layers
// and configuration are copied unchanged, so the image ID is the same: a
// second tag for a `helm upgrade` scenario without rebuilding anything.
func Retag(src, archive, ref string) error {
	tag, err := ParseRef(ref)
	if err != nil {
		return err
	}
	img, err := tarball.ImageFromPath(src, nil)
	if err != nil {
		return fmt.Errorf("retag: read %s: %w", src, err)
	}
	return writeArchive(archive, tag, img)
}

// ParseRef checks that ref is a tag reference that containerd keeps as
// written (see the package documentation) and returns it parsed.
func ParseRef(ref string) (name.Tag, error) {
	tag, err := name.NewTag(ref, name.StrictValidation)
	if err != nil {
		return name.Tag{}, fmt.Errorf("image reference %q: %w", ref, err)
	}
	if tag.Name() != ref {
		return name.Tag{}, fmt.Errorf("image reference %q: containerd would store it as %q; write it in that form", ref, tag.Name())
	}
	if reg := tag.RegistryStr(); reg == name.DefaultRegistry || reg == "docker.io" {
		return name.Tag{}, fmt.Errorf("image reference %q: Docker Hub names are rewritten (docker.io/library/...); use a registry of your own such as kadmit.test", ref)
	}
	return tag, nil
}

func writeArchive(archive string, tag name.Tag, img v1.Image) error {
	// Write next to the target and rename, so an interrupted write never
	// leaves a truncated archive that a later import would choke on.
	tmp, err := os.CreateTemp(filepath.Dir(archive), ".image-*.tar")
	if err != nil {
		return fmt.Errorf("image %s: %w", tag, err)
	}
	defer os.Remove(tmp.Name())
	if err := tarball.Write(tag, img, tmp); err != nil {
		tmp.Close()
		return fmt.Errorf("image %s: write %s: %w", tag, archive, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("image %s: write %s: %w", tag, archive, err)
	}
	if err := os.Rename(tmp.Name(), archive); err != nil {
		return fmt.Errorf("image %s: %w", tag, err)
	}
	return nil
}

func build(files []File, cfg Config) (v1.Image, error) {
	layerTar, err := layerBytes(files)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithCompressedCaching)
	if err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	// containerd imports only the content matching its platform unless told
	// otherwise, so the config must name one.
	cf.OS = "linux"
	cf.Architecture = runtime.GOARCH
	cf.Created = v1.Time{Time: layerTime}
	cf.Config = v1.Config{
		Entrypoint: cfg.Entrypoint,
		Cmd:        cfg.Cmd,
		Env:        cfg.Env,
		User:       cfg.User,
		WorkingDir: cfg.WorkingDir,
		Labels:     cfg.Labels,
	}
	return mutate.ConfigFile(img, cf)
}

// layerBytes is the uncompressed tar stream of the layer: every
// directory first (listed or implied), sorted so a parent precedes its
// children, then the files in the order given; names relative as in the
// layers docker builds ("etc/passwd").
func layerBytes(files []File) ([]byte, error) {
	listed := map[string]File{}
	for _, f := range files {
		if !path.IsAbs(f.Path) || path.Clean(f.Path) != f.Path || f.Path == "/" {
			return nil, fmt.Errorf("path %q: want a clean absolute path other than /", f.Path)
		}
		if _, dup := listed[f.Path]; dup {
			return nil, fmt.Errorf("path %q listed twice", f.Path)
		}
		listed[f.Path] = f
	}
	dirs := map[string]File{}
	var regular []File
	for _, f := range files {
		if f.Mode.IsDir() {
			dirs[f.Path] = f
		} else {
			regular = append(regular, f)
		}
		for d := path.Dir(f.Path); d != "/"; d = path.Dir(d) {
			if p, ok := listed[d]; ok && !p.Mode.IsDir() {
				return nil, fmt.Errorf("path %q: its parent %q is listed as a file", f.Path, d)
			}
			if _, ok := dirs[d]; !ok && listed[d].Path == "" {
				dirs[d] = File{Path: d, Mode: os.ModeDir | 0o755}
			}
		}
	}

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, d := range slices.Sorted(maps.Keys(dirs)) {
		if err := tw.WriteHeader(header(dirs[d], 0)); err != nil {
			return nil, err
		}
	}
	for _, f := range regular {
		data := f.Data
		if data == nil {
			if f.Source == "" {
				return nil, fmt.Errorf("path %q: neither Data nor Source", f.Path)
			}
			b, err := os.ReadFile(f.Source)
			if err != nil {
				return nil, fmt.Errorf("path %q: %w", f.Path, err)
			}
			data = b
		}
		if err := tw.WriteHeader(header(f, int64(len(data)))); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func header(f File, size int64) *tar.Header {
	h := &tar.Header{
		Name:    strings.TrimPrefix(f.Path, "/"),
		Uid:     f.UID,
		Gid:     f.GID,
		ModTime: layerTime,
		Format:  tar.FormatPAX,
	}
	perm := f.Mode.Perm()
	if f.Mode.IsDir() {
		h.Typeflag = tar.TypeDir
		h.Name += "/"
	} else {
		h.Typeflag = tar.TypeReg
		h.Size = size
		if f.Mode&(os.ModePerm|os.ModeSetuid|os.ModeSetgid|os.ModeSticky) == 0 {
			perm = 0o644
		}
	}
	// tar keeps the special bits in the classic Unix positions, not where
	// os.FileMode keeps them.
	h.Mode = int64(perm)
	if f.Mode&os.ModeSetuid != 0 {
		h.Mode |= 0o4000
	}
	if f.Mode&os.ModeSetgid != 0 {
		h.Mode |= 0o2000
	}
	if f.Mode&os.ModeSticky != 0 {
		h.Mode |= 0o1000
	}
	return h
}

// Passwd and Group are distroless static's /etc/passwd and /etc/group:
// root, nobody and nonroot (65532), the user kadmit's chart runs as.
const (
	Passwd = "root:x:0:0:root:/root:/sbin/nologin\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n" +
		"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
	Group = "root:x:0:\n" +
		"nobody:x:65534:\n" +
		"tty:x:5:\n" +
		"staff:x:50:\n" +
		"nonroot:x:65532:\n"
)

// NonRoot is the numeric user and group of distroless's nonroot, in USER
// form.
const NonRoot = "65532:65532"

// BaseFiles is what every image here carries from distroless static
// besides CA certificates: /etc/passwd, /etc/group, /home/nonroot (0700,
// owned by nonroot) and /tmp (1777), so programs that look their user up
// or write a temporary file behave as on distroless.
func BaseFiles() []File {
	return []File{
		{Path: "/etc/passwd", Mode: 0o644, Data: []byte(Passwd)},
		{Path: "/etc/group", Mode: 0o644, Data: []byte(Group)},
		{Path: "/home/nonroot", Mode: os.ModeDir | 0o700, UID: 65532, GID: 65532},
		{Path: "/tmp", Mode: os.ModeDir | os.ModeSticky | 0o777},
	}
}

// BuildGo builds package pkg (an import path or a ./relative path) of the
// module in moduleDir into the file out, the way kadmit's Dockerfile does:
// CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags "-s -w". It then
// checks that out is static (CheckStatic), since images here have no libc.
// Errors carry the go command's output.
func BuildGo(ctx context.Context, moduleDir, pkg, out string) error {
	abs, err := filepath.Abs(out)
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", "-s -w", "-o", abs, pkg)
	cmd.Dir = moduleDir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s in %s: %w\n%s", pkg, moduleDir, err, b)
	}
	return CheckStatic(abs)
}

// CheckStatic returns an error unless p is an ELF executable with no
// program interpreter (PT_INTERP) and no dynamic section: it needs no
// loader and no shared libraries, so it runs in an image with no libc.
func CheckStatic(p string) error {
	f, err := elf.Open(p)
	if err != nil {
		return fmt.Errorf("check static: %w", err)
	}
	defer f.Close()
	for _, prog := range f.Progs {
		switch prog.Type {
		case elf.PT_INTERP:
			return fmt.Errorf("%s has a program interpreter (dynamically linked)", p)
		case elf.PT_DYNAMIC:
			return fmt.Errorf("%s has a dynamic section", p)
		}
	}
	return nil
}

// The images of the programs in test/cluster/pause and test/cluster/foreign.
const (
	// PauseRef is the pod sandbox image (containerd's sandbox image) and the
	// namespace holders' program.
	PauseRef = "kadmit.test/pause:1"
	// ForeignRef is "another controller's webhook", run as nonroot.
	ForeignRef = "kadmit.test/foreign-webhook:1"
)

// Pause builds test/cluster/pause and writes workDir/pause.tar, image
// PauseRef: /pause as the entrypoint, run as root (a sandbox's pause must
// be able to reap anything in the pod), plus BaseFiles. It returns the
// archive's path.
func Pause(ctx context.Context, workDir string) (archive string, err error) {
	return program(ctx, workDir, "pause", PauseRef, "")
}

// Foreign builds test/cluster/foreign and writes workDir/foreign.tar,
// image ForeignRef: /foreign as the entrypoint (flags go in the pod's
// args), run as 65532:65532, plus BaseFiles. It returns the archive's
// path.
func Foreign(ctx context.Context, workDir string) (archive string, err error) {
	return program(ctx, workDir, "foreign", ForeignRef, NonRoot)
}

func program(ctx context.Context, workDir, prog, ref, user string) (string, error) {
	mod, err := TestModuleDir(ctx)
	if err != nil {
		return "", err
	}
	bin := filepath.Join(workDir, prog)
	if err := BuildGo(ctx, mod, "./cluster/"+prog, bin); err != nil {
		return "", err
	}
	archive := filepath.Join(workDir, prog+".tar")
	files := append(BaseFiles(), File{Path: "/" + prog, Mode: 0o755, Source: bin})
	cfg := Config{Entrypoint: []string{"/" + prog}, User: user}
	if err := Write(archive, ref, files, cfg); err != nil {
		return "", err
	}
	return archive, nil
}

// testModule is the module whose programs Pause and Foreign build.
const testModule = "github.com/kadmit/kadmit/test"

// TestModuleDir returns the directory of the module
// github.com/kadmit/kadmit/test: found from this source file's location
// when the binary was built without -trimpath (go test), else from
// `go list -m` in the working directory (which must be inside a module
// that has it: the test module itself or test/deploy).
func TestModuleDir(ctx context.Context) (string, error) {
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		// file is <module>/cluster/image/image.go
		dir := filepath.Dir(filepath.Dir(filepath.Dir(file)))
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && bytes.Contains(b, []byte("module "+testModule+"\n")) {
			return dir, nil
		}
	}
	out, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", testModule).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, ee.Stderr)
		}
		return "", fmt.Errorf("locate module %s: %w", testModule, err)
	}
	dir := strings.TrimSpace(string(out))
	if dir == "" {
		return "", fmt.Errorf("locate module %s: go list gave no directory", testModule)
	}
	return dir, nil
}

// CRINamespace is the containerd namespace the CRI plugin (and so the
// kubelet) sees images in.
const CRINamespace = "k8s.io"

// Import loads each archive into the containerd serving address (its
// gRPC socket) with ctr, the path of containerd's ctr: `ctr --address
// <address> -n k8s.io images import <archive>`, which names the image
// after the archive's reference and unpacks it for the default
// snapshotter. Errors carry ctr's output.
func Import(ctx context.Context, ctr, address string, archives ...string) error {
	for _, a := range archives {
		cmd := exec.CommandContext(ctx, ctr, "--address", address, "--namespace", CRINamespace, "images", "import", a)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("ctr images import %s: %w\n%s", a, err, out)
		}
	}
	return nil
}
