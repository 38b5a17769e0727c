// Command kubectl-kadmit is kadmit's kubectl plugin: installed on $PATH,
// `kubectl kadmit doctor` runs the same doctor command as `kadmit doctor`
// (kubectl passes every argument after "kadmit", including --kubeconfig and
// --context, to the plugin).
package main

import (
	"github.com/spf13/cobra"

	"github.com/kadmit/kadmit/internal/cmdexit"
	"github.com/kadmit/kadmit/internal/doctor/cli"
)

func main() {
	root := &cobra.Command{
		Use:           "kubectl-kadmit",
		Short:         "kadmit's kubectl plugin",
		SilenceUsage:  true,
		SilenceErrors: true,
		// Help and usage then read "kubectl kadmit ...", as users type it.
		Annotations: map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl kadmit"},
	}
	root.AddCommand(cli.NewCommand())
	cmdexit.Execute(root, "kubectl kadmit")
}
