// Package poll is the one way kadmit's test code, the end-to-end suites and
// the demo wait for something: call a condition every Interval until it holds,
// the time is up, or it reports a failure that waiting cannot cure. It runs on
// apimachinery's wait.PollUntilContextTimeout and adds what that leaves to
// every caller: the condition's last complaint in the error, so a timeout
// says what was still wrong.
package poll

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// Interval paces every wait: short enough that tests do not idle, long
// enough not to hammer the API server or a webhook.
const Interval = 100 * time.Millisecond

// stopError marks a condition's error as final.
type stopError struct{ err error }

func (s stopError) Error() string { return s.err.Error() }
func (s stopError) Unwrap() error { return s.err }

// Stop wraps err so that Until returns it at once instead of waiting on,
// for failures no wait can cure (the process being waited on has exited).
// Stop(nil) is nil.
func Stop(err error) error {
	if err == nil {
		return nil
	}
	return stopError{err}
}

// Until calls cond at once and then every Interval until it returns nil, and
// returns nil. cond gets a context that ends with the wait.
//
// Errors: when cond returns an error made by Stop, the error given to Stop;
// when ctx ends or timeout passes (timeout <= 0 waits as long as ctx), an
// error wrapping the context's error (context.DeadlineExceeded once timeout
// passed) and naming cond's last error.
func Until(ctx context.Context, timeout time.Duration, cond func(context.Context) error) error {
	parent, cancel := ctx, context.CancelFunc(func() {})
	if timeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, timeout)
	}
	defer cancel()
	var last error
	err := wait.PollUntilContextCancel(ctx, Interval, true, func(ctx context.Context) (bool, error) {
		last = cond(ctx)
		var stop stopError
		if errors.As(last, &stop) {
			return false, last
		}
		return last == nil, nil
	})
	var stop stopError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &stop):
		return stop.err
	case last == nil:
		return fmt.Errorf("%w before the condition was checked", err)
	case timeout > 0 && parent.Err() == nil && errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("not within %s: %w (last: %w)", timeout, err, last)
	default:
		return fmt.Errorf("%w (last: %w)", err, last)
	}
}

// Holds calls cond at once and then every Interval for d, and returns its
// first error: for what must stay true for a while (nothing is written while
// no replica is ready). It returns nil once d has passed with every call
// returning nil, and ctx's error (wrapped) when ctx ends first.
func Holds(ctx context.Context, d time.Duration, cond func(context.Context) error) error {
	dctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	// cond gets ctx, not dctx: the end of the period must not cut short a
	// call it makes.
	err := wait.PollUntilContextCancel(dctx, Interval, true, func(context.Context) (bool, error) {
		return false, cond(ctx)
	})
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("poll: %w", ctx.Err())
	case errors.Is(err, context.DeadlineExceeded) && dctx.Err() != nil:
		return nil
	default:
		return err
	}
}
