// Command chartrbac writes the chart's RBAC for the cluster caches kadmit's
// policies read (served.ChartCachesPath) from their Go declarations
// (served.ChartCachesTemplate). `make generate` runs it from the
// repository root; internal/served's TestChartCachesGenerated fails while
// the committed file differs from what it writes.
package main

import (
	"fmt"
	"os"

	"github.com/kadmit/kadmit/internal/builtin"
	"github.com/kadmit/kadmit/internal/served"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "chartrbac:", err)
		os.Exit(1)
	}
}

func run() error {
	// ChartCachesPath is relative to the repository root, which holds go.mod.
	if _, err := os.Stat("go.mod"); err != nil {
		return fmt.Errorf("run from the repository root: %w", err)
	}
	out, err := served.ChartCachesTemplate(builtin.Registry)
	if err != nil {
		return err
	}
	return os.WriteFile(served.ChartCachesPath, out, 0o644)
}
