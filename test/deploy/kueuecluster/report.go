package kueuecluster

import (
	"fmt"
	"strings"
	"time"
)

// The scenarios, in the table's order. The fresh install is measured in
// two parts: before the Deployment turns Available (failures inherent to a
// chart that creates failurePolicy Fail webhooks before any replica can
// serve them) and after (what readiness is for: Kueue issue #13036 reports
// 10-30 s of errors after Ready).
const (
	FreshBefore    = "fresh install: before the Service routes to a ready replica"
	FreshAfter     = "fresh install: once the Service routes"
	RolloutRestart = "kubectl rollout restart"
	DeleteLeader   = "delete the leader pod"
	CARotation     = "forced CA rotation"
)

// Scenarios lists the rows of the table.
var Scenarios = []string{FreshBefore, FreshAfter, RolloutRestart, DeleteLeader, CARotation}

// Cell is one variant's outcome of one scenario.
type Cell struct {
	Summary Summary
	// Note names the scenario's milestones ("Available at 41.2 s").
	Note string
	// Err is set when the scenario did not complete (in its bound).
	Err error
	// Ran is false for a scenario not reached.
	Ran bool
}

// Results are the cells by variant name and scenario.
type Results map[string]map[string]Cell

// Set records a cell.
func (r Results) Set(variant, scenario string, c Cell) {
	if r[variant] == nil {
		r[variant] = map[string]Cell{}
	}
	c.Ran = true
	r[variant][scenario] = c
}

// Table renders the comparison as a markdown table: one row per scenario,
// one column per variant with the failed calls, their window (first to
// last failure, by send time, relative to the scenario's start) and every
// distinct message verbatim with its count.
func Table(r Results, header string) string {
	var b strings.Builder
	if header != "" {
		b.WriteString(header)
		b.WriteString("\n\n")
	}
	b.WriteString("| scenario | cert-controller: failed calls, window, messages | library (webhookcerts): failed calls, window, messages |\n")
	b.WriteString("|---|---|---|\n")
	for _, sc := range Scenarios {
		fmt.Fprintf(&b, "| %s | %s | %s |\n", sc, cell(r[Upstream.Name][sc]), cell(r[WebhookCerts.Name][sc]))
	}
	return b.String()
}

func cell(c Cell) string {
	if !c.Ran {
		return "not run"
	}
	s := c.Summary
	parts := []string{fmt.Sprintf("**%d** failed of %d calls, window %s", s.Failed, s.Calls, s.Window())}
	if s.Bypassed > 0 {
		parts[0] += fmt.Sprintf(", %d admitted without Kueue's mutation", s.Bypassed)
	}
	if c.Note != "" {
		parts = append(parts, "_"+escape(c.Note)+"_")
	}
	for _, m := range s.Messages() {
		parts = append(parts, fmt.Sprintf("%d× %s", s.Errors[m], code(m)))
	}
	if c.Err != nil {
		parts = append(parts, "**did not complete:** "+escape(c.Err.Error()))
	}
	return strings.Join(parts, "<br>")
}

// code renders a message verbatim in a code span (escaping what a table
// cell cannot hold).
func code(m string) string {
	m = strings.ReplaceAll(m, "\n", " ")
	if strings.Contains(m, "`") {
		return escape(m)
	}
	return "`" + strings.ReplaceAll(m, "|", `\|`) + "`"
}

func escape(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	s = strings.ReplaceAll(s, "|", `\|`)
	return s
}

// Seconds formats d relative to a scenario's start.
func Seconds(d time.Duration) string { return fmt.Sprintf("%.1f s", d.Seconds()) }
