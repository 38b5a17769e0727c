// Command manifests writes deploy/manifests, deploy/prometheus and
// deploy/dashboards from the Helm chart (`make manifests`); the tests in
// test/deploy fail when the checked-in files differ from what it writes.
package main

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"github.com/kadmit/kadmit/test/deploy/chart"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "manifests:", err)
		os.Exit(1)
	}
}

func run() error {
	root, err := chart.RepoRoot()
	if err != nil {
		return err
	}
	files, err := chart.Generated()
	if err != nil {
		return err
	}
	paths := slices.Sorted(maps.Keys(files))
	for _, p := range paths {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(full, files[p], 0o644); err != nil {
			return err
		}
		fmt.Println("wrote", p)
	}
	return nil
}
