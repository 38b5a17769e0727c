package review

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// Print writes res as one JSON line (format "json") or as a short
// human-readable block (format "text").
func Print(w io.Writer, res *Result, format string) error {
	if format == "json" {
		b, err := json.Marshal(res)
		if err != nil {
			return fmt.Errorf("encode result for %s %s: %w", res.Kind, res.Name, err)
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	}
	var sb strings.Builder
	ref := res.Name
	if res.Namespace != "" {
		ref = res.Namespace + "/" + res.Name
	}
	verdict := "ALLOWED"
	if !res.Allowed {
		verdict = fmt.Sprintf("DENIED (%d)", res.Code)
	}
	fmt.Fprintf(&sb, "%s %s: %s\n", res.Kind, ref, verdict)
	if res.Message != "" {
		fmt.Fprintf(&sb, "  message: %s\n", res.Message)
	}
	if len(res.Webhooks) > 0 {
		fmt.Fprintf(&sb, "  webhooks: %s\n", strings.Join(res.Webhooks, ", "))
	}
	for _, warn := range res.Warnings {
		fmt.Fprintf(&sb, "  warning: %s\n", warn)
	}
	for _, op := range res.Patch {
		if op.Value == nil {
			fmt.Fprintf(&sb, "  patch: %s %s\n", op.Op, op.Path)
			continue
		}
		fmt.Fprintf(&sb, "  patch: %s %s %s\n", op.Op, op.Path, op.Value)
	}
	_, err := io.WriteString(w, sb.String())
	return err
}
