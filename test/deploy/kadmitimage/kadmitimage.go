// Package kadmitimage makes kadmit's container image the way the
// repository's Dockerfile does, without a container engine, as an archive
// that `ctr -n k8s.io images import` loads into a test cluster's
// containerd.
//
// The build stage runs as a script (package dockerfile) and yields the
// static binary. The final stage is read, not restated: its COPY
// --from=<stage>, USER, ENTRYPOINT, CMD, ENV, WORKDIR and LABEL lines make
// the image, so a Dockerfile change carries over; any other instruction
// there is an error.
//
// The final stage's base, gcr.io/distroless/static-debian12:nonroot, is
// recreated, not pulled (there is no registry here): the files of it that
// matter to kadmit are written into the same single layer — /etc/passwd
// and /etc/group with nonroot (65532), /home/nonroot, /tmp (1777) and
// /etc/ssl/certs/ca-certificates.crt copied from this machine — with the
// base's configuration (PATH, SSL_CERT_FILE, user 65532, working directory
// /home/nonroot) under the Dockerfile's own. Left out: tzdata, os-release,
// /etc/nsswitch.conf and the licence files, which kadmit does not read.
package kadmitimage

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"

	"github.com/kadmit/kadmit/test/cluster/image"
	"github.com/kadmit/kadmit/test/deploy/dockerfile"
)

// Repository is the name kadmit's image is written under; the image is
// Repository:<tag>, which containerd stores as written (see package image).
const Repository = "kadmit.test/kadmit"

// HostCACertificates is the host's CA bundle, copied to the same path in
// the image (distroless ships Debian's ca-certificates there too).
const HostCACertificates = "/etc/ssl/certs/ca-certificates.crt"

// Ref returns the image reference for tag: Repository + ":" + tag.
func Ref(tag string) string { return Repository + ":" + tag }

// Build runs the build stage of repoRoot's Dockerfile (30-60 s cold; ctx
// is checked between the stage and the image, a running stage is not
// interrupted) with VERSION=tag and TARGETARCH the host's, then writes
// workDir/kadmit-<tag>.tar holding image Ref(tag) as the final stage
// describes it on the recreated distroless base (see the package
// documentation). It returns the archive's path and the reference.
//
// Errors: the Dockerfile's final stage uses an instruction, a COPY flag
// or a shell-form ENTRYPOINT/CMD this emulation does not follow, its
// base is not distroless static, the build stage fails or its binary is
// not static, the host has no CA bundle, or tag makes an invalid
// reference.
func Build(ctx context.Context, repoRoot, workDir, tag string) (archive, ref string, err error) {
	ref = Ref(tag)
	if _, err := image.ParseRef(ref); err != nil {
		return "", "", err
	}
	df := filepath.Join(repoRoot, "Dockerfile")
	f, err := os.Open(df)
	if err != nil {
		return "", "", fmt.Errorf("kadmit image: %w", err)
	}
	stages, err := dockerfile.Parse(f)
	f.Close()
	if err != nil {
		return "", "", fmt.Errorf("kadmit image: parse %s: %w", df, err)
	}
	spec, err := ParseFinalStage(stages)
	if err != nil {
		return "", "", fmt.Errorf("kadmit image: %s: %w", df, err)
	}

	buildArgs := map[string]string{"VERSION": tag, "TARGETOS": "linux", "TARGETARCH": runtime.GOARCH}
	roots := map[string]string{} // stage name -> its emulated root
	files := BaseFiles()
	for _, c := range spec.Copies {
		if err := ctx.Err(); err != nil {
			return "", "", fmt.Errorf("kadmit image: %w", err)
		}
		root, ok := roots[c.Stage]
		if !ok {
			root = filepath.Join(workDir, "stage-"+c.Stage)
			if err := os.RemoveAll(root); err != nil {
				return "", "", fmt.Errorf("kadmit image: %w", err)
			}
			if err := os.MkdirAll(root, 0o755); err != nil {
				return "", "", fmt.Errorf("kadmit image: %w", err)
			}
			if _, err := dockerfile.RunStage(repoRoot, df, c.Stage, root, buildArgs); err != nil {
				return "", "", fmt.Errorf("kadmit image: build stage %q: %w", c.Stage, err)
			}
			roots[c.Stage] = root
		}
		src := filepath.Join(root, filepath.FromSlash(c.Src))
		st, err := os.Stat(src)
		if err != nil {
			return "", "", fmt.Errorf("kadmit image: COPY --from=%s %s: %w", c.Stage, c.Src, err)
		}
		if st.IsDir() {
			return "", "", fmt.Errorf("kadmit image: COPY --from=%s %s: a directory, not emulated", c.Stage, c.Src)
		}
		if err := dockerfile.CheckStatic(src); err != nil {
			return "", "", fmt.Errorf("kadmit image: %w", err)
		}
		// docker build keeps the source's mode; go build makes it 0755.
		files = slices.DeleteFunc(files, func(f image.File) bool { return f.Path == c.Dest })
		files = append(files, image.File{Path: c.Dest, Mode: st.Mode().Perm(), Source: src})
	}
	// docker build creates the WORKDIR; runc would too, but an image
	// inspected here should look as built.
	if wd := spec.Config.WorkingDir; wd != "" && wd != "/" &&
		!slices.ContainsFunc(files, func(f image.File) bool { return f.Path == wd }) {
		files = append(files, image.File{Path: wd, Mode: os.ModeDir | 0o755})
	}
	if err := ctx.Err(); err != nil {
		return "", "", fmt.Errorf("kadmit image: %w", err)
	}
	archive = filepath.Join(workDir, "kadmit-"+tag+".tar")
	if err := image.Write(archive, ref, files, spec.Config); err != nil {
		return "", "", fmt.Errorf("kadmit image: %w", err)
	}
	return archive, ref, nil
}

// Retag writes the image of archive (one Build made) as Ref(newTag) to
// kadmit-<newTag>.tar next to it, without building: same layers, same
// image ID, only the name differs, for a `helm upgrade` to a changed
// image tag. The binary still reports the VERSION it was built with. It
// returns the new archive's path and reference.
func Retag(archive, newTag string) (newArchive, ref string, err error) {
	ref = Ref(newTag)
	newArchive = filepath.Join(filepath.Dir(archive), "kadmit-"+newTag+".tar")
	if newArchive == archive {
		return archive, ref, nil
	}
	if err := image.Retag(archive, newArchive, ref); err != nil {
		return "", "", fmt.Errorf("kadmit image: %w", err)
	}
	return newArchive, ref, nil
}

// Copy is one COPY --from=<Stage> <Src> <Dest> of the final stage, with
// Src absolute in the stage's filesystem and Dest absolute in the image.
type Copy struct {
	Stage, Src, Dest string
}

// Spec is the final stage as this package builds it.
type Spec struct {
	// Base is the FROM image the files and defaults stand in for.
	Base   string
	Copies []Copy
	// Config holds the recreated base's defaults overridden by the
	// stage's USER, ENTRYPOINT, CMD, ENV, WORKDIR and LABEL.
	Config image.Config
}

// distrolessPrefix is the base the recreated files stand in for.
const distrolessPrefix = "gcr.io/distroless/static"

// ParseFinalStage reads the last stage of a parsed Dockerfile. It returns
// an error for a base other than distroless static, an instruction other
// than COPY --from, USER, ENTRYPOINT, CMD, ENV, WORKDIR, LABEL and ARG, a
// COPY with other flags or from the build context (the final stage has
// only the build stage's outputs here), ENTRYPOINT or CMD in shell form
// (distroless has no shell), or no COPY at all.
func ParseFinalStage(stages []dockerfile.Stage) (Spec, error) {
	if len(stages) == 0 {
		return Spec{}, fmt.Errorf("no stages")
	}
	st := stages[len(stages)-1]
	spec := Spec{Base: st.Base, Config: BaseConfig(st.Base)}
	if !strings.HasPrefix(st.Base, distrolessPrefix) {
		return Spec{}, fmt.Errorf("final stage FROM %s: only %s* is recreated", st.Base, distrolessPrefix)
	}
	names := map[string]bool{}
	for _, s := range stages[:len(stages)-1] {
		names[s.Name] = true
	}
	workdir := spec.Config.WorkingDir
	for _, in := range st.Instructions {
		switch in.Cmd {
		case "COPY":
			f := strings.Fields(in.Args)
			if len(f) != 3 || !strings.HasPrefix(f[0], "--from=") {
				return Spec{}, fmt.Errorf("line %d: COPY %s: only COPY --from=<stage> <file> <dest> is emulated", in.Line, in.Args)
			}
			from := strings.TrimPrefix(f[0], "--from=")
			if !names[from] {
				return Spec{}, fmt.Errorf("line %d: COPY --from=%s: not a stage of this Dockerfile", in.Line, from)
			}
			dest := f[2]
			if strings.HasSuffix(dest, "/") {
				dest = path.Join(dest, path.Base(f[1]))
			}
			if !path.IsAbs(dest) {
				dest = path.Join(workdir, dest)
			}
			spec.Copies = append(spec.Copies, Copy{Stage: from, Src: path.Clean(f[1]), Dest: path.Clean(dest)})
		case "USER":
			spec.Config.User = in.Args
		case "ENTRYPOINT", "CMD":
			var argv []string
			if err := json.Unmarshal([]byte(in.Args), &argv); err != nil {
				return Spec{}, fmt.Errorf("line %d: %s %s: want the exec (JSON) form, distroless has no shell: %w", in.Line, in.Cmd, in.Args, err)
			}
			if in.Cmd == "ENTRYPOINT" {
				// As in docker build: a new ENTRYPOINT clears the base's CMD.
				spec.Config.Entrypoint, spec.Config.Cmd = argv, nil
			} else {
				spec.Config.Cmd = argv
			}
		case "ENV":
			k, v, ok := strings.Cut(in.Args, "=")
			if !ok || strings.ContainsAny(k, " \t") {
				return Spec{}, fmt.Errorf("line %d: ENV %s: only one KEY=value per line is emulated", in.Line, in.Args)
			}
			spec.Config.Env = slices.DeleteFunc(spec.Config.Env, func(e string) bool { return strings.HasPrefix(e, k+"=") })
			spec.Config.Env = append(spec.Config.Env, k+"="+strings.Trim(v, `"`))
		case "WORKDIR":
			if path.IsAbs(in.Args) {
				workdir = path.Clean(in.Args)
			} else {
				workdir = path.Join(workdir, in.Args)
			}
			spec.Config.WorkingDir = workdir
		case "LABEL":
			k, v, ok := strings.Cut(in.Args, "=")
			if !ok || strings.ContainsAny(k, " \t") {
				return Spec{}, fmt.Errorf("line %d: LABEL %s: only one key=value per line is emulated", in.Line, in.Args)
			}
			if spec.Config.Labels == nil {
				spec.Config.Labels = map[string]string{}
			}
			spec.Config.Labels[strings.Trim(k, `"`)] = strings.Trim(v, `"`)
		case "ARG":
			// Only consumed by other instructions; none here expand them.
		default:
			return Spec{}, fmt.Errorf("line %d: %s in the final stage is not emulated", in.Line, in.Cmd)
		}
	}
	if len(spec.Copies) == 0 {
		return Spec{}, fmt.Errorf("final stage copies nothing from a build stage")
	}
	return spec, nil
}

// BaseConfig is the configuration distroless static sets, for base (the
// FROM argument): PATH and SSL_CERT_FILE, and for the :nonroot variants
// user 65532 and working directory /home/nonroot (root and / otherwise).
func BaseConfig(base string) image.Config {
	c := image.Config{Env: []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"SSL_CERT_FILE=" + HostCACertificates,
	}}
	if strings.HasSuffix(base, ":nonroot") || strings.Contains(base, ":nonroot-") {
		c.User, c.WorkingDir = "65532", "/home/nonroot"
	}
	return c
}

// BaseFiles are the recreated distroless files: image.BaseFiles (passwd,
// group, /home/nonroot, /tmp) and the host's CA bundle, read when the
// image is written.
func BaseFiles() []image.File {
	return append(image.BaseFiles(),
		image.File{Path: HostCACertificates, Mode: 0o644, Source: HostCACertificates})
}
