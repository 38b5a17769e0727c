// Package plot writes small line charts as standalone SVG: one figure of
// side-by-side panels, each with axes, ticks, a grid, one polyline with
// markers per series and a legend. Linear or log axes. No dependencies.
package plot

import (
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// Point is one (x, y) value.
type Point struct{ X, Y float64 }

// Series is one line.
type Series struct {
	Name   string
	Points []Point
}

// Panel is one chart.
type Panel struct {
	Title          string
	XLabel, YLabel string
	LogX, LogY     bool
	// XTicks, when set, are the x values labelled (e.g. the measured sizes);
	// otherwise ticks are chosen.
	XTicks []float64
	// XTickLabel formats an x tick; default %g.
	XTickLabel func(float64) string
	Series     []Series
}

// Figure is a title, an optional note under it, and panels side by side.
type Figure struct {
	Title, Note string
	Panels      []Panel
}

const (
	panelW, panelH = 440, 320
	marginL        = 70
	marginR        = 20
	marginT        = 36
	marginB        = 96 // x label and legend
	headerH        = 52
)

// palette is colour-blind friendly (Okabe-Ito).
var palette = []string{"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9"}
var markers = []string{"circle", "square", "diamond", "triangle"}

// WriteSVG writes f as a standalone SVG document.
func (f Figure) WriteSVG(w io.Writer) error {
	width := len(f.Panels) * panelW
	height := headerH + panelH
	var b strings.Builder
	fmt.Fprintf(&b, `<?xml version="1.0" encoding="UTF-8"?>`+"\n")
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="#ffffff"/>`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="%d" y="22" text-anchor="middle" font-size="16" font-weight="bold">%s</text>`+"\n", width/2, esc(f.Title))
	if f.Note != "" {
		fmt.Fprintf(&b, `<text x="%d" y="42" text-anchor="middle" fill="#555555">%s</text>`+"\n", width/2, esc(f.Note))
	}
	for i, p := range f.Panels {
		if err := p.write(&b, float64(i*panelW), headerH); err != nil {
			return fmt.Errorf("panel %q: %w", p.Title, err)
		}
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

type axis struct {
	log      bool
	lo, hi   float64 // in data units
	px0, px1 float64 // pixel range
}

func (a axis) pos(v float64) float64 {
	t := 0.0
	if a.log {
		t = (math.Log10(v) - math.Log10(a.lo)) / (math.Log10(a.hi) - math.Log10(a.lo))
	} else {
		t = (v - a.lo) / (a.hi - a.lo)
	}
	return a.px0 + t*(a.px1-a.px0)
}

// bounds returns the axis range for values vs: log axes snap to powers of
// ten, linear ones start at 0 and end at a "nice" number.
func bounds(vs []float64, log bool) (lo, hi float64, err error) {
	lo, hi = math.Inf(1), math.Inf(-1)
	for _, v := range vs {
		if math.IsNaN(v) || math.IsInf(v, 0) || (log && v <= 0) {
			return 0, 0, fmt.Errorf("value %v cannot be plotted", v)
		}
		lo, hi = min(lo, v), max(hi, v)
	}
	if len(vs) == 0 {
		return 0, 1, nil
	}
	if log {
		lo = math.Pow(10, math.Floor(math.Log10(lo)))
		hi = math.Pow(10, math.Ceil(math.Log10(hi)))
		if hi <= lo {
			hi = lo * 10
		}
		return lo, hi, nil
	}
	lo = min(lo, 0)
	if hi <= lo {
		hi = lo + 1
	}
	step := niceStep((hi - lo) / 5)
	return lo, math.Ceil(hi/step) * step, nil
}

func niceStep(raw float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*p >= raw {
			return m * p
		}
	}
	return 10 * p
}

func ticks(lo, hi float64, log bool) []float64 {
	var out []float64
	if log {
		for v := lo; v <= hi*1.0001; v *= 10 {
			out = append(out, v)
		}
		return out
	}
	step := niceStep((hi - lo) / 5)
	for v := lo; v <= hi+step/1000; v += step {
		out = append(out, v)
	}
	return out
}

// Num formats a tick value compactly: 1500 -> 1.5k, 0.25 -> 0.25.
func Num(v float64) string {
	switch a := math.Abs(v); {
	case a >= 1e6:
		return strconv.FormatFloat(v/1e6, 'f', -1, 64) + "M"
	case a >= 1e3:
		return strconv.FormatFloat(v/1e3, 'f', -1, 64) + "k"
	default:
		return strconv.FormatFloat(v, 'g', 4, 64)
	}
}

func (p Panel) write(b *strings.Builder, ox, oy float64) error {
	var xs, ys []float64
	for _, s := range p.Series {
		for _, pt := range s.Points {
			xs, ys = append(xs, pt.X), append(ys, pt.Y)
		}
	}
	xs = append(xs, p.XTicks...)
	xlo, xhi, err := bounds(xs, p.LogX)
	if err != nil {
		return fmt.Errorf("x: %w", err)
	}
	if p.XTicks != nil && !p.LogX {
		// Measured points set the range; do not round it up.
		xhi = xs[0]
		for _, v := range xs {
			xhi = max(xhi, v)
		}
		pad := (xhi - xlo) * 0.03
		xlo, xhi = xlo-pad, xhi+pad
	}
	if p.XTicks != nil && p.LogX {
		xlo, xhi = p.XTicks[0], p.XTicks[len(p.XTicks)-1]
		for _, v := range xs {
			xlo, xhi = min(xlo, v), max(xhi, v)
		}
		// A little room so the end markers are not on the frame.
		xlo, xhi = xlo/1.25, xhi*1.25
	}
	ylo, yhi, err := bounds(ys, p.LogY)
	if err != nil {
		return fmt.Errorf("y: %w", err)
	}
	x := axis{log: p.LogX, lo: xlo, hi: xhi, px0: ox + marginL, px1: ox + panelW - marginR}
	y := axis{log: p.LogY, lo: ylo, hi: yhi, px0: oy + panelH - marginB, px1: oy + marginT}
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }

	fmt.Fprintf(b, `<g>`+"\n")
	fmt.Fprintf(b, `<text x="%s" y="%s" text-anchor="middle" font-size="13" font-weight="bold">%s</text>`+"\n", f(ox+panelW/2), f(oy+20), esc(p.Title))
	// Grid and y ticks.
	for _, t := range ticks(ylo, yhi, p.LogY) {
		py := y.pos(t)
		fmt.Fprintf(b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#e0e0e0"/>`+"\n", f(x.px0), f(py), f(x.px1), f(py))
		fmt.Fprintf(b, `<text x="%s" y="%s" text-anchor="end">%s</text>`+"\n", f(x.px0-6), f(py+4), esc(Num(t)))
	}
	xt := p.XTicks
	if xt == nil {
		xt = ticks(xlo, xhi, p.LogX)
	}
	label := p.XTickLabel
	if label == nil {
		label = Num
	}
	for _, t := range xt {
		px := x.pos(t)
		fmt.Fprintf(b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#e0e0e0"/>`+"\n", f(px), f(y.px0), f(px), f(y.px1))
		fmt.Fprintf(b, `<text x="%s" y="%s" text-anchor="middle">%s</text>`+"\n", f(px), f(y.px0+16), esc(label(t)))
	}
	// Frame and axis labels.
	fmt.Fprintf(b, `<rect x="%s" y="%s" width="%s" height="%s" fill="none" stroke="#333333"/>`+"\n", f(x.px0), f(y.px1), f(x.px1-x.px0), f(y.px0-y.px1))
	fmt.Fprintf(b, `<text x="%s" y="%s" text-anchor="middle">%s</text>`+"\n", f((x.px0+x.px1)/2), f(y.px0+34), esc(p.XLabel))
	cy := (y.px0 + y.px1) / 2
	fmt.Fprintf(b, `<text x="%s" y="%s" text-anchor="middle" transform="rotate(-90 %s %s)">%s</text>`+"\n", f(ox+16), f(cy), f(ox+16), f(cy), esc(p.YLabel))
	// Series.
	for i, s := range p.Series {
		col := palette[i%len(palette)]
		var pts []string
		for _, pt := range s.Points {
			pts = append(pts, f(x.pos(pt.X))+","+f(y.pos(pt.Y)))
		}
		if len(pts) > 1 {
			fmt.Fprintf(b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"/>`+"\n", strings.Join(pts, " "), col)
		}
		for _, pt := range s.Points {
			marker(b, markers[i%len(markers)], x.pos(pt.X), y.pos(pt.Y), col)
		}
		// Legend below the x label, one entry per row.
		lx := x.px0
		ly := y.px0 + 54 + float64(i)*16
		fmt.Fprintf(b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s" stroke-width="2"/>`+"\n", f(lx), f(ly-4), f(lx+22), f(ly-4), col)
		marker(b, markers[i%len(markers)], lx+11, ly-4, col)
		fmt.Fprintf(b, `<text x="%s" y="%s">%s</text>`+"\n", f(lx+28), f(ly), esc(s.Name))
	}
	fmt.Fprintf(b, `</g>`+"\n")
	return nil
}

func marker(b *strings.Builder, kind string, x, y float64, col string) {
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }
	switch kind {
	case "square":
		fmt.Fprintf(b, `<rect x="%s" y="%s" width="7" height="7" fill="%s"/>`+"\n", f(x-3.5), f(y-3.5), col)
	case "diamond":
		fmt.Fprintf(b, `<polygon points="%s,%s %s,%s %s,%s %s,%s" fill="%s"/>`+"\n", f(x), f(y-5), f(x+5), f(y), f(x), f(y+5), f(x-5), f(y), col)
	case "triangle":
		fmt.Fprintf(b, `<polygon points="%s,%s %s,%s %s,%s" fill="%s"/>`+"\n", f(x), f(y-5), f(x+5), f(y+4), f(x-5), f(y+4), col)
	default:
		fmt.Fprintf(b, `<circle cx="%s" cy="%s" r="4" fill="%s"/>`+"\n", f(x), f(y), col)
	}
}

func esc(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}
