package doctor

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// WriteJSON writes the report as one indented JSON object:
// {"webhooks":[{webhook, configuration, kind, failurePolicy, target,
// findings:[{id, severity, what, why, fix, endpoint}]}], errors, warnings,
// infos}.
func WriteJSON(w io.Writer, r *Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("write JSON report: %w", err)
	}
	return nil
}

// WriteTable writes a summary line per webhook, then the findings of every
// webhook that has any, each with its why and fix, then a total line.
func WriteTable(w io.Writer, r *Report) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STATUS\tWEBHOOK\tCONFIGURATION\tPOLICY\tFINDINGS")
	for _, h := range r.Webhooks {
		fmt.Fprintf(tw, "%s\t%s\t%s (%s)\t%s\t%s\n", strings.ToUpper(h.Status()), h.Webhook, h.Configuration, shortKind(h.Kind), h.FailurePolicy, counts(h))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	var b strings.Builder
	for _, h := range r.Webhooks {
		if len(h.Findings) == 0 {
			continue
		}
		fmt.Fprintf(&b, "\n%s (%s %s) -> %s\n", h.Webhook, h.Kind, h.Configuration, h.Target)
		for _, f := range h.Findings {
			fmt.Fprintf(&b, "  %-7s %s  %s\n", strings.ToUpper(string(f.Severity)), f.ID, f.What)
			if f.Why != "" {
				fmt.Fprintf(&b, "                 why: %s\n", f.Why)
			}
			if f.Fix != "" {
				fmt.Fprintf(&b, "                 fix: %s\n", f.Fix)
			}
		}
	}
	fmt.Fprintf(&b, "\n%d webhook(s) checked: %d error(s), %d warning(s), %d info.\n", len(r.Webhooks), r.Errors, r.Warnings, r.Infos)
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	return nil
}

func shortKind(k string) string {
	if k == KindMutating {
		return "mutating"
	}
	return "validating"
}

func counts(h WebhookReport) string {
	var parts []string
	if n := h.Count(SeverityError); n > 0 {
		parts = append(parts, fmt.Sprintf("%d error(s)", n))
	}
	if n := h.Count(SeverityWarning); n > 0 {
		parts = append(parts, fmt.Sprintf("%d warning(s)", n))
	}
	if n := h.Count(SeverityInfo); n > 0 {
		parts = append(parts, fmt.Sprintf("%d info", n))
	}
	if len(parts) == 0 {
		return "-"
	}
	var ids []string
	seen := map[string]bool{}
	for _, f := range h.Findings {
		if f.Severity != SeverityInfo && !seen[f.ID] {
			seen[f.ID] = true
			ids = append(ids, f.ID)
		}
	}
	s := strings.Join(parts, ", ")
	if len(ids) > 0 {
		s += " [" + strings.Join(ids, " ") + "]"
	}
	return s
}
