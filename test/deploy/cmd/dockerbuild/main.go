// Command dockerbuild runs the build stage of the Dockerfile on this machine
// (`make image-build-stage`) and copies the static kadmit it builds to -o:
// the same binary the image ships, without a container engine.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kadmit/kadmit/test/deploy/chart"
	"github.com/kadmit/kadmit/test/deploy/dockerfile"
)

func main() {
	out := flag.String("o", "bin/image/kadmit", "where to copy the built binary (relative to the repository root)")
	version := flag.String("version", "dev", "VERSION build arg")
	flag.Parse()
	if err := run(*out, *version); err != nil {
		fmt.Fprintln(os.Stderr, "dockerbuild:", err)
		os.Exit(1)
	}
}

func run(out, version string) error {
	root, err := chart.RepoRoot()
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "kadmit-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	res, err := dockerfile.RunStage(root, filepath.Join(root, "Dockerfile"), "build", tmp, map[string]string{"VERSION": version})
	if err != nil {
		return err
	}
	bin := filepath.Join(tmp, res.Workdir, "out", "kadmit")
	if err := dockerfile.CheckStatic(bin); err != nil {
		return err
	}
	b, err := os.ReadFile(bin)
	if err != nil {
		return err
	}
	if !filepath.IsAbs(out) {
		out = filepath.Join(root, out)
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(out, b, 0o755); err != nil {
		return err
	}
	fmt.Println("static binary from the Dockerfile's build stage:", out)
	return nil
}
