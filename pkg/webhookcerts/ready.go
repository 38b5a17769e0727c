package webhookcerts

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
)

// ErrNotStarted is returned by ReadyzCheck until Start's informers have
// synced.
var ErrNotStarted = errors.New("webhookcerts: not started (informers not synced)")

// ReadyzCheck is a readiness check (controller-runtime's healthz.Checker):
// nil when a certificate is served and valid now, its SANs include the name
// the API server verifies (<svc>.<ns>.svc, or DNSName), and the served chain
// (leaf and intermediates) verifies for that name against the caBundle of
// every webhook of every owned object that exists, as the informers (or
// the Injector's cache) hold them: what the API server would check. The error names the first object
// and webhook that fails and why. It replaces the webhook server's
// StartedChecker, which only dials its own port. Its argument is unused.
func (r *Rotator) ReadyzCheck(_ *http.Request) error {
	if !r.synced.Load() {
		return ErrNotStarted
	}
	return r.verifyOwned(context.Background(), false)
}

// verifyOwned is ReadyzCheck's test, on the informers' objects, or on the
// API server's (GETs) when live.
func (r *Rotator) verifyOwned(ctx context.Context, live bool) error {
	now := r.now()
	if err := r.holder.Check(now); err != nil {
		return fmt.Errorf("webhookcerts: %w", err)
	}
	cur := r.holder.Current()
	if err := cur.Leaf.VerifyHostname(r.serverName); err != nil {
		return fmt.Errorf("webhookcerts: the served certificate's SANs %v do not cover %s: %w", cur.Leaf.DNSNames, r.serverName, err)
	}
	bundles, _, err := r.inj.Bundles(ctx, live)
	if err != nil {
		return fmt.Errorf("webhookcerts: %w", err)
	}
	for _, name := range slices.Sorted(maps.Keys(bundles)) {
		if err := VerifyChain(cur, bundles[name], r.serverName, now); err != nil {
			return fmt.Errorf("webhookcerts: %s: the caBundle does not verify the served certificate for %s: %w", name, r.serverName, err)
		}
	}
	return nil
}
