package watch

import (
	"context"
	"time"

	"golang.org/x/time/rate"

	"github.com/kadmit/kadmit/internal/doctor"
)

// trackedSet is the tracked webhooks as of the last evaluation, for the
// loops that run beside it.
func (c *Controller) trackedSet() map[wkey]*webhookState {
	out := map[wkey]*webhookState{}
	if p := c.states.Load(); p != nil {
		for _, s := range *p {
			out[s.key] = s
		}
	}
	return out
}

// slowLoop re-reads, every HandshakeInterval, what no informer covers: the
// admission policies doctor checks (with discovery of their paramKinds and
// GETs of their params) and cert-manager's injection sources.
func (c *Controller) slowLoop(ctx context.Context) {
	in := &injector{c: c, pending: map[wkey]bool{}}
	t := time.NewTicker(c.o.HandshakeInterval)
	defer t.Stop()
	for {
		if ps, err := doctor.LoadPolicies(ctx, c.o.Client); err != nil {
			if ctx.Err() != nil {
				return
			}
			c.o.Log.Warn("reading admission policies failed; keeping the last read", "error", err)
		} else {
			c.policies.Store(ps)
		}
		c.extra.set("cainject", in.round(ctx))
		c.kick()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// probeReasons maps a failing probe outcome to the reason label of
// kadmit_watch_probe_failures_total. Denied (the webhook answered) and
// inconclusive (something else answered first) are no failures.
var probeReasons = map[string]string{
	doctor.IDProbeRefused:          "refused",
	doctor.IDProbeUnknownAuthority: "unknown_authority",
	doctor.IDProbeSANMismatch:      "san_mismatch",
	doctor.IDProbeTimeout:          "timeout",
	doctor.IDProbeBadResponse:      "bad_response",
	doctor.IDProbeCertExpired:      "cert_expired",
	doctor.IDProbeNoEndpoints:      "no_endpoints",
}

// probeLoop probes each tracked webhook once per ProbeInterval, at most
// ProbeQPS probes per second (burst 1) overall. A failing probe is
// repeated after ConfirmDelay and counts, and its finding stands, only if
// the repeat fails too: a rolling restart's one unlucky call is no alarm.
func (c *Controller) probeLoop(ctx context.Context) {
	lim := rate.NewLimiter(rate.Limit(c.o.ProbeQPS), 1)
	results := map[wkey][]doctor.Finding{}
	for ctx.Err() == nil {
		start := c.o.Now()
		snap := c.lastSnap.Load()
		tracked := c.trackedSet()
		if snap != nil {
			live := map[wkey]bool{}
			for _, w := range snap.Webhooks {
				k := keyOf(w)
				if tracked[k] == nil {
					continue
				}
				live[k] = true
				if err := lim.Wait(ctx); err != nil {
					return
				}
				results[k] = c.probeOnce(ctx, snap, w)
				for rk := range results {
					if !live[rk] && tracked[rk] == nil {
						delete(results, rk)
					}
				}
				cp := make(map[wkey][]doctor.Finding, len(results))
				for rk, fs := range results {
					cp[rk] = fs
				}
				c.extra.set("probe", cp)
				c.kick()
			}
		}
		wait := c.o.ProbeInterval - c.o.Now().Sub(start)
		if snap == nil {
			wait = time.Second
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(max(wait, time.Second)):
		}
	}
}

// probeOnce probes w, and again after ConfirmDelay if the first failed.
func (c *Controller) probeOnce(ctx context.Context, snap *doctor.Snapshot, w *doctor.Webhook) []doctor.Finding {
	p := series{w.Configuration, w.Name}
	run := func() ([]doctor.Finding, string) {
		fs, calls := doctor.ProbeWebhook(ctx, c.o.Client, snap, w, 1)
		reason := ""
		for _, call := range calls {
			c.metrics.probe(p, call.RTT)
			if r, ok := probeReasons[call.Outcome.ID]; ok {
				reason = r
			}
		}
		return fs, reason
	}
	fs, reason := run()
	if reason == "" {
		return fs
	}
	select {
	case <-ctx.Done():
		return nil
	case <-time.After(c.o.ConfirmDelay):
	}
	fs, reason = run()
	if reason != "" {
		c.metrics.probeFailed(p, reason)
	}
	return fs
}
