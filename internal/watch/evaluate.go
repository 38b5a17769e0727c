package watch

import (
	"context"
	"crypto/x509"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/kadmit/kadmit/pkg/webhookcerts"

	"k8s.io/apimachinery/pkg/types"

	"github.com/kadmit/kadmit/internal/doctor"
)

// evaluation records, while doctor.Diagnose runs, which handshake results
// each webhook's endpoint checks used.
type evaluation struct {
	hs      *handshaker
	tracked map[wkey]bool
	wanted  map[hsKey]bool
	// used maps a webhook and an endpoint to the handshake key and the
	// result its findings came from (ok false: pending).
	used map[wkey]map[string]usedResult
}

type usedResult struct {
	key hsKey
	res hsResult
	ok  bool
}

func keyOf(w *doctor.Webhook) wkey { return wkey{w.Kind, w.Configuration, w.Name} }

// handshake is Diagnose's doctor.Options.Handshake: the latest result of
// the controller's own handshakes, or doctor.ErrHandshakePending for an
// endpoint not handshaken yet. Untracked webhooks get no handshakes, which
// bounds the handshakes by MaxWebhooks × MaxEndpoints.
func (e *evaluation) handshake(_ context.Context, w *doctor.Webhook, addr, serverName string) ([]*x509.Certificate, error) {
	k := keyOf(w)
	if !e.tracked[k] {
		return nil, doctor.ErrHandshakePending
	}
	hk := hsKey{Addr: addr, ServerName: serverName}
	e.wanted[hk] = true
	r, ok := e.hs.lookup(hk)
	if e.used[k] == nil {
		e.used[k] = map[string]usedResult{}
	}
	e.used[k][addr] = usedResult{key: hk, res: r, ok: ok}
	if !ok {
		return nil, doctor.ErrHandshakePending
	}
	return r.chain, r.err
}

// evaluate runs doctor's checks over the current snapshot and returns the
// tracked webhooks' states. reeval says a finding awaits confirmation by a
// later evaluation (after Debounce).
//
// Errors: building the snapshot or Diagnose failed (wrapped).
func (c *Controller) evaluate(ctx context.Context) (states []*webhookState, reeval bool, err error) {
	now := c.o.Now()
	v, err := c.cl.snapshot(c.policies.Load())
	if err != nil {
		return nil, false, fmt.Errorf("snapshot: %w", err)
	}
	untracked := c.track(v.snap.Webhooks)
	e := &evaluation{hs: c.hs, tracked: c.tracked, wanted: map[hsKey]bool{}, used: map[wkey]map[string]usedResult{}}
	rep, err := doctor.Diagnose(ctx, nil, v.snap, doctor.Options{Handshake: e.handshake, InCluster: true,
		MaxEndpoints: c.o.MaxEndpoints, HandshakeTimeout: c.o.HandshakeTimeout, Now: c.o.Now})
	if err != nil {
		return nil, false, fmt.Errorf("diagnose: %w", err)
	}
	c.hs.setWanted(e.wanted)
	c.lastSnap.Store(v.snap)
	hooks := map[wkey]*doctor.Webhook{}
	backendNS := map[string]bool{}
	for _, w := range v.snap.Webhooks {
		hooks[keyOf(w)] = w
		if s := w.ClientConfig.Service; s != nil {
			backendNS[s.Namespace] = true
		}
	}
	c.cl.setBackendNamespaces(backendNS)
	users := map[hsKey][]series{}
	extra := c.extra.snapshot()
	for _, wr := range rep.Webhooks {
		k := wkey{wr.Kind, wr.Configuration, wr.Webhook}
		w := hooks[k]
		if !c.tracked[k] || w == nil {
			continue
		}
		used := e.used[k]
		seqOf := func(ep string) (uint64, bool) {
			u, ok := used[ep]
			return u.res.seq, ok && u.ok
		}
		fs := append(wr.Findings, extra[k]...)
		kept, recheck, re := c.conf.filter(now, k, fs, seqOf, c.o.Debounce)
		reeval = reeval || re
		for _, ep := range recheck {
			if u, ok := used[ep]; ok {
				c.hs.recheck(u.key, c.o.ConfirmDelay)
			}
		}
		st := &webhookState{key: k, uid: v.uids[k.Kind+"/"+k.Configuration], failurePolicy: wr.FailurePolicy, findings: kept, certExpiry: map[string]time.Time{}}
		st.service = w.ServiceKey()
		if st.service == "" && w.ClientConfig.URL != nil {
			st.service = *w.ClientConfig.URL
		}
		st.ready, st.readyKnown = doctor.ReadyEndpoints(w, v.snap.Backends[w.ServiceKey()])
		if cas, err := webhookcerts.ParseCertificates(w.ClientConfig.CABundle); err == nil {
			for _, ca := range cas {
				if st.caExpiry.IsZero() || ca.NotAfter.Before(st.caExpiry) {
					st.caExpiry = ca.NotAfter
				}
			}
		}
		p := series{k.Configuration, k.Webhook}
		for ep, u := range used {
			users[u.key] = append(users[u.key], p)
			if u.ok && u.res.err == nil && len(u.res.chain) > 0 {
				st.certExpiry[ep] = u.res.chain[0].NotAfter
			}
		}
		c.countFailures(k, kept, used)
		states = append(states, st)
	}
	pstates, preeval := c.policyStates(now, rep.Policies)
	states, reeval = append(states, pstates...), reeval || preeval
	c.conf.sweep()
	c.pruneCounted(states)
	c.setUsers(users)
	c.metrics.evaluated(now, untracked)
	return states, reeval, nil
}

// track admits webhooks to the tracked set in snapshot order while there
// is room, keeps those admitted while they exist, and returns how many are
// left out. Admission is sticky so that a new webhook never pushes out the
// series of one already tracked.
func (c *Controller) track(ws []*doctor.Webhook) (untracked int) {
	exists := map[wkey]bool{}
	for _, w := range ws {
		exists[keyOf(w)] = true
	}
	for k := range c.tracked {
		if !exists[k] {
			delete(c.tracked, k)
		}
	}
	for _, w := range ws {
		k := keyOf(w)
		if c.tracked[k] {
			continue
		}
		if len(c.tracked) >= c.o.MaxWebhooks {
			untracked++
			continue
		}
		c.tracked[k] = true
	}
	if untracked > 0 && untracked != c.lastUntracked {
		c.o.Log.Warn("more webhooks than --max-webhooks: the rest get no series, Events or handshakes", "tracked", len(c.tracked), "untracked", untracked, "max", c.o.MaxWebhooks)
	}
	c.lastUntracked = untracked
	return untracked
}

// countFailures adds one to kadmit_watch_handshake_failures_total for each
// endpoint of k with a confirmed error finding, once per handshake.
func (c *Controller) countFailures(k wkey, kept []doctor.Finding, used map[string]usedResult) {
	byEP := map[string][]doctor.Finding{}
	for _, f := range kept {
		if f.Endpoint != "" && f.Severity == doctor.SeverityError {
			byEP[f.Endpoint] = append(byEP[f.Endpoint], f)
		}
	}
	for _, ep := range slices.Sorted(maps.Keys(byEP)) {
		u, ok := used[ep]
		if !ok || !u.ok {
			continue
		}
		ck := countKey{k, ep}
		if c.counted[ck] == u.res.seq {
			continue
		}
		c.counted[ck] = u.res.seq
		c.metrics.handshakeFailed(series{k.Configuration, k.Webhook}, handshakeReason(u.res, byEP[ep]))
	}
}

type countKey struct {
	w        wkey
	endpoint string
}

// pruneCounted forgets endpoints no state mentions.
func (c *Controller) pruneCounted(states []*webhookState) {
	live := map[countKey]bool{}
	for _, s := range states {
		for _, f := range s.findings {
			if f.Endpoint != "" {
				live[countKey{s.key, f.Endpoint}] = true
			}
		}
	}
	for k := range c.counted {
		if !live[k] {
			delete(c.counted, k)
		}
	}
}

// handshakeReason names a confirmed failure: the dial or handshake error,
// else what the certificate checks found.
func handshakeReason(r hsResult, fs []doctor.Finding) string {
	if r.err != nil {
		return failureReason(r.err)
	}
	for _, f := range fs {
		switch f.ID {
		case doctor.IDUnknownAuthority:
			return "unknown_authority"
		case doctor.IDSANMismatch:
			return "san_mismatch"
		case doctor.IDServingCertExpiry, doctor.IDCABundleExpired:
			return "expired"
		case doctor.IDHandshakeFailed:
			return "tls"
		}
	}
	return "other"
}

// policyStates are the findings of the in-cluster admission policies and
// bindings (KD9xx, from the policies slowLoop read), confirmed like a
// webhook's informer findings, at most MaxWebhooks of them.
func (c *Controller) policyStates(now time.Time, reports []doctor.PolicyReport) (out []*webhookState, reeval bool) {
	uids := map[string]types.UID{}
	if ps := c.policies.Load(); ps != nil {
		for _, p := range ps.Validating {
			uids["ValidatingAdmissionPolicy/"+p.Name] = p.UID
		}
		for _, p := range ps.ValidatingBinding {
			uids["ValidatingAdmissionPolicyBinding/"+p.Name] = p.UID
		}
		for _, p := range ps.Mutating {
			uids["MutatingAdmissionPolicy/"+p.Name] = p.UID
		}
		for _, p := range ps.MutatingBinding {
			uids["MutatingAdmissionPolicyBinding/"+p.Name] = p.UID
		}
	}
	for _, pr := range reports {
		if len(out) >= c.o.MaxWebhooks {
			break
		}
		k := wkey{Kind: pr.Kind, Configuration: pr.Name}
		kept, _, re := c.conf.filter(now, k, pr.Findings, func(string) (uint64, bool) { return 0, false }, c.o.Debounce)
		reeval = reeval || re
		out = append(out, &webhookState{key: k, policy: true, uid: uids[pr.Kind+"/"+pr.Name], findings: kept})
	}
	return out, reeval
}
