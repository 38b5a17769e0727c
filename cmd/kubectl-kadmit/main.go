// Command kubectl-kadmit is kadmit's kubectl plugin: installed on $PATH,
// `kubectl kadmit doctor` runs the same doctor command as `kadmit doctor`
// (kubectl passes every argument after "kadmit", including --kubeconfig and
// --context, to the plugin).
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/kadmit/kadmit/internal/doctor/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	root := &cobra.Command{
		Use:           "kubectl-kadmit",
		Short:         "kadmit's kubectl plugin",
		SilenceUsage:  true,
		SilenceErrors: true,
		// Help and usage then read "kubectl kadmit ...", as users type it.
		Annotations: map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl kadmit"},
	}
	root.AddCommand(cli.NewCommand())
	err := root.ExecuteContext(ctx)
	if err == nil {
		return
	}
	fmt.Fprintln(os.Stderr, "kubectl kadmit:", err)
	var ee *cli.ExitError
	if errors.As(err, &ee) {
		os.Exit(ee.Code)
	}
	os.Exit(2)
}
