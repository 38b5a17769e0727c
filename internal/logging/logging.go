// Package logging builds kadmit's slog loggers. Every value a log line
// carries may come from a client (an AdmissionReview's uid, name, a decode
// error quoting the body), so each string is length-capped and stripped of
// control characters before either handler writes it: one request can cost
// one bounded line, never a megabyte line or a forged one.
package logging

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"unicode/utf8"
)

// Field caps, in bytes of the value before escaping (escaping at most
// multiplies a byte by 6: \u0085).
const (
	// MaxFieldBytes bounds every string attribute and the message.
	MaxFieldBytes = 1024
	// MaxStackBytes bounds attributes named "stack" (a recovered panic's
	// goroutine stack), which are worth more room.
	MaxStackBytes = 8192
)

// New returns a logger writing format ("json" or "text") at level ("debug",
// "info", "warn" or "error") to w, with every string field capped and
// escaped (see Sanitize). It returns an error naming the bad flag value.
func New(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: %w", level, err)
	}
	ho := &slog.HandlerOptions{Level: lv, ReplaceAttr: ReplaceAttr}
	switch strings.ToLower(format) {
	case "json":
		return slog.New(slog.NewJSONHandler(w, ho)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, ho)), nil
	default:
		return nil, fmt.Errorf("--log-format %q: must be json or text", format)
	}
}

// NewBufferedLogger is New writing through a Buffered writer on w (default
// options, drop notices in the logger's format): the logger `kadmit serve`
// uses, whose one line per admission decision must cost a copy rather than
// a system call. The caller must Close the writer at shutdown, after the
// server has drained, so that the last lines are written.
func NewBufferedLogger(w io.Writer, format, level string) (*slog.Logger, *Buffered, error) {
	if _, err := New(io.Discard, format, level); err != nil {
		return nil, nil, err
	}
	notice := func(n uint64) []byte {
		var buf bytes.Buffer
		l, _ := New(&buf, format, level)
		l.LogAttrs(context.Background(), slog.LevelError, "log lines dropped: the log output did not drain",
			slog.Uint64("dropped", n))
		return buf.Bytes()
	}
	b := NewBuffered(w, BufferedOptions{DropNotice: notice})
	l, err := New(b, format, level)
	if err != nil {
		b.Close(0)
		return nil, nil, err
	}
	return l, b, nil
}

// ReplaceAttr is a slog.HandlerOptions.ReplaceAttr that caps and escapes
// string values (the message included) and renders error and other
// non-scalar values as capped, escaped strings.
func ReplaceAttr(_ []string, a slog.Attr) slog.Attr {
	limit := MaxFieldBytes
	if a.Key == "stack" {
		limit = MaxStackBytes
	}
	switch a.Value.Kind() {
	case slog.KindString:
		a.Value = slog.StringValue(Sanitize(a.Value.String(), limit))
	case slog.KindAny:
		switch v := a.Value.Any().(type) {
		case error:
			a.Value = slog.StringValue(Sanitize(v.Error(), limit))
		case fmt.Stringer:
			a.Value = slog.StringValue(Sanitize(v.String(), limit))
		case []string:
			a.Value = slog.StringValue(Sanitize(strings.Join(v, ","), limit))
		default:
			a.Value = slog.StringValue(Sanitize(fmt.Sprint(v), limit))
		}
	}
	return a
}

// Sanitize returns s cut to at most limit bytes (on a rune boundary, with
// "…[N bytes cut]" appended) with C0 and C1 control characters, DEL,
// invalid UTF-8 and the Unicode line and paragraph separators replaced by
// Go escapes (\n, \x00, \u0085, \u2028). slog's text handler quotes such
// strings but its JSON handler writes C1 controls and U+2028 raw; escaping
// once here gives both formats the same safe text.
func Sanitize(s string, limit int) string {
	cut := 0
	if len(s) > limit {
		end := limit
		for end > 0 && !utf8.RuneStart(s[end]) {
			end--
		}
		cut = len(s) - end
		s = s[:end]
	}
	if cut == 0 && clean(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 16)
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		case r >= 0x80 && r <= 0x9f, r == 0x2028, r == 0x2029:
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	if cut > 0 {
		fmt.Fprintf(&b, "…[%d bytes cut]", cut)
	}
	return b.String()
}

func clean(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c == 0x7f {
			return false
		}
		if c >= 0x80 {
			// Multi-byte: check the rune.
			r, size := utf8.DecodeRuneInString(s[i:])
			if (r == utf8.RuneError && size == 1) || (r >= 0x80 && r <= 0x9f) || r == 0x2028 || r == 0x2029 {
				return false
			}
			i += size - 1
		}
	}
	return true
}
