package server

import (
	"context"
	"log"
	"log/slog"
	"strings"
	"sync/atomic"

	"golang.org/x/time/rate"
)

// Log lines a client can cause at will (a bad request, a reset stream, a
// failed handshake) are throttled: at most throttleBurst at once and
// throttleRate per second after that; the next line written says how many
// were dropped. Decision lines are not throttled here: denials and slow
// reviews are always logged, allowed decisions sampled by decisionLog
// (decisionlog.go), and the API server, not a client, decides their rate.
const (
	throttleRate  = 10
	throttleBurst = 20
)

type throttle struct {
	lim        *rate.Limiter
	suppressed atomic.Int64
}

func newThrottle() *throttle {
	return &throttle{lim: rate.NewLimiter(throttleRate, throttleBurst)}
}

// log writes one line unless the budget is spent, adding a "suppressed"
// count of the lines dropped since the last one written. ctx is the
// request's context when there is one (a handler may read a trace span
// from it), else context.Background().
func (t *throttle) log(ctx context.Context, l *slog.Logger, level slog.Level, msg string, attrs ...slog.Attr) {
	if !l.Enabled(ctx, level) {
		return
	}
	if !t.lim.Allow() {
		t.suppressed.Add(1)
		return
	}
	if n := t.suppressed.Swap(0); n > 0 {
		attrs = append(attrs, slog.Int64("suppressed", n))
	}
	l.LogAttrs(ctx, level, msg, attrs...)
}

// errorLog is an http.Server ErrorLog: net/http's own complaints (TLS
// handshake errors, HTTP/2 stream resets, malformed requests) go to the
// debug level, throttled.
// Each line is also given to observe, when not nil, before the throttle.
func (t *throttle) errorLog(l *slog.Logger, observe func(line string)) *log.Logger {
	return log.New(writerFunc(func(p []byte) (int, error) {
		if observe != nil {
			observe(string(p))
		}
		t.log(context.Background(), l, slog.LevelDebug, strings.TrimSpace(string(p)), slog.String("source", "net/http"))
		return len(p), nil
	}), "", 0)
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
