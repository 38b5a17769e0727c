package kadmitimage

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/kadmit/kadmit/test/cluster/image"
	"github.com/kadmit/kadmit/test/deploy/chart"
	"github.com/kadmit/kadmit/test/deploy/dockerfile"
)

func parse(t *testing.T, df string) []dockerfile.Stage {
	t.Helper()
	st, err := dockerfile.Parse(strings.NewReader(df))
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestParseFinalStage(t *testing.T) {
	spec, err := ParseFinalStage(parse(t, `FROM golang AS build
RUN true
FROM gcr.io/distroless/static-debian12:nonroot
WORKDIR /app
COPY --from=build /src/out/x bin/
ENV A="1"
LABEL "k"=v
USER 1000:1000
CMD ["base"]
ENTRYPOINT ["/app/bin/x"]
CMD ["serve", "--y"]
`))
	if err != nil {
		t.Fatal(err)
	}
	want := Spec{
		Base:   "gcr.io/distroless/static-debian12:nonroot",
		Copies: []Copy{{Stage: "build", Src: "/src/out/x", Dest: "/app/bin/x"}},
		Config: image.Config{
			Entrypoint: []string{"/app/bin/x"},
			Cmd:        []string{"serve", "--y"},
			Env:        []string{BaseConfig("").Env[0], BaseConfig("").Env[1], "A=1"},
			User:       "1000:1000",
			WorkingDir: "/app",
			Labels:     map[string]string{"k": "v"},
		},
	}
	if !reflect.DeepEqual(spec, want) {
		t.Errorf("spec\n got %+v\nwant %+v", spec, want)
	}

	for df, why := range map[string]string{
		"FROM golang AS build\nFROM gcr.io/distroless/static\nCOPY --from=build /a /a\nRUN true\n":           "RUN",
		"FROM golang AS build\nFROM gcr.io/distroless/static\nCOPY --from=build /a /a\nENTRYPOINT /a\n":      "shell form",
		"FROM golang AS build\nFROM gcr.io/distroless/static\nCOPY --from=build /a /a\nCMD /a serve\n":       "shell form",
		"FROM golang AS build\nFROM gcr.io/distroless/static\nCOPY a /a\n":                                   "from the context",
		"FROM golang AS build\nFROM gcr.io/distroless/static\nCOPY --from=other /a /a\n":                     "unknown stage",
		"FROM golang AS build\nFROM gcr.io/distroless/static\nCOPY --from=build --chmod=0700 /a /a\n":        "COPY flag",
		"FROM golang AS build\nFROM gcr.io/distroless/static\nUSER 1\n":                                      "nothing copied",
		"FROM golang AS build\nFROM alpine\nCOPY --from=build /a /a\n":                                       "base",
		"FROM golang AS build\nFROM gcr.io/distroless/static\nCOPY --from=build /a /a\nHEALTHCHECK CMD /a\n": "HEALTHCHECK",
	} {
		if _, err := ParseFinalStage(parse(t, df)); err == nil {
			t.Errorf("accepted (%s):\n%s", why, df)
		}
	}
}

// TestBuild builds kadmit's image from the repository's Dockerfile, reads
// it back, runs the binary it holds, and retags it.
func TestBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the Dockerfile's build stage (30-60 s)")
	}
	root, err := chart.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	work := t.TempDir()
	archive, ref, err := Build(ctx, root, work, "t1")
	if err != nil {
		t.Fatal(err)
	}
	if ref != "kadmit.test/kadmit:t1" || archive != filepath.Join(work, "kadmit-t1.tar") {
		t.Fatalf("Build = %s, %s", archive, ref)
	}
	tag, err := name.NewTag(ref, name.StrictValidation)
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(archive, &tag)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	// What the Dockerfile's final stage says (TestDockerfile pins these
	// values to the chart's expectations).
	c := cf.Config
	if c.User != "65532:65532" || !reflect.DeepEqual(c.Entrypoint, []string{"/kadmit"}) || !reflect.DeepEqual(c.Cmd, []string{"serve"}) {
		t.Errorf("config user %q entrypoint %q cmd %q", c.User, c.Entrypoint, c.Cmd)
	}
	if c.WorkingDir != "/home/nonroot" || !slices.Contains(c.Env, "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt") {
		t.Errorf("config workdir %q env %q: not distroless nonroot's", c.WorkingDir, c.Env)
	}

	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers %d, %v", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	type entry struct {
		mode int64
		data []byte
	}
	files := map[string]entry{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		files[h.Name] = entry{h.Mode, b}
	}
	bin := files["kadmit"]
	if bin.mode != 0o755 || !bytes.HasPrefix(bin.data, []byte("\x7fELF")) {
		t.Fatalf("/kadmit mode %o, %d bytes", bin.mode, len(bin.data))
	}
	if !bytes.Contains(files["etc/passwd"].data, []byte("nonroot:x:65532:65532:")) || !bytes.Contains(files["etc/group"].data, []byte("nonroot:x:65532:")) {
		t.Error("/etc/passwd or /etc/group lacks nonroot")
	}
	if files["tmp/"].mode != 0o1777 {
		t.Errorf("/tmp mode %o", files["tmp/"].mode)
	}
	host, _ := os.ReadFile(HostCACertificates)
	if ca := files["etc/ssl/certs/ca-certificates.crt"]; len(host) == 0 || !bytes.Equal(ca.data, host) {
		t.Errorf("CA bundle %d bytes, host's %d", len(ca.data), len(host))
	}
	// The binary in the image is the one built with VERSION=tag, and it runs.
	exe := filepath.Join(work, "kadmit-from-image")
	if err := os.WriteFile(exe, bin.data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := dockerfile.CheckStatic(exe); err != nil {
		t.Error(err)
	}
	if out, err := exec.CommandContext(ctx, exe, "version").CombinedOutput(); err != nil || !strings.Contains(string(out), "t1") {
		t.Errorf("kadmit version: %v\n%s", err, out)
	}

	// A second tag costs no build and is the same image.
	start := time.Now()
	archive2, ref2, err := Retag(archive, "t2")
	if err != nil {
		t.Fatal(err)
	}
	if ref2 != "kadmit.test/kadmit:t2" || archive2 != filepath.Join(work, "kadmit-t2.tar") {
		t.Fatalf("Retag = %s, %s", archive2, ref2)
	}
	tag2, _ := name.NewTag(ref2, name.StrictValidation)
	img2, err := tarball.ImageFromPath(archive2, &tag2)
	if err != nil {
		t.Fatal(err)
	}
	id1, _ := img.ConfigName()
	id2, _ := img2.ConfigName()
	if id1 != id2 {
		t.Errorf("retag changed the image ID: %s -> %s", id1, id2)
	}
	t.Logf("retag took %s", time.Since(start))
}
