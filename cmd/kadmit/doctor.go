package main

import (
	"errors"

	"github.com/spf13/cobra"

	"github.com/kadmit/kadmit/internal/doctor/cli"
)

// newDoctorCmd is `kadmit doctor`: the command of internal/doctor/cli (shared
// with the kubectl-kadmit plugin), with its exit status carried as this
// package's exitError.
func newDoctorCmd() *cobra.Command {
	cmd := cli.NewCommand()
	run := cmd.RunE
	cmd.RunE = func(c *cobra.Command, args []string) error {
		err := run(c, args)
		var ee *cli.ExitError
		if errors.As(err, &ee) {
			return &exitError{ee.Code, ee.Err}
		}
		return err
	}
	return cmd
}
