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
// infos, policies:[{kind, name, findings}], accessGaps:[{verb, resource,
// namespace, reason, lost}], fromError:{webhook, policy, binding, policyKind, format,
// url, service, cause, detail, explaining, matched, explained}}.
func WriteJSON(w io.Writer, r *Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("write JSON report: %w", err)
	}
	return nil
}

// WriteTable writes, for --from-error, what the message is and which
// finding explains it; then a summary line per webhook, the findings of
// every webhook that has any (each with its why and fix; ">" marks the one
// that explains the message), the admission policies' findings, what could
// not be read, and a total line.
func WriteTable(w io.Writer, r *Report) error {
	if m := r.FromError; m != nil {
		var b strings.Builder
		subject := "webhook " + m.Webhook
		if m.Policy != "" {
			subject = "admission policy " + m.Policy
			if m.Binding != "" {
				subject += " (binding " + m.Binding + ")"
			}
		}
		fmt.Fprintf(&b, "From the error: %s, format %q, cause %q", subject, m.Format, m.Cause)
		if m.URL != "" {
			fmt.Fprintf(&b, ", called at %s", m.URL)
		}
		b.WriteString(".\n")
		if m.Explained != "" {
			fmt.Fprintf(&b, "Explained by %s (marked below).\n\n", m.Explained)
		} else {
			fmt.Fprintf(&b, "No current finding explains it (checks that would: %s).\n\n", strings.Join(m.Explaining, ", "))
		}
		if _, err := io.WriteString(w, b.String()); err != nil {
			return fmt.Errorf("write report: %w", err)
		}
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STATUS\tWEBHOOK\tCONFIGURATION\tPOLICY\tFINDINGS")
	for _, h := range r.Webhooks {
		fmt.Fprintf(tw, "%s\t%s\t%s (%s)\t%s\t%s\n", strings.ToUpper(h.Status()), h.Webhook, h.Configuration, shortKind(h.Kind), h.FailurePolicy, counts(h))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	var b strings.Builder
	writeFindings := func(fs []Finding) {
		for _, f := range fs {
			mark := " "
			if f.Lead && f.ID != IDFromError {
				mark = ">"
			}
			fmt.Fprintf(&b, "%s %-7s %s  %s\n", mark, strings.ToUpper(string(f.Severity)), f.ID, f.What)
			if f.Why != "" {
				fmt.Fprintf(&b, "                 why: %s\n", f.Why)
			}
			if f.Fix != "" {
				fmt.Fprintf(&b, "                 fix: %s\n", f.Fix)
			}
		}
	}
	for _, h := range r.Webhooks {
		if len(h.Findings) == 0 {
			continue
		}
		fmt.Fprintf(&b, "\n%s (%s %s) -> %s\n", h.Webhook, h.Kind, h.Configuration, h.Target)
		writeFindings(h.Findings)
	}
	for _, p := range r.Policies {
		fmt.Fprintf(&b, "\n%s %s\n", p.Kind, p.Name)
		writeFindings(p.Findings)
	}
	if len(r.Gaps) > 0 {
		fmt.Fprintf(&b, "\nNot readable with these credentials (%s): ", IDAccessGap)
		for i, g := range r.Gaps {
			if i > 0 {
				b.WriteString("; ")
			}
			b.WriteString(g.String())
		}
		b.WriteString(".\n")
	}
	policies := ""
	if len(r.Policies) > 0 {
		policies = fmt.Sprintf(" and %d admission policy object(s) with findings", len(r.Policies))
	}
	fmt.Fprintf(&b, "\n%d webhook(s) checked%s: %d error(s), %d warning(s), %d info.\n", len(r.Webhooks), policies, r.Errors, r.Warnings, r.Infos)
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	return nil
}

func shortKind(k string) string {
	switch k {
	case KindMutating:
		return "mutating"
	case KindValidating:
		return "validating"
	}
	return "kind unknown" // a static webhook (KD004): the message does not say
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
