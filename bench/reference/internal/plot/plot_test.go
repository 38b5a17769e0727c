package plot

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"strings"
	"testing"
)

func wellFormed(t *testing.T, b []byte) {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(b))
	root := ""
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v\n%s", err, b)
		}
		if se, ok := tok.(xml.StartElement); ok && root == "" {
			root = se.Name.Local
		}
	}
	if root != "svg" {
		t.Fatalf("root element %q, want svg", root)
	}
}

func TestWriteSVG(t *testing.T) {
	f := Figure{
		Title: "a <title> & more", Note: "load average 1.0",
		Panels: []Panel{
			{Title: "log", XLabel: "size", YLabel: "req/s", LogX: true, LogY: true, XTicks: []float64{1024, 1 << 20},
				Series: []Series{{Name: "a", Points: []Point{{1024, 4000}, {1 << 20, 60}}}, {Name: "b & c", Points: []Point{{1024, 2000}}}}},
			{Title: "linear", XLabel: "n", YLabel: "ms", Series: []Series{{Name: "x", Points: []Point{{0, 1}, {50, 3.5}}}}},
			{Title: "empty"},
		},
	}
	var b bytes.Buffer
	if err := f.WriteSVG(&b); err != nil {
		t.Fatal(err)
	}
	wellFormed(t, b.Bytes())
	if !strings.Contains(b.String(), "a &lt;title&gt; &amp; more") {
		t.Error("title not escaped")
	}
}

func TestLogAxisRejectsZero(t *testing.T) {
	f := Figure{Panels: []Panel{{LogY: true, Series: []Series{{Points: []Point{{1, 0}}}}}}}
	if err := f.WriteSVG(io.Discard); err == nil {
		t.Fatal("a zero on a log axis was accepted")
	}
}

func TestNum(t *testing.T) {
	for v, want := range map[float64]string{1500: "1.5k", 0.25: "0.25", 2e6: "2M", 100: "100"} {
		if got := Num(v); got != want {
			t.Errorf("Num(%v) = %q, want %q", v, got, want)
		}
	}
}
