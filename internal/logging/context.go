package logging

import (
	"context"
	"log/slog"
	"sync/atomic"
)

// This file carries a logger in a context.Context the way
// controller-runtime carries a logr.Logger (sigs.k8s.io/controller-runtime
// v0.25.2 pkg/log/log.go: IntoContext, and FromContext falling back to the
// package's global Log): code on a request's path
// logs through FromContext(ctx) and its lines name the request without
// passing a logger down every call.

// MaxUIDBytes caps the request uid a request-scoped logger carries. The API
// server sends a 36-byte UUID; any client that reaches the webhook can send
// a megabyte, so the uid is cut (and escaped, see Sanitize) before any
// handler sees it, whatever handler the base logger has.
const MaxUIDBytes = 128

// ctxKey is the one context key of this package; a zero-size struct so that
// boxing it into ctx.Value's any argument allocates nothing.
type ctxKey struct{}

// IntoContext returns a copy of ctx carrying l, for FromContext.
func IntoContext(ctx context.Context, l *slog.Logger) context.Context {
	return context.WithValue(ctx, ctxKey{}, l)
}

// FromContext returns the logger ctx carries: one stored by IntoContext, or
// the request-scoped logger of a RequestContext (built on this first call,
// with "webhook" and "uid" attributes). When ctx carries none it returns
// slog.Default(), never nil, so callers need no check (as
// controller-runtime's FromContext falls back to its global logger).
func FromContext(ctx context.Context) *slog.Logger {
	switch v := ctx.Value(ctxKey{}).(type) {
	case *slog.Logger:
		if v != nil {
			return v
		}
	case *RequestContext:
		return v.logger()
	}
	return slog.Default()
}

// RequestContext is a context.Context carrying a request-scoped logger for
// FromContext: the base logger with the webhook path and the request's uid
// as "webhook" and "uid" attributes.
//
// It exists so that attaching the logger costs nothing per request when
// nothing logs: IntoContext allocates a context node and base.With a
// logger and a handler per call, while a RequestContext is meant to live
// inside a pooled per-request struct (the admission handler's call) and
// builds the logger only on the first FromContext. Its zero value is not
// usable; Reset it before use. It may be used from several goroutines at
// once (policies of one review run concurrently); Reset and Clear must not
// race with its use.
type RequestContext struct {
	context.Context
	base         *slog.Logger
	webhook, uid string
	built        atomic.Pointer[slog.Logger]
}

// Reset makes c a child of parent carrying base (nil: FromContext returns
// slog.Default() with the attributes) for a request on webhook with uid.
// The strings are kept as given and sanitized only when the logger is
// built: webhook is capped at MaxFieldBytes, uid at MaxUIDBytes.
func (c *RequestContext) Reset(parent context.Context, base *slog.Logger, webhook, uid string) {
	c.Context, c.base, c.webhook, c.uid = parent, base, webhook, uid
	c.built.Store(nil)
}

// Clear drops what Reset stored, so a pooled RequestContext retains neither
// the parent context nor the request's strings. Its parent becomes
// context.Background(): code that wrongly kept the context past the request
// finds a context that is never done and a logger without attributes,
// rather than a nil dereference.
func (c *RequestContext) Clear() {
	c.Context, c.base, c.webhook, c.uid = context.Background(), nil, "", ""
	c.built.Store(nil)
}

// Value answers FromContext's key with c itself and forwards every other
// key to the parent. Returning a pointer boxes nothing.
func (c *RequestContext) Value(key any) any {
	if _, ok := key.(ctxKey); ok {
		return c
	}
	return c.Context.Value(key)
}

// logger builds the request-scoped logger once; concurrent first calls may
// each build one, and all then use the first stored.
func (c *RequestContext) logger() *slog.Logger {
	if l := c.built.Load(); l != nil {
		return l
	}
	base := c.base
	if base == nil {
		base = slog.Default()
	}
	l := base.With(slog.String("webhook", Sanitize(c.webhook, MaxFieldBytes)), slog.String("uid", Sanitize(c.uid, MaxUIDBytes)))
	if c.built.CompareAndSwap(nil, l) {
		return l
	}
	return c.built.Load()
}
