package watch

import (
	"time"

	"github.com/kadmit/kadmit/internal/doctor"
)

// wkey names one webhook: its configuration's kind and name, and its own
// name. Mutating and validating configurations may share names.
type wkey struct{ Kind, Configuration, Webhook string }

func (k wkey) String() string { return k.Kind + "/" + k.Configuration + "/" + k.Webhook }

// confirmKey is one warning or error finding of one webhook.
type confirmKey struct {
	w            wkey
	id, endpoint string
}

type firstSeen struct {
	seq uint64 // handshake seq the endpoint finding first came from
	at  time.Time
}

// confirmer keeps a new warning or error finding from becoming active
// until a second, independent observation shows it again, so that what a
// healthy rotation or rolling restart shows for an instant raises nothing:
//
//   - an endpoint finding (from a handshake: refused, timeout, unknown
//     authority, SAN mismatch, expired) must come again from a later
//     handshake of that endpoint, which the caller schedules after the
//     confirmation delay (and which it skips when the endpoint is no longer
//     ready, as for a terminating pod);
//   - any other finding (from the informers: no endpoints, collision,
//     self-interception) must still be there in an evaluation at least
//     minAge (the debounce) later, after the informers have caught up with
//     a change made of several writes.
//
// Info findings pass at once. An entry lives while its finding is seen in
// every evaluation: the map is bounded by the active findings.
type confirmer struct {
	first map[confirmKey]firstSeen
	seen  map[confirmKey]bool
}

func newConfirmer() *confirmer {
	return &confirmer{first: map[confirmKey]firstSeen{}, seen: map[confirmKey]bool{}}
}

// filter returns the findings of webhook w that are confirmed (and every
// info finding). seqOf gives the seq of the handshake result an endpoint's
// findings came from. recheck lists the endpoints to handshake again;
// reeval says an evaluation after minAge is needed.
func (c *confirmer) filter(now time.Time, w wkey, fs []doctor.Finding, seqOf func(endpoint string) (uint64, bool), minAge time.Duration) (kept []doctor.Finding, recheck []string, reeval bool) {
	for _, f := range fs {
		if f.Severity == doctor.SeverityInfo {
			kept = append(kept, f)
			continue
		}
		k := confirmKey{w: w, id: f.ID, endpoint: f.Endpoint}
		c.seen[k] = true
		seq, fromHandshake := uint64(0), false
		if f.Endpoint != "" {
			seq, fromHandshake = seqOf(f.Endpoint)
		}
		prev, ok := c.first[k]
		if !ok {
			c.first[k] = firstSeen{seq: seq, at: now}
		}
		switch {
		case fromHandshake && ok && seq > prev.seq:
			kept = append(kept, f)
		case fromHandshake:
			recheck = append(recheck, f.Endpoint)
		case ok && now.Sub(prev.at) >= minAge:
			kept = append(kept, f)
		default:
			reeval = true
		}
	}
	return kept, recheck, reeval
}

// sweep forgets the findings not seen since the last sweep; call it once
// after each evaluation's filter calls.
func (c *confirmer) sweep() {
	for k := range c.first {
		if !c.seen[k] {
			delete(c.first, k)
		}
	}
	clear(c.seen)
}
