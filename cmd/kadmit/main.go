// Command kadmit is an admission webhook server for Kubernetes and the tools
// around it. This package only wires flags to the internal packages.
package main

import (
	"github.com/spf13/cobra"

	"github.com/kadmit/kadmit/internal/cmdexit"
	"github.com/kadmit/kadmit/internal/doctor/cli"
)

func main() {
	root := &cobra.Command{
		Use:           "kadmit",
		Short:         "Kubernetes admission webhooks that do not break clusters",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newServeCmd(), newReviewCmd(), newTestCmd(), newBenchCmd(), cli.NewCommand(), newWatchCmd(), newUninstallCmd(), newVersionCmd())
	cmdexit.Execute(root, "kadmit")
}
