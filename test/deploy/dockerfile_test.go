package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kadmit/kadmit/test/deploy/chart"
	"github.com/kadmit/kadmit/test/deploy/dockerfile"
)

// TestDockerfile runs the build stage as a script, checks the binary is
// static and runs, and checks the final stage ships exactly that file on
// distroless static as nonroot.
func TestDockerfile(t *testing.T) {
	root, err := chart.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	df := filepath.Join(root, "Dockerfile")
	f, err := os.Open(df)
	if err != nil {
		t.Fatal(err)
	}
	stages, err := dockerfile.Parse(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if len(stages) != 2 || stages[0].Name != "build" {
		t.Fatalf("want a build stage and a final stage, got %+v", stages)
	}
	final := stages[1]
	if !strings.HasPrefix(final.Base, "gcr.io/distroless/static") || !strings.HasSuffix(final.Base, ":nonroot") {
		t.Errorf("final base %s, want distroless static nonroot", final.Base)
	}
	var copyFrom, user string
	for _, in := range final.Instructions {
		switch in.Cmd {
		case "COPY":
			copyFrom = in.Args
		case "USER":
			user = in.Args
		case "RUN":
			t.Errorf("final stage RUN %s: distroless has no shell", in.Args)
		}
	}
	if user != "65532:65532" {
		t.Errorf("USER %q, want 65532:65532 (the chart's runAsUser)", user)
	}

	res, err := dockerfile.RunStage(root, df, "build", t.TempDir(), map[string]string{"VERSION": "v9.9.9-test"})
	if err != nil {
		t.Fatal(err)
	}
	// The final stage copies /src/out/kadmit: it must be what the build made.
	fields := strings.Fields(copyFrom)
	if len(fields) != 3 || fields[0] != "--from=build" {
		t.Fatalf("final COPY %q", copyFrom)
	}
	bin := filepath.Join(res.Root, filepath.FromSlash(fields[1]))
	if err := dockerfile.CheckStatic(bin); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "v9.9.9-test") {
		t.Fatalf("built binary `version`: %v\n%s", err, out)
	}
	// The build context left out what it does not need.
	for _, rel := range []string{"src/internal/uninstall/uninstall_test.go", "src/bin", "src/test", "src/.git"} {
		if _, err := os.Stat(filepath.Join(res.Root, rel)); err == nil {
			t.Errorf("%s copied into the build stage despite .dockerignore", rel)
		}
	}

	// A cgo build is what CheckStatic must catch (the check is not vacuous).
	if _, err := exec.LookPath("gcc"); err == nil {
		dyn := filepath.Join(t.TempDir(), "dyn")
		cmd := exec.Command("go", "build", "-o", dyn, "./cmd/kadmit")
		cmd.Dir = root
		cmd.Env = append(slices.Clone(os.Environ()), "CGO_ENABLED=1")
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("cgo build: %v\n%s", err, b)
		}
		if err := dockerfile.CheckStatic(dyn); err == nil {
			t.Error("CheckStatic accepted a cgo (dynamically linked) binary")
		}
	}
}

func TestDockerignore(t *testing.T) {
	ig, err := dockerfile.ParseIgnore(strings.NewReader("*\n!go.mod\n!cmd/\n**/*_test.go\n"))
	if err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]bool{
		"go.mod": false, "cmd/kadmit/main.go": false, "cmd/kadmit/main_test.go": true,
		"bin/kadmit": true, "README.md": true,
	} {
		if got := ig.Excluded(p); got != want {
			t.Errorf("Excluded(%s) = %v, want %v", p, got, want)
		}
	}
}
