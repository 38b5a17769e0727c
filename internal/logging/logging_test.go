package logging

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestSanitize(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"plain name", "plain name"},
		{"héllo ✓", "héllo ✓"},
		{"a\nb\rc\td", `a\nb\rc\td`},
		{"\x00\x1b[31m\x7f", `\x00\x1b[31m\x7f`},
		{"a\u0085b\u009bc", `a\u0085b\u009bc`},
		{"x\u2028y\u2029", `x\u2028y\u2029`},
		{"bad\xffutf8", `bad\xffutf8`},
	} {
		if got := Sanitize(tc.in, 100); got != tc.want {
			t.Errorf("Sanitize(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	long := strings.Repeat("é", 1000) // 2000 bytes
	got := Sanitize(long, 1001)
	if !strings.HasPrefix(got, strings.Repeat("é", 500)+"…[1000 bytes cut]") || len(got) > 1100 {
		t.Errorf("cut on a rune boundary: %q", got[len(got)-40:])
	}
}

func TestLoggerCapsAndEscapes(t *testing.T) {
	for _, format := range []string{"json", "text"} {
		var buf bytes.Buffer
		log, err := New(&buf, format, "info")
		if err != nil {
			t.Fatal(err)
		}
		log.Info("decision\u0085", "uid", strings.Repeat("u", 6<<20), "name", "a\u0085\u2028b", "err", errors.New("e\u009b"),
			"stack", strings.Repeat("s", 20000))
		line := buf.String()
		if len(line) > MaxFieldBytes*3+MaxStackBytes+512 {
			t.Errorf("%s: line of %d bytes", format, len(line))
		}
		for _, raw := range []string{"\u0085", "\u2028", "\u009b"} {
			if strings.Contains(line, raw) {
				t.Errorf("%s: raw %q in %q", format, raw, line)
			}
		}
		if format == "json" {
			var m map[string]any
			if err := json.Unmarshal([]byte(line), &m); err != nil {
				t.Fatalf("json line does not parse: %v", err)
			}
			if m["name"] != `a\u0085\u2028b` || !strings.HasSuffix(m["uid"].(string), "…[6290432 bytes cut]") {
				t.Errorf("fields: name %q uid tail %q", m["name"], m["uid"].(string)[1000:])
			}
		}
	}
	if _, err := New(&bytes.Buffer{}, "xml", "info"); err == nil {
		t.Error("format xml accepted")
	}
	if _, err := New(&bytes.Buffer{}, "json", "loud"); err == nil {
		t.Error("level loud accepted")
	}
}
