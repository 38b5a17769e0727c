package doctor

import (
	"context"
	"time"

	"k8s.io/client-go/kubernetes"
)

// This file holds what a long-running controller (kadmit watch) needs
// beyond Diagnose to keep a Snapshot current and report on it.

// Finding is the info finding KD001 that says what the gap leaves
// unknown, as Diagnose attaches it to the affected webhooks.
func (g AccessGap) Finding() Finding { return g.finding() }

// ReadyEndpoints counts the ready endpoints the API server may pick for
// webhook w behind backend b: those of the EndpointSlices' port named like
// the Service port w calls (as checkService reads them). known is false
// when that cannot be told: w is a URL webhook, b is nil, the Service is
// missing, unreadable or lacks the port, or the EndpointSlices could not be
// read.
func ReadyEndpoints(w *Webhook, b *Backend) (n int, known bool) {
	if w.ClientConfig.Service == nil || b == nil || b.Service == nil || b.SlicesUnknown {
		return 0, false
	}
	for _, p := range b.Service.Spec.Ports {
		if p.Port != w.ServicePort() {
			continue
		}
		eps, _ := b.endpointsFor(p.Name)
		for _, e := range eps {
			if e.Ready {
				n++
			}
		}
		return n, true
	}
	return 0, false
}

// LoadPolicies reads the in-cluster admission policies, their bindings,
// their paramKinds (discovery) and the params bindings name, as
// LoadSnapshot does. Refused or unserved reads become the PolicySet's Gaps.
//
// Errors: a read failed with anything but Forbidden/not served, wrapped
// with what was being read.
func LoadPolicies(ctx context.Context, cs kubernetes.Interface) (*PolicySet, error) {
	return loadPolicies(ctx, cs)
}

// ProbeCall is one live probe: how doctor classified the API server's
// answer, and the round trip of the dry-run create.
type ProbeCall struct {
	Outcome Outcome
	RTT     time.Duration
}

// ProbeWebhook runs check 7 for webhook w alone: count (at least 1)
// server-side dry-run creates through cs, planned against snap's
// namespaces. It returns the KD7xx findings Diagnose would add (a KD001
// finding when the create itself is refused by RBAC, KD707 when no probe is
// possible) and each call made, in order. ctx bounds every call.
func ProbeWebhook(ctx context.Context, cs kubernetes.Interface, snap *Snapshot, w *Webhook, count int) ([]Finding, []ProbeCall) {
	o := Options{ProbeCount: count}
	o.defaults()
	r := newRun(cs, snap, o)
	fs := r.probe(ctx, w)
	return fs, r.probeCalls
}
