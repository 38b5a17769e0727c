package registration

// Fights over caBundle. A GitOps controller that syncs kadmit's webhook
// configurations from manifests (Argo CD with Replace=true, or a chart
// that renders its own CA at every sync; Flux's kustomize-controller or
// helm-controller correcting drift) rewrites the caBundle the registrar
// injects, the registrar repairs it within a second, the controller sees
// drift and rewrites it again: the caBundle flips between two values and
// the API server's calls fail whenever it holds the other one. The
// registrar cannot win that fight (the other side reverts for as long as
// it runs), so after a few immediate repairs it backs off, says who it is
// fighting (a Warning Event, metrics, the readiness body, a log line) and
// leaves the fix to the operator (docs/gitops.md: exclude the caBundle from
// the controller's sync).

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/logging"
)

const (
	// ContestFreeRepairs is how many reverts of kadmit's caBundle in a row
	// (no ContestQuiet between them) the registrar repairs at once, as it
	// always did, before it backs off. A person or a script fixing or
	// testing something rewrites it a few times (kadmit's own
	// test/e2e TestFilesModeRepairsBlankedCABundle blanks it five times in
	// a row and wants each repaired within a second); a controller in a
	// fight keeps going, so five writes at its pace cost nothing next to an
	// unbounded loop.
	ContestFreeRepairs = 5
	// ContestInitialBackoff is the wait before repairing the first revert
	// past ContestFreeRepairs: 1s, RetryInterval, the registrar's own pace.
	// Each further revert doubles it, up to ContestMaxBackoff.
	ContestInitialBackoff = time.Second
	// ContestMaxBackoff bounds the wait before a repair: 5 minutes. The
	// webhooks are broken while the other side's caBundle does not verify,
	// so the registrar still tries that often (one write per 5 minutes is
	// nothing to the API server), and it repairs within that bound once the
	// other side stops.
	ContestMaxBackoff = 5 * time.Minute
	// ContestQuiet is how long after the last revert a fight is over: the
	// backoff resets (the next revert is repaired at once again) and the
	// Event, metric and readiness report clear. 10 minutes, twice
	// ContestMaxBackoff: a controller reverting within 5 minutes of each
	// repair (Argo CD's default reconciliation period is 3 minutes, its
	// self-heal reacts within seconds) stays recognized at the longest
	// backoff; one reverting less often costs one write per its own period,
	// which needs no backoff.
	ContestQuiet = 10 * time.Minute
	// ContestEventRepeat is how often the Warning Event is repeated while a
	// fight lasts with the same manager; a new manager is announced at once
	// (within ContestEventBurst Events per ContestEventInterval).
	ContestEventRepeat = time.Hour
	// ContestEventInterval and ContestEventBurst are the token bucket of the
	// registrar's Events (both configurations together): a manager name
	// that keeps changing cannot turn into a stream of Events.
	ContestEventInterval = time.Minute
	ContestEventBurst    = 3
	// MaxManagerBytes bounds a field manager's name (whoever may write the
	// configuration chooses it; the API server allows 128 bytes) in logs,
	// metric labels, Events and the readiness body; longer names are cut
	// (logging.Sanitize: control characters escaped, "…[N bytes cut]").
	MaxManagerBytes = 64
	// MaxEventMessage bounds an Event's message, bytes.
	MaxEventMessage = 1024

	// ReasonCABundleContested is the Warning Event's reason: kadmit's
	// caBundle keeps being rewritten by another field manager.
	ReasonCABundleContested = "CABundleContested"
	// ReasonCABundleContestEnded is the Normal Event's reason once no
	// revert came for ContestQuiet.
	ReasonCABundleContestEnded = "CABundleContestEnded"
)

// UnknownManager stands for the field manager of a revert managedFields
// cannot name: a caBundle removed (server-side apply drops a removed field
// from every manager's set, and the remover gains no field, so its entry
// and time do not change) by an object whose managedFields name no other
// writer.
const UnknownManager = "unknown"

// ContestObserver receives what the registrar writes and the fights it
// sees, per configuration: kind is "MutatingWebhookConfiguration" or
// "ValidatingWebhookConfiguration", name the configuration's name. The
// serve hands it kadmit's metrics (metrics.Registration).
type ContestObserver interface {
	// Wrote counts one server-side apply of the configuration by this
	// replica (a first registration, a change, a repair).
	Wrote(kind, name string)
	// Reverted counts one write of this replica's undone by another field
	// manager (its caBundle rewritten or removed).
	Reverted(kind, name string)
	// Contested reports the configuration's fight: manager is the other
	// field manager, bounded to MaxManagerBytes ("" once the fight is over),
	// backoff the wait before the pending or next repair.
	Contested(kind, name, manager string, backoff time.Duration)
}

// revert is a caBundle of kadmit's webhooks found rewritten by someone
// other than kadmit's field manager.
type revert struct {
	// webhooks whose caBundle differs from the one kadmit writes, sorted.
	webhooks []string
	// manager is the other field manager, bounded (boundManager), or
	// UnknownManager; operation its managedFields entry's (Apply, Update).
	manager, operation string
	// owns: manager owns the caBundle now. Otherwise the caBundle was
	// removed and manager is the newest writer other than kadmit, the
	// likely remover (a whole-object replace), or UnknownManager.
	owns bool
}

// caBundlePath is the managedFields path of webhook's caBundle: webhooks
// is a list map keyed by name in both configuration kinds
// (k8s.io/api admissionregistration/v1 types.go, +listType=map
// +listMapKey=name).
func caBundlePath(webhook string) fieldpath.Path {
	return fieldpath.MakePathOrDie("webhooks", fieldpath.KeyByFields("name", webhook), "clientConfig", "caBundle")
}

// findRevert compares the caBundle of every webhook kadmit writes (want,
// by webhook name) with the live object's (live, by name) and, when one
// differs, names who wrote it from the live object's managedFields. A
// webhook missing from the live object is a repair of another kind (a
// change of what is registered), not counted. ok is false when no caBundle
// differs, or kadmit's own field manager owns every one that does:
// another replica of this install, or a newer certificate Secret (the
// generation rule handles those), never a fight.
func findRevert(meta metav1.ObjectMeta, live, want map[string][]byte) (rev revert, ok bool) {
	var differ []string
	for name, b := range want {
		if got, present := live[name]; present && !bytes.Equal(got, b) {
			differ = append(differ, name)
		}
	}
	if len(differ) == 0 {
		return revert{}, false
	}
	slices.Sort(differ)
	sets := make([]*fieldpath.Set, len(meta.ManagedFields))
	for i, e := range meta.ManagedFields {
		// The main resource only: a subresource's entry cannot own webhooks.
		if e.FieldsV1 == nil || e.Subresource != "" {
			continue
		}
		s := &fieldpath.Set{}
		if err := s.FromJSON(e.FieldsV1.GetRawReader()); err != nil {
			continue // the API server wrote it; unreadable means not ours to judge
		}
		sets[i] = s
	}
	var owner *metav1.ManagedFieldsEntry
	for _, w := range differ {
		p := caBundlePath(w)
		var other *metav1.ManagedFieldsEntry
		ours := false
		for i, s := range sets {
			if s == nil || !s.Has(p) {
				continue
			}
			if meta.ManagedFields[i].Manager == FieldManager {
				ours = true
			} else if other == nil {
				other = &meta.ManagedFields[i]
			}
		}
		switch {
		case ours:
			// kadmit's own value: not a revert of this webhook.
		case other != nil:
			rev.webhooks = append(rev.webhooks, w)
			if owner == nil {
				owner = other
			}
		default:
			rev.webhooks = append(rev.webhooks, w)
		}
	}
	if len(rev.webhooks) == 0 {
		return revert{}, false
	}
	if owner != nil {
		rev.manager, rev.operation, rev.owns = boundManager(owner.Manager), string(owner.Operation), true
		return rev, true
	}
	// Removed, owned by nobody: the newest entry of another manager is the
	// likeliest remover (Argo CD's Replace=true writes the whole object).
	var newest *metav1.ManagedFieldsEntry
	for i := range meta.ManagedFields {
		e := &meta.ManagedFields[i]
		if e.Manager == FieldManager || e.Subresource != "" {
			continue
		}
		if newest == nil || (e.Time != nil && (newest.Time == nil || e.Time.After(newest.Time.Time))) {
			newest = e
		}
	}
	rev.manager = UnknownManager
	if newest != nil {
		rev.manager, rev.operation = boundManager(newest.Manager), string(newest.Operation)
	}
	return rev, true
}

// boundManager is a field manager's name as kadmit reports it: at most
// MaxManagerBytes (plus the cut marker), control characters escaped;
// UnknownManager for an empty name.
func boundManager(m string) string {
	if m == "" {
		return UnknownManager
	}
	return logging.Sanitize(m, MaxManagerBytes)
}

// contest is the registrar's view of one configuration's caBundle fight.
// Guarded by Registrar.mu.
type contest struct {
	// want is what the registrar last meant to write (the built object's
	// encoding): a revert counts only while it is unchanged, so a rotation
	// or a policy change is written at once, never held back.
	want string
	// armed: a write of this replica, or a look at an up-to-date cache,
	// came after the last revert counted, so the next difference is a new
	// revert (one per undone write, however often the other side writes
	// while the registrar waits). seen is the resourceVersion of the
	// latest reverted object looked at: the cache may still show it after
	// the repair was written (the informer lags the write), which is no new
	// revert.
	armed bool
	seen  string
	// reverts counts the reverts of the current fight (none ContestQuiet
	// apart); last is the latest one's time.
	reverts int
	last    time.Time
	// backoff is the wait applied to the latest revert (0: repaired at
	// once), due when it may be repaired.
	backoff time.Duration
	due     time.Time
	// rev is the latest revert.
	rev revert
	// uid of the live object, for the Events' involvedObject.
	uid types.UID
	// announced is the manager the last Warning named, at announcedAt.
	announced   string
	announcedAt time.Time
}

// active reports whether the fight is on at now: more reverts in a row
// than ContestFreeRepairs, the latest less than ContestQuiet ago.
func (c *contest) active(now time.Time) bool {
	return c.reverts > ContestFreeRepairs && now.Sub(c.last) < ContestQuiet
}

// observe records a revert seen at now in the object at resourceVersion
// rv (when armed, and rv was not looked at before: a new one) and returns
// whether it was counted. The first ContestFreeRepairs of a fight are
// repaired at once; each later one waits twice the previous wait, from
// ContestInitialBackoff up to ContestMaxBackoff. A revert ContestQuiet or
// more after the previous one starts a new fight.
func (c *contest) observe(now time.Time, rev revert, uid types.UID, rv string) bool {
	c.rev, c.uid = rev, uid
	known := rv != "" && rv == c.seen
	c.seen = rv
	if !c.armed || known {
		return false
	}
	c.armed = false
	if !c.last.IsZero() && now.Sub(c.last) >= ContestQuiet {
		c.reset()
		c.rev = rev
	}
	c.reverts++
	c.last = now
	switch {
	case c.reverts <= ContestFreeRepairs:
		c.backoff = 0
	case c.backoff == 0:
		c.backoff = ContestInitialBackoff
	default:
		c.backoff = min(2*c.backoff, ContestMaxBackoff)
	}
	c.due = now.Add(c.backoff)
	return true
}

// reset forgets the fight (the backoff included).
func (c *contest) reset() {
	c.reverts, c.last, c.backoff, c.due, c.rev, c.announced, c.announcedAt = 0, time.Time{}, 0, time.Time{}, revert{}, "", time.Time{}
}

// wait is how long a repair must still wait at now.
func (c *contest) wait(now time.Time) time.Duration {
	return max(c.due.Sub(now), 0)
}

// describe is the fight in one sentence, for the readiness body and the
// log; subject names the configuration.
func (c *contest) describe(subject string, now time.Time) string {
	next := "repairing now"
	if w := c.wait(now); w > 0 {
		next = "next repair in " + w.Round(time.Second).String()
	}
	return fmt.Sprintf("%s: caBundle rewritten by field manager %q %d times in a row (%s; backing off up to %v; docs/gitops.md)",
		subject, c.rev.manager, c.reverts, next, ContestMaxBackoff)
}

// warning is the Warning Event's message, bounded to MaxEventMessage.
func (c *contest) warning(subject string) string {
	how := fmt.Sprintf("field manager %q owns it now (operation %s)", c.rev.manager, c.rev.operation)
	if !c.rev.owns {
		how = fmt.Sprintf("it was removed, which leaves no managedFields trace; the newest other writer is field manager %q", c.rev.manager)
		if c.rev.manager == UnknownManager {
			how = "it was removed, which leaves no managedFields trace, and no other field manager wrote the object"
		}
	}
	return truncate(fmt.Sprintf("%s: the caBundle of %s, which kadmit injects, was rewritten %d times in a row (%s). Instead of fighting, kadmit now waits %v before each repair (doubling up to %v). Exclude caBundle from the other controller's sync (Argo CD: ignoreDifferences with RespectIgnoreDifferences=true; Flux: kustomize.toolkit.fluxcd.io/ssa: IfNotPresent; docs/gitops.md)",
		subject, webhookList(c.rev.webhooks), c.reverts, how, c.backoff, ContestMaxBackoff))
}

// webhookList names at most three webhooks (kadmit's own names, built by
// Build), then how many more.
func webhookList(ws []string) string {
	const show = 3
	switch {
	case len(ws) == 1:
		return "webhook " + ws[0]
	case len(ws) <= show:
		return "webhooks " + strings.Join(ws, ", ")
	}
	return fmt.Sprintf("webhooks %s and %d more", strings.Join(ws[:show], ", "), len(ws)-show)
}

// kindOf is the configuration kind of typ.
func kindOf(typ admission.Type) string {
	if typ == admission.Mutating {
		return "MutatingWebhookConfiguration"
	}
	return "ValidatingWebhookConfiguration"
}

// configRef is an Event's involvedObject: the cluster-scoped
// configuration, so client-go's recorder writes the Event to namespace
// default (as kadmit watch does).
func configRef(typ admission.Type, name string, uid types.UID) *corev1.ObjectReference {
	return &corev1.ObjectReference{Kind: kindOf(typ), APIVersion: "admissionregistration.k8s.io/v1", Name: name, UID: uid}
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

// mutatingBundles and validatingBundles map each webhook's name to its
// caBundle.
func mutatingBundles(ws []admissionregistrationv1.MutatingWebhook) map[string][]byte {
	out := make(map[string][]byte, len(ws))
	for _, w := range ws {
		out[w.Name] = w.ClientConfig.CABundle
	}
	return out
}

func validatingBundles(ws []admissionregistrationv1.ValidatingWebhook) map[string][]byte {
	out := make(map[string][]byte, len(ws))
	for _, w := range ws {
		out[w.Name] = w.ClientConfig.CABundle
	}
	return out
}

// live returns the cached configuration of typ: its metadata and each
// webhook's caBundle by name; ok false when the cache does not hold it.
func (r *Registrar) live(typ admission.Type) (meta metav1.ObjectMeta, bundles map[string][]byte, ok bool) {
	if r.mutating == nil {
		return meta, nil, false
	}
	if typ == admission.Mutating {
		m, err := r.mutating.Get(r.Name())
		if err != nil {
			return meta, nil, false
		}
		return m.ObjectMeta, mutatingBundles(m.Webhooks), true
	}
	v, err := r.validating.Get(r.Name())
	if err != nil {
		return meta, nil, false
	}
	return v.ObjectMeta, validatingBundles(v.Webhooks), true
}

// contestWait records one look at the configuration of typ before a
// write (want: the object the registrar would write, bundles its webhooks'
// caBundles; up: the cache shows it so) and returns how long its write
// must still wait because its caBundle is fought over (0: write now).
//
// A difference counts as a revert only when what the registrar wants is
// the same as at the previous look (a rotation, a new bundle or a policy
// change is written at once), the registrar wrote it or saw it in place
// since the last revert counted, and another field manager wrote the
// differing caBundle (findRevert).
func (r *Registrar) contestWait(typ admission.Type, want any, bundles map[string][]byte, up bool, now time.Time) time.Duration {
	key, err := json.Marshal(want)
	if err != nil {
		// Build's own types always encode; should one not, no revert is
		// counted and the write goes ahead as before.
		key = nil
	}
	var (
		meta     metav1.ObjectMeta
		rev      revert
		reverted bool
	)
	if !up {
		var live map[string][]byte
		var present bool
		if meta, live, present = r.live(typ); present {
			rev, reverted = findRevert(meta, live, bundles)
		}
	}
	r.mu.Lock()
	c := r.contests[typ]
	same := key != nil && c.want == string(key)
	c.want = string(key)
	if up {
		c.armed = true
		r.mu.Unlock()
		return 0
	}
	if !reverted || !same {
		r.mu.Unlock()
		return 0
	}
	wasActive := c.active(now)
	prevManager, prevBackoff := c.rev.manager, c.backoff
	counted := c.observe(now, rev, meta.UID, meta.ResourceVersion)
	wait := c.wait(now)
	if !counted {
		r.mu.Unlock()
		return wait
	}
	active := c.active(now)
	announce := active && (c.announced != rev.manager || now.Sub(c.announcedAt) >= ContestEventRepeat) &&
		r.o.Recorder != nil && r.events.AllowN(now, 1)
	if announce {
		c.announced, c.announcedAt = rev.manager, now
	}
	subject := kindOf(typ) + " " + r.Name()
	describe, warning, backoff, reverts := c.describe(subject, now), c.warning(subject), c.backoff, c.reverts
	r.mu.Unlock()

	kind := kindOf(typ)
	if r.o.Observer != nil {
		r.o.Observer.Reverted(kind, r.Name())
		if active {
			r.o.Observer.Contested(kind, r.Name(), rev.manager, backoff)
		}
	}
	switch {
	case !active:
		r.log.Info("caBundle rewritten by another field manager; repairing it", "kind", kind, "fieldManager", rev.manager,
			"ownsCABundle", rev.owns, "webhooks", rev.webhooks, "revertsInARow", reverts)
	case !wasActive || prevManager != rev.manager || prevBackoff != backoff:
		// Logged when the fight starts or changes: the backoff doubles a
		// bounded number of times, so this stays a few lines per fight.
		r.log.Warn("caBundle contested: another field manager keeps rewriting it; backing off instead of fighting",
			"kind", kind, "fieldManager", rev.manager, "ownsCABundle", rev.owns, "webhooks", rev.webhooks,
			"revertsInARow", reverts, "backoff", backoff, "state", describe)
	}
	if announce {
		r.o.Recorder.Event(configRef(typ, r.Name(), meta.UID), corev1.EventTypeWarning, ReasonCABundleContested, warning)
	}
	return wait
}

// wrote records a successful apply of the configuration of typ: the next
// difference is a new revert.
func (r *Registrar) wrote(typ admission.Type) {
	r.mu.Lock()
	r.contests[typ].armed = true
	r.mu.Unlock()
	if r.o.Observer != nil {
		r.o.Observer.Wrote(kindOf(typ), r.Name())
	}
}

// contestLeft is how long the nearest held-back repair still waits (0:
// none waits).
func (r *Registrar) contestLeft() time.Duration {
	now := r.o.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	var left time.Duration
	for _, c := range r.contests {
		if w := c.wait(now); w > 0 && (left == 0 || w < left) {
			left = w
		}
	}
	return left
}

// expireContests ends the fights whose last revert is ContestQuiet old at
// now: the backoff resets, the metric clears, a Normal Event says so.
func (r *Registrar) expireContests(now time.Time) {
	type ended struct {
		typ     admission.Type
		manager string
		uid     types.UID
		reverts int
		note    bool
	}
	var done []ended
	r.mu.Lock()
	for _, typ := range []admission.Type{admission.Mutating, admission.Validating} {
		c := r.contests[typ]
		if c.last.IsZero() || now.Sub(c.last) < ContestQuiet {
			continue
		}
		wasContested := c.reverts > ContestFreeRepairs
		e := ended{typ: typ, manager: c.rev.manager, uid: c.uid, reverts: c.reverts}
		e.note = wasContested && c.announced != "" && r.o.Recorder != nil && r.events.AllowN(now, 1)
		c.reset()
		if wasContested {
			done = append(done, e)
		}
	}
	r.mu.Unlock()
	for _, e := range done {
		kind := kindOf(e.typ)
		if r.o.Observer != nil {
			r.o.Observer.Contested(kind, r.Name(), "", 0)
		}
		r.log.Info("caBundle no longer contested: no revert for the quiet period; repairs are immediate again",
			"kind", kind, "fieldManager", e.manager, "reverts", e.reverts, "quiet", ContestQuiet)
		if e.note {
			r.o.Recorder.Event(configRef(e.typ, r.Name(), e.uid), corev1.EventTypeNormal, ReasonCABundleContestEnded,
				truncate(fmt.Sprintf("%s %s: field manager %q rewrote the caBundle %d times in a row, the last %v ago; kadmit repairs at once again",
					kind, r.Name(), e.manager, e.reverts, ContestQuiet)))
		}
	}
}

// Contested returns nil unless another field manager keeps rewriting the
// caBundle of either configuration (more than ContestFreeRepairs reverts in
// a row, the last less than ContestQuiet ago), else one sentence per such
// configuration: who, how often, when the registrar repairs next. It is a
// degraded readiness condition, never a gating one (internal/serve).
func (r *Registrar) Contested() error {
	now := r.o.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, typ := range []admission.Type{admission.Mutating, admission.Validating} {
		if c := r.contests[typ]; c.active(now) {
			out = append(out, c.describe(kindOf(typ)+" "+r.Name(), now))
		}
	}
	if len(out) == 0 {
		return nil
	}
	return errors.New(strings.Join(out, "; "))
}
