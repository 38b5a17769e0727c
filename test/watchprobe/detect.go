package watchprobe

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/kadmit/kadmit/test/poll"
)

// Detection limits of the issues the watch was built for (issue 15, 23): a
// class the informers see (a changed object) within 5 s, a class only a
// handshake sees within 30 s (the watch's --handshake-interval plus its
// confirming handshake).
const (
	InformerLimit  = 5 * time.Second
	HandshakeLimit = 30 * time.Second
	// DefaultDetectWithin is how long a signal is waited for past its limit
	// before the class is reported as missed.
	DefaultDetectWithin = 40 * time.Second
)

// Class is one failure class: what the watch must report once it is
// injected.
type Class struct {
	// Name is the class for the table ("selector collision"); Key a short
	// name for subtests and objects ("collision").
	Name, Key string
	// Check is the finding's check ID.
	Check string
	// Alert is the alert expected true; "" means any rule AlertsFor(Check)
	// names (an error when none does).
	Alert string
	// Informer: the detection is informer-driven (limit InformerLimit,
	// else HandshakeLimit).
	Informer bool
	// HSReason, when set, is the reason kadmit_watch_handshake_failures_total
	// must count for the class.
	HSReason string
	// Severities the finding may have; nil means {"error"}.
	Severities []string
	// Persists: the finding outlasts the repair by design (one computed
	// over a history of writes, KD609); the Resolved Event and the
	// clearing are not waited for.
	Persists bool
}

// alerting reports whether a finding of severity sev has a Warning Event
// and may have an alert: the watch announces warnings and errors only
// (internal/watch events.go).
func alerting(sev string) bool { return sev == "warning" || sev == "error" }

// Limit is the class's detection limit.
func (c Class) Limit() time.Duration {
	if c.Informer {
		return InformerLimit
	}
	return HandshakeLimit
}

// Subject is a webhook the finding may land on: its configuration and
// name ("" for any webhook of the configuration).
type Subject struct {
	Configuration, Webhook string
}

func (s Subject) has(x Series) bool {
	return x.Labels["configuration"] == s.Configuration && (s.Webhook == "" || x.Labels["webhook"] == s.Webhook)
}

// Fault injects and repairs one class in a healthy webhook of its own.
type Fault struct {
	// Subjects are the webhooks the finding may land on (usually one).
	Subjects []Subject
	// Inject puts the fault in place and returns when it is in effect in
	// the cluster; live is when that happened (zero: when Inject
	// returned), e.g. the moment a rollout's first faulty pod became a
	// ready endpoint. Detection times count from live.
	Inject func(ctx context.Context) (live time.Time, err error)
	// Repair undoes Inject.
	Repair func(ctx context.Context) error
}

// Detection is one class's measured times. Zero times were not seen.
type Detection struct {
	Class Class
	// InjectAt is when Inject was called, LiveAt when the fault was in
	// effect.
	InjectAt, LiveAt time.Time
	// MetricAt: the first scrape with the finding in
	// kadmit_watch_findings; EventAt: the Warning Event (reason = check
	// ID) seen; AlertAt: the first scrape at which the alert expression
	// was true (for: ignored).
	MetricAt, EventAt, AlertAt time.Time
	// AlertName is the alert seen true (or expected).
	AlertName string
	Severity  string
	// RepairAt is when Repair was called; ResolvedAt when the Normal
	// <ID>Resolved Event was seen, ClearedAt the first scrape after the
	// repair with neither the finding nor the alert.
	RepairAt, ResolvedAt, ClearedAt time.Time
}

// since is at - from, or 0 when at is zero; a signal seen before from (a
// fault that already showed while a rollout brought it in) is negative.
func since(at, from time.Time) time.Duration {
	if at.IsZero() {
		return 0
	}
	if d := at.Sub(from); d != 0 {
		return d
	}
	return time.Nanosecond
}

// Rollout is how long the cluster took to put the fault in effect.
func (d Detection) Rollout() time.Duration { return d.LiveAt.Sub(d.InjectAt) }

// Metric, Event and Alert are the times from the fault in effect to each
// signal; 0 when not seen.
func (d Detection) Metric() time.Duration { return since(d.MetricAt, d.LiveAt) }
func (d Detection) Event() time.Duration  { return since(d.EventAt, d.LiveAt) }
func (d Detection) Alert() time.Duration  { return since(d.AlertAt, d.LiveAt) }

// Resolved and Cleared are the times from the repair; 0 when not seen.
func (d Detection) Resolved() time.Duration { return since(d.ResolvedAt, d.RepairAt) }
func (d Detection) Cleared() time.Duration  { return since(d.ClearedAt, d.RepairAt) }

// Probe observes one watch: its metrics, its Events and the alert
// expressions over the metrics.
type Probe struct {
	Scraper *Scraper
	Events  *EventRecorder
	Alerts  *Evaluator
	// DetectWithin: how long a signal is waited for past the class's
	// limit; 0 means DefaultDetectWithin. The repair's Resolved Event and
	// the clearing are waited for as long as limit + DetectWithin.
	DetectWithin time.Duration
	// Explain, when set, is asked for more evidence when a signal is
	// missed (e.g. a one-shot `kadmit doctor` of the configuration), and
	// its answer logged; it must return within ctx.
	Explain func(ctx context.Context, subjects []Subject) string
}

// Measure injects f's fault and measures the time from the fault in
// effect to each signal (the metric; for a warning or error finding also
// the Warning Event and the alert), then repairs it and measures the time
// to the Resolved Event and the clearing (unless the class Persists). It
// fails t (Errorf) for each signal missed or later than the class's limit,
// a severity not in the class's, a handshake-failure counter that did not
// rise (HSReason), more than one Warning Event per webhook while the
// finding was active, and a finding or alert that did not clear; Fatalf
// when Inject or Repair fails. It is safe to call from several goroutines
// at once, each with its own t.
func (p *Probe) Measure(ctx context.Context, t *testing.T, c Class, f Fault) Detection {
	t.Helper()
	d := Detection{Class: c}
	within := p.DetectWithin
	if within <= 0 {
		within = DefaultDetectWithin
	}
	limit := c.Limit()
	sevs := c.Severities
	if len(sevs) == 0 {
		sevs = []string{"error"}
	}
	// An info finding has no Event and no alert: only its metric is
	// waited for.
	announced := slices.ContainsFunc(sevs, alerting)
	var alertNames []string
	switch {
	case c.Alert != "":
		alertNames = []string{c.Alert}
	case announced:
		alertNames = AlertsFor(p.Alerts.Rules, c.Check)
		if len(alertNames) == 0 {
			t.Errorf("%s: no alert rule of group %s selects kadmit_watch_findings{check=%q}", c.Name, AlertGroup, c.Check)
		}
	}
	d.AlertName = strings.Join(alertNames, "|")
	configs := map[string]bool{}
	for _, s := range f.Subjects {
		configs[s.Configuration] = true
	}
	ofClass := func(x Series) bool {
		return x.Labels["check"] == c.Check && slices.ContainsFunc(f.Subjects, func(s Subject) bool { return s.has(x) })
	}
	// alertOn returns the alert true at `at` for a subject's configuration.
	alertOn := func(at time.Time) string {
		for _, name := range alertNames {
			for cfg := range configs {
				if p.Alerts.Firing(t, name, at, cfg) {
					return name
				}
			}
		}
		return ""
	}
	hsFailures := func() float64 {
		var sum float64
		sc := p.Scraper.Latest()
		if sc == nil {
			return 0
		}
		for _, s := range f.Subjects {
			for _, x := range sc.Find("kadmit_watch_handshake_failures_total", map[string]string{"configuration": s.Configuration, "reason": c.HSReason}) {
				if s.has(x) {
					sum += x.Value
				}
			}
		}
		return sum
	}
	warnings := func(since time.Time, typ, reason string) []Event {
		return p.Events.Matching(since, func(ev Event) bool {
			return configs[ev.Name] && OnConfig("", typ, reason)(ev)
		})
	}

	hsBefore := hsFailures()
	d.InjectAt = time.Now()
	live, err := f.Inject(ctx)
	if err != nil {
		t.Fatalf("inject %s: %v", c.Name, err)
	}
	if live.IsZero() {
		live = time.Now()
	}
	d.LiveAt = live
	alertScan := d.InjectAt
	err = pollFor(ctx, time.Until(live.Add(limit+within)), func() bool {
		now := time.Now()
		if d.MetricAt.IsZero() {
			for _, sc := range p.Scraper.Between(d.InjectAt, now) {
				fs := Findings(sc, "")
				if i := slices.IndexFunc(fs, ofClass); i >= 0 {
					d.MetricAt, d.Severity = sc.At, fs[i].Labels["severity"]
					break
				}
			}
		}
		if d.EventAt.IsZero() {
			if evs := warnings(d.InjectAt, "Warning", c.Check); len(evs) > 0 {
				d.EventAt = evs[0].At
				if prefix, ok := webhookPrefix(f.Subjects, evs[0].Name); ok && !strings.HasPrefix(evs[0].Message, prefix) {
					t.Errorf("%s: Event message %q; want it to start with %q", c.Name, evs[0].Message, prefix)
				}
			}
		}
		if d.AlertAt.IsZero() && len(alertNames) > 0 {
			for _, sc := range p.Scraper.Between(alertScan, now) {
				alertScan = sc.At.Add(time.Nanosecond)
				if name := alertOn(sc.At); name != "" {
					d.AlertAt, d.AlertName = sc.At, name
					break
				}
			}
		}
		if !announced || (d.Severity != "" && !alerting(d.Severity)) {
			return !d.MetricAt.IsZero()
		}
		return !d.MetricAt.IsZero() && !d.EventAt.IsZero() && (!d.AlertAt.IsZero() || len(alertNames) == 0)
	})
	announced = announced && (d.Severity == "" || alerting(d.Severity))
	signals := []struct {
		what string
		at   time.Time
		want bool
	}{
		{"metric kadmit_watch_findings{check=" + c.Check + "}", d.MetricAt, true},
		{"Warning Event " + c.Check, d.EventAt, announced},
		{"alert " + d.AlertName, d.AlertAt, announced && len(alertNames) > 0},
	}
	missed := false
	for _, s := range signals {
		switch {
		case s.at.IsZero() && s.want:
			missed = true
			t.Errorf("%s: %s not seen within %s of the fault (%v)", c.Name, s.what, limit+within, err)
		case !s.at.IsZero() && s.at.Sub(live) > limit:
			t.Errorf("%s: %s after %s; want within %s", c.Name, s.what, s.at.Sub(live).Round(time.Millisecond), limit)
		}
	}
	if missed {
		p.explain(ctx, t, c, f.Subjects, configs)
	}
	if d.Severity != "" && !slices.Contains(sevs, d.Severity) {
		t.Errorf("%s: finding %s has severity %q; want %s", c.Name, c.Check, d.Severity, strings.Join(sevs, " or "))
	}
	if c.HSReason != "" {
		if after := hsFailures(); after <= hsBefore {
			t.Errorf("%s: kadmit_watch_handshake_failures_total{reason=%q} stayed at %v", c.Name, c.HSReason, after)
		}
	}
	// Deduplicated: one Warning Event per webhook while the finding is
	// active (the message names the webhook).
	perWebhook := map[string]int{}
	for _, ev := range warnings(d.InjectAt, "Warning", c.Check) {
		subject, _, _ := strings.Cut(ev.Message, ": ")
		perWebhook[ev.Name+" "+subject]++
	}
	for k, n := range perWebhook {
		if n > 1 {
			t.Errorf("%s: %d Warning %s Events on %s while the finding was active; want one", c.Name, n, c.Check, k)
		}
	}

	d.RepairAt = time.Now()
	if err := f.Repair(ctx); err != nil {
		t.Fatalf("repair %s: %v", c.Name, err)
	}
	if c.Persists {
		t.Logf("%s: fault in effect %s after the injecting call; metric %s, event %s, alert %s (limit %s); repaired (the finding persists by design)",
			c.Name, FmtDur(d.Rollout()), FmtDur(d.Metric()), FmtDur(d.Event()), FmtDur(d.Alert()), limit)
		return d
	}
	err = pollFor(ctx, limit+within, func() bool {
		if d.ResolvedAt.IsZero() {
			if evs := warnings(d.RepairAt, "Normal", c.Check+"Resolved"); len(evs) > 0 {
				d.ResolvedAt = evs[0].At
			}
		}
		if d.ClearedAt.IsZero() {
			if sc := p.Scraper.Latest(); sc != nil && sc.Err == nil && sc.At.After(d.RepairAt) {
				if !slices.ContainsFunc(Findings(sc, ""), ofClass) && alertOn(sc.At) == "" {
					d.ClearedAt = sc.At
				}
			}
		}
		return (!d.ResolvedAt.IsZero() || d.EventAt.IsZero()) && !d.ClearedAt.IsZero()
	})
	if d.ResolvedAt.IsZero() && !d.EventAt.IsZero() {
		t.Errorf("%s: no Normal %sResolved Event within %s of the repair (%v)", c.Name, c.Check, limit+within, err)
	}
	if d.ClearedAt.IsZero() {
		t.Errorf("%s: finding or alert still active %s after the repair", c.Name, limit+within)
	}
	t.Logf("%s: fault in effect %s after the injecting call; metric %s, event %s, alert %s (limit %s); repaired: Resolved event %s, finding and alert cleared %s",
		c.Name, FmtDur(d.Rollout()), FmtDur(d.Metric()), FmtDur(d.Event()), FmtDur(d.Alert()), limit, FmtDur(d.Resolved()), FmtDur(d.Cleared()))
	return d
}

// explain logs what the watch reports for the subjects' configurations
// at the last scrape (every finding, any severity, and the webhook info),
// and Explain's answer.
func (p *Probe) explain(ctx context.Context, t *testing.T, c Class, subjects []Subject, configs map[string]bool) {
	t.Helper()
	var lines []string
	if sc := p.Scraper.Latest(); sc != nil {
		for _, name := range []string{"kadmit_watch_findings", "kadmit_watch_webhook_info", "kadmit_watch_ready_endpoints"} {
			for _, x := range sc.Find(name, nil) {
				if configs[x.Labels["configuration"]] && (name != "kadmit_watch_findings" || x.Value > 0) {
					lines = append(lines, x.String())
				}
			}
		}
		lines = append(lines, "scrape: "+sc.String())
	}
	t.Logf("%s: the watch's series for %v at the last scrape:\n%s", c.Name, subjects, strings.Join(lines, "\n"))
	if p.Explain != nil {
		t.Logf("%s: %s", c.Name, p.Explain(ctx, subjects))
	}
}

// webhookPrefix is the message prefix of the watch's Events on
// configuration cfg when one named webhook of it is a subject.
func webhookPrefix(subjects []Subject, cfg string) (string, bool) {
	for _, s := range subjects {
		if s.Configuration == cfg && s.Webhook != "" {
			return "webhook " + s.Webhook + ": ", true
		}
	}
	return "", false
}

// errNotYet is pollFor's condition still false.
var errNotYet = errors.New("not yet")

// pollFor calls cond at once and then every poll.Interval (test/poll, the
// one poller) until it returns true or d passes (at least a millisecond);
// the error wraps context.DeadlineExceeded or ctx's error.
func pollFor(ctx context.Context, d time.Duration, cond func() bool) error {
	return poll.Until(ctx, max(d, time.Millisecond), func(context.Context) error {
		if cond() {
			return nil
		}
		return errNotYet
	})
}

// FmtDur formats a measured time to 10 ms; "-" for 0 (not seen).
func FmtDur(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	return d.Round(10 * time.Millisecond).String()
}

// Table is the detection table: per class its check, limit, the time the
// cluster took to put the fault in effect (rollout; "-" when the injecting
// call itself did), the times from then to the metric, the Event and the
// alert (its name), the finding's severity, and the times from the repair
// to the Resolved Event and to the finding and alert gone.
func Table(rows []Detection) string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "class\tcheck\tlimit\trollout\tmetric\tevent\talert\tseverity\tresolved\tcleared\t")
	for _, r := range rows {
		rollout := "-"
		if r.Rollout() >= 50*time.Millisecond {
			rollout = FmtDur(r.Rollout())
		}
		sev := r.Severity
		if sev == "" {
			sev = "-"
		}
		alert := FmtDur(r.Alert())
		if r.AlertName != "" {
			alert += " (" + r.AlertName + ")"
		}
		resolved, cleared := FmtDur(r.Resolved()), FmtDur(r.Cleared())
		if r.Class.Persists {
			resolved, cleared = "persists", "persists"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.Class.Name, r.Class.Check, r.Class.Limit(), rollout,
			FmtDur(r.Metric()), FmtDur(r.Event()), alert, sev, resolved, cleared)
	}
	_ = tw.Flush()
	return b.String()
}
