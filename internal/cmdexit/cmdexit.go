// Package cmdexit carries a process exit status through cobra and runs the
// root command of kadmit's binaries (kadmit and the kubectl-kadmit plugin).
package cmdexit

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

// Error is a command failure with the exit status it should end the process
// with: 1 for a negative result (a denial, a finding), 2 for usage or input
// errors.
type Error struct {
	Code int
	Err  error
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// Execute runs root with a context cancelled on SIGINT or SIGTERM. On
// failure it prints "<prefix>: <error>" to stderr and exits with the
// *Error's Code, or 2 when the error carries none.
func Execute(root *cobra.Command, prefix string) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := root.ExecuteContext(ctx)
	stop()
	if err == nil {
		return
	}
	fmt.Fprintln(os.Stderr, prefix+":", err)
	var ee *Error
	if errors.As(err, &ee) {
		os.Exit(ee.Code)
	}
	os.Exit(2)
}

// New returns err carrying exit status code.
func New(code int, err error) *Error { return &Error{Code: code, Err: err} }
