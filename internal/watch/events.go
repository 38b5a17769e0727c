package watch

import (
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"

	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"

	"github.com/kadmit/kadmit/internal/doctor"
)

// MaxEventMessage bounds an Event's message, bytes.
const MaxEventMessage = 1024

// eventKey is one check of one webhook: one Event stream.
type eventKey struct {
	w  wkey
	id string
}

type eventState struct {
	uid     types.UID
	emitted bool // the Warning went out
	last    time.Time
	message string
	cleared bool // logged as cleared; its Resolved may still wait for a token
}

// events turns changes of the active warning and error findings into
// core/v1 Events on the webhook's configuration: a Warning (reason = check
// ID) when a finding appears, repeated at most every repeat while it
// stays, and a Normal "<ID>Resolved" when it clears. One Event stream per
// webhook and check, whatever the number of endpoints it concerns. Every
// Event takes a token of one bucket; a Warning that finds none is retried
// at the next evaluation, so a burst of findings is spread out, never
// lost or unbounded. active is bounded by the tracked webhooks times the
// check IDs.
type events struct {
	log    *slog.Logger
	rec    record.EventRecorder
	limit  *rate.Limiter
	repeat time.Duration
	active map[eventKey]*eventState
}

// newEvents logs each appearance and clearing at info level (log may be
// nil), whatever the token bucket lets through as Events.
func newEvents(log *slog.Logger, rec record.EventRecorder, qps float64, burst int, repeat time.Duration) *events {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &events{log: log, rec: rec, limit: rate.NewLimiter(rate.Limit(qps), burst), repeat: repeat, active: map[eventKey]*eventState{}}
}

// sync emits what changed since the last call, at time now.
func (e *events) sync(now time.Time, states []*webhookState) {
	type cur struct {
		f     doctor.Finding
		more  int
		state *webhookState
	}
	present := map[wkey]bool{}
	current := map[eventKey]*cur{}
	var order []eventKey
	for _, s := range states {
		present[s.key] = true
		for _, f := range s.findings {
			if f.Severity != doctor.SeverityError && f.Severity != doctor.SeverityWarning {
				continue
			}
			k := eventKey{s.key, f.ID}
			if c := current[k]; c != nil {
				c.more++
				continue
			}
			current[k] = &cur{f: f, state: s}
			order = append(order, k)
		}
	}
	for _, k := range order {
		c := current[k]
		st := e.active[k]
		if st == nil {
			st = &eventState{}
			e.active[k] = st
			e.log.Info("finding appeared", "kind", k.w.Kind, "configuration", k.w.Configuration, "webhook", k.w.Webhook,
				"check", k.id, "severity", string(c.f.Severity), "what", c.f.What)
		}
		st.uid, st.cleared = c.state.uid, false
		if st.emitted && now.Sub(st.last) < e.repeat {
			continue
		}
		if !e.limit.AllowN(now, 1) {
			continue
		}
		msg := warningMessage(subject(k.w), c.f, c.more)
		e.rec.Event(configRef(k.w, st.uid), corev1.EventTypeWarning, k.id, msg)
		st.emitted, st.last, st.message = true, now, msg
	}
	for k, st := range e.active {
		if current[k] != nil {
			continue
		}
		if !st.cleared {
			st.cleared = true
			e.log.Info("finding cleared", "kind", k.w.Kind, "configuration", k.w.Configuration, "webhook", k.w.Webhook, "check", k.id)
		}
		if !st.emitted || !present[k.w] {
			// Never announced, or the webhook is gone with its object.
			delete(e.active, k)
			continue
		}
		if !e.limit.AllowN(now, 1) {
			continue // retried at the next evaluation
		}
		e.rec.Event(configRef(k.w, st.uid), corev1.EventTypeNormal, k.id+"Resolved",
			truncate(fmt.Sprintf("%s: %s no longer found (was: %s)", subject(k.w), k.id, st.message)))
		delete(e.active, k)
	}
}

// configRef is the involvedObject: the cluster-scoped configuration (or
// policy, or binding), so the Event lands in namespace default (client-go's
// record.makeEvent).
func configRef(w wkey, uid types.UID) *corev1.ObjectReference {
	return &corev1.ObjectReference{Kind: w.Kind, APIVersion: "admissionregistration.k8s.io/v1", Name: w.Configuration, UID: uid}
}

// subject names what an Event is about: "webhook <name>", or for a policy
// state "<Kind> <name>".
func subject(w wkey) string {
	if w.Webhook == "" {
		return w.Kind + " " + w.Configuration
	}
	return "webhook " + w.Webhook
}

// warningMessage is "<subject>: <what>[ (and N more like it)][; fix: <fix>]".
// Findings' What ends with a period; it is dropped before anything is
// appended, which would otherwise read "...).; fix: ...".
func warningMessage(subject string, f doctor.Finding, more int) string {
	what := f.What
	if (more > 0 || f.Fix != "") && strings.HasSuffix(what, ".") && !strings.HasSuffix(what, "..") {
		what = strings.TrimSuffix(what, ".")
	}
	if more > 0 {
		what += fmt.Sprintf(" (and %d more like it)", more)
	}
	msg := fmt.Sprintf("%s: %s", subject, what)
	if f.Fix != "" {
		msg += "; fix: " + f.Fix
	}
	return truncate(msg)
}

// truncate cuts s to MaxEventMessage bytes at a rune boundary.
func truncate(s string) string {
	if len(s) <= MaxEventMessage {
		return s
	}
	const ell = "..."
	cut := MaxEventMessage - len(ell)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + ell
}
