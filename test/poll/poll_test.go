package poll

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestUntilReturnsOnceTheConditionHolds(t *testing.T) {
	calls := 0
	err := Until(t.Context(), 10*time.Second, func(context.Context) error {
		calls++
		if calls < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("Until = %v after %d calls; want nil after 3", err, calls)
	}
}

func TestUntilTimeoutNamesTheLastError(t *testing.T) {
	n := 0
	err := Until(t.Context(), 350*time.Millisecond, func(context.Context) error {
		n++
		return errors.New("still " + strings.Repeat("x", n))
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v; want it to wrap context.DeadlineExceeded", err)
	}
	if want := "still " + strings.Repeat("x", n); !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "350ms") {
		t.Fatalf("err = %q; want it to name the timeout and the last error %q", err, want)
	}
	if n < 2 || n > 6 {
		t.Errorf("cond ran %d times in 350ms at a %s interval", n, Interval)
	}
}

func TestUntilStopsAtOnce(t *testing.T) {
	cause := errors.New("process exited")
	calls := 0
	start := time.Now()
	err := Until(t.Context(), time.Minute, func(context.Context) error {
		calls++
		return Stop(cause)
	})
	if err != cause || calls != 1 || time.Since(start) > 10*time.Second {
		t.Fatalf("Until = %v after %d calls (%s); want the Stop cause after 1 call", err, calls, time.Since(start))
	}
}

func TestUntilEndsWithTheContext(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	err := Until(ctx, 0, func(context.Context) error {
		cancel()
		return errors.New("waiting")
	})
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "waiting") {
		t.Fatalf("err = %v; want context.Canceled naming the last error", err)
	}
}

func TestHolds(t *testing.T) {
	calls := 0
	if err := Holds(t.Context(), 300*time.Millisecond, func(context.Context) error { calls++; return nil }); err != nil || calls < 2 {
		t.Fatalf("Holds = %v after %d calls; want nil after several", err, calls)
	}
	broken := errors.New("written")
	calls = 0
	err := Holds(t.Context(), time.Minute, func(context.Context) error {
		calls++
		if calls == 2 {
			return broken
		}
		return nil
	})
	if !errors.Is(err, broken) || calls != 2 {
		t.Fatalf("Holds = %v after %d calls; want the second call's error", err, calls)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := Holds(ctx, time.Minute, func(context.Context) error { return nil }); !errors.Is(err, context.Canceled) {
		t.Fatalf("Holds on an ended context = %v; want context.Canceled", err)
	}
}
