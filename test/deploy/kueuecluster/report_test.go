package kueuecluster

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestSummarizeAndTable checks the arithmetic and the rendering the
// comparison reports with, without a cluster (it runs in make test).
func TestSummarizeAndTable(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return start.Add(time.Duration(s * float64(time.Second))) }
	refused := `Internal error occurred: failed calling webhook "mjob.kb.io": failed to call webhook: Post "https://kueue-webhook-service.kueue-system.svc:443/mutate-batch-v1-job?timeout=10s": dial tcp 10.96.0.10:443: connect: connection refused`
	calls := []Call{
		{Sent: at(0.5), Err: refused},
		{Sent: at(1), Suspended: true},
		{Sent: at(2), Err: refused},
		{Sent: at(3), Err: "a | b"},
		{Sent: at(4)}, // created without the mutation
		{Sent: at(5), Suspended: true},
	}
	avail := at(2.5)
	before := Summarize(calls, start, start, avail)
	after := Summarize(calls, start, avail, time.Time{})
	if before.Calls != 3 || before.Failed != 2 || before.First != 500*time.Millisecond || before.Last != 2*time.Second || before.Errors[refused] != 2 {
		t.Errorf("before: %+v", before)
	}
	if after.Calls != 3 || after.Failed != 1 || after.Bypassed != 1 || after.Window() != "3.0–3.0 s" {
		t.Errorf("after: %+v, window %s", after, after.Window())
	}
	if w := Summarize(calls[1:2], start, start, time.Time{}).Window(); w != "-" {
		t.Errorf("window without failures = %q", w)
	}

	r := Results{}
	r.Set(Upstream.Name, FreshBefore, Cell{Summary: before, Note: "Available at 2.5 s"})
	r.Set(Upstream.Name, FreshAfter, Cell{Summary: after})
	r.Set(WebhookCerts.Name, CARotation, Cell{Summary: Summarize(nil, start, start, time.Time{}), Err: errors.New("bound reached")})
	table := Table(r, "header")
	for _, want := range []string{
		"header\n\n| scenario |",
		"| " + FreshBefore + " | **2** failed of 3 calls, window 0.5–2.0 s<br>_Available at 2.5 s_<br>2× `" + refused + "` | not run |",
		"1× `a \\| b`",
		"1 admitted without Kueue's mutation",
		"| " + CARotation + " | not run | **0** failed of 0 calls, window -<br>**did not complete:** bound reached |",
	} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	if n := strings.Count(table, "\n"); n != 2+2+len(Scenarios) {
		t.Errorf("table has %d lines:\n%s", n, table)
	}
}
