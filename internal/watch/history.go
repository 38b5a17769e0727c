package watch

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"

	"github.com/kadmit/kadmit/internal/doctor"
)

// Bounds of the caBundle and failurePolicy write history (KD609).
const (
	// MaxFieldWrites is the most writes kept per webhook (both fields
	// together): two managers taking a field from each other show within a
	// few writes, and 16 cover eight rounds of such a fight.
	MaxFieldWrites = 16
	// FieldWriteWindow is how long a write is kept: the window KD609 looks
	// at (doctor.FightWindow: a fight repeats within minutes, two writes
	// by different managers days apart are a migration, no fight).
	FieldWriteWindow = doctor.FightWindow
	// MaxManagerName bounds a field manager's name as recorded, in bytes:
	// the API server's own limit for metadata.managedFields[].manager
	// (k8s.io/apimachinery v0.37.1 pkg/apis/meta/v1/validation
	// FieldManagerMaxLength). The name is set by whoever writes the
	// configuration and reaches Events and logs through KD609's text, so it
	// is cut here too, whatever the server let through.
	MaxManagerName = 128
)

// cfgKey names one webhook configuration.
type cfgKey struct{ Kind, Name string }

// writeHistory is what only a long-running watcher can see: each change of
// a webhook's caBundle or failurePolicy, with the field manager that owns
// the field after it (from the configuration's managedFields), so that two
// managers writing a field in turn show as such (doctor's KD609 reads
// Webhook.Writes). One snapshot shows only the last owner.
//
// Bounds: per webhook at most MaxFieldWrites writes, none older than
// FieldWriteWindow; webhooks only of configurations that exist (a deleted
// configuration's history goes with its delete event, and every
// evaluation drops any configuration it does not list), and only webhooks
// the configuration still holds. The informer event handlers write it, the
// evaluation reads it.
type writeHistory struct {
	mu sync.Mutex
	by map[cfgKey]map[string][]doctor.FieldWrite // configuration -> webhook name -> writes, oldest first
}

func newWriteHistory() *writeHistory {
	return &writeHistory{by: map[cfgKey]map[string][]doctor.FieldWrite{}}
}

// hookFields are the recorded fields of one webhook, failurePolicy
// defaulted to Fail as the API server does (so that an object read before
// defaulting shows no change).
type hookFields struct {
	caBundle      []byte
	failurePolicy string
}

// configState is what the history reads of a configuration.
type configState struct {
	key     cfgKey
	hooks   map[string]hookFields
	order   []string // webhook names in list order
	managed []metav1.ManagedFieldsEntry
}

// stateOf reads a *MutatingWebhookConfiguration or
// *ValidatingWebhookConfiguration (or a tombstone of one); ok is false for
// anything else.
func stateOf(o any) (s configState, ok bool) {
	if d, tomb := o.(cache.DeletedFinalStateUnknown); tomb {
		o = d.Obj
	}
	fp := func(p *admissionregistrationv1.FailurePolicyType) string {
		if p == nil {
			return string(admissionregistrationv1.Fail)
		}
		return string(*p)
	}
	add := func(name string, ca []byte, p *admissionregistrationv1.FailurePolicyType) {
		s.hooks[name] = hookFields{ca, fp(p)}
		s.order = append(s.order, name)
	}
	switch c := o.(type) {
	case *admissionregistrationv1.MutatingWebhookConfiguration:
		s = configState{key: cfgKey{doctor.KindMutating, c.Name}, hooks: make(map[string]hookFields, len(c.Webhooks)), managed: c.ManagedFields}
		for _, w := range c.Webhooks {
			add(w.Name, w.ClientConfig.CABundle, w.FailurePolicy)
		}
	case *admissionregistrationv1.ValidatingWebhookConfiguration:
		s = configState{key: cfgKey{doctor.KindValidating, c.Name}, hooks: make(map[string]hookFields, len(c.Webhooks)), managed: c.ManagedFields}
		for _, w := range c.Webhooks {
			add(w.Name, w.ClientConfig.CABundle, w.FailurePolicy)
		}
	default:
		return configState{}, false
	}
	return s, true
}

// update records the writes one update event of a configuration shows:
// for each webhook (by name) of cur whose caBundle or failurePolicy
// differs from old's, a FieldWrite at now naming the field's owner in
// cur's managedFields ("" when the field was emptied). A webhook that is
// new in cur is no write (it was created with the configuration's
// update); webhooks old held and cur does not lose their history.
func (h *writeHistory) update(now time.Time, oldObj, curObj any) {
	old, ok1 := stateOf(oldObj)
	cur, ok2 := stateOf(curObj)
	if !ok1 || !ok2 {
		return
	}
	var owners []ownerSet // decoded on the first change only
	decoded := false
	var writes []struct {
		hook string
		w    doctor.FieldWrite
	}
	for _, name := range cur.order {
		o, existed := old.hooks[name]
		if !existed {
			continue
		}
		n := cur.hooks[name]
		add := func(field, value string) {
			if !decoded {
				owners, decoded = decodeOwners(cur.managed), true
			}
			mgr := ""
			if value != "" {
				mgr = fieldOwner(owners, name, field)
			}
			writes = append(writes, struct {
				hook string
				w    doctor.FieldWrite
			}{name, doctor.FieldWrite{Field: field, Manager: mgr, Value: value, At: now}})
		}
		if string(o.caBundle) != string(n.caBundle) {
			add(doctor.FieldCABundle, digest(n.caBundle))
		}
		if o.failurePolicy != n.failurePolicy {
			add(doctor.FieldFailurePolicy, boundValue(n.failurePolicy))
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	hooks := h.by[cur.key]
	for name := range hooks {
		if _, ok := cur.hooks[name]; !ok {
			delete(hooks, name)
		}
	}
	for _, x := range writes {
		if hooks == nil {
			hooks = map[string][]doctor.FieldWrite{}
			h.by[cur.key] = hooks
		}
		hooks[x.hook] = bounded(append(hooks[x.hook], x.w), now)
	}
	if len(hooks) == 0 {
		delete(h.by, cur.key)
	}
}

// forget drops the history of a deleted configuration (obj: the deleted
// object or its tombstone).
func (h *writeHistory) forget(obj any) {
	s, ok := stateOf(obj)
	if !ok {
		return
	}
	h.mu.Lock()
	delete(h.by, s.key)
	h.mu.Unlock()
}

// sweep drops the writes older than FieldWriteWindow at now and the
// configurations live does not hold; called by every evaluation with the
// configurations it listed, it bounds the history by time and by what
// exists even if a delete event was missed.
func (h *writeHistory) sweep(now time.Time, live map[cfgKey]bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for k, hooks := range h.by {
		if !live[k] {
			delete(h.by, k)
			continue
		}
		for name, ws := range hooks {
			if ws = bounded(ws, now); len(ws) == 0 {
				delete(hooks, name)
			} else {
				hooks[name] = ws
			}
		}
		if len(hooks) == 0 {
			delete(h.by, k)
		}
	}
}

// writes returns a copy of webhook k's writes within FieldWriteWindow of
// now, oldest first; nil when there are none.
func (h *writeHistory) writes(k wkey, now time.Time) []doctor.FieldWrite {
	h.mu.Lock()
	defer h.mu.Unlock()
	ws := bounded(h.by[cfgKey{k.Kind, k.Configuration}][k.Webhook], now)
	if len(ws) == 0 {
		return nil
	}
	return append([]doctor.FieldWrite(nil), ws...)
}

// size counts the webhooks and writes held (tests).
func (h *writeHistory) size() (webhooks, writes int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, hooks := range h.by {
		for _, ws := range hooks {
			webhooks++
			writes += len(ws)
		}
	}
	return webhooks, writes
}

// bounded keeps the last MaxFieldWrites of ws not older than
// FieldWriteWindow at now. ws is in time order, so the expired ones lead.
func bounded(ws []doctor.FieldWrite, now time.Time) []doctor.FieldWrite {
	i := 0
	for i < len(ws) && now.Sub(ws[i].At) > FieldWriteWindow {
		i++
	}
	i = max(i, len(ws)-MaxFieldWrites)
	if i == 0 {
		return ws
	}
	// A fresh array, so the dropped writes' backing store is released.
	return append([]doctor.FieldWrite(nil), ws[i:]...)
}

// digest is a short digest of a caBundle: the first 6 bytes of its SHA-256
// in hex, "" for an empty one. Enough to tell two bundles apart in a
// report; the bundles themselves are public certificates but long.
func digest(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:6])
}

// boundValue is a failurePolicy as recorded: the API server accepts only
// Fail and Ignore, so this only matters for objects that bypassed it.
func boundValue(v string) string { return boundName(v, 16) }

// ownerSet is one managedFields entry, decoded.
type ownerSet struct {
	manager string
	time    time.Time
	set     *fieldpath.Set
}

// decodeOwners decodes the FieldsV1 sets of entries (structured-merge-diff's
// fieldpath, as the API server's field manager encodes them); an entry
// that does not decode owns nothing here.
func decodeOwners(entries []metav1.ManagedFieldsEntry) []ownerSet {
	out := make([]ownerSet, 0, len(entries))
	for _, e := range entries {
		if e.FieldsV1 == nil || e.Subresource != "" {
			continue
		}
		s := &fieldpath.Set{}
		if err := s.FromJSON(e.FieldsV1.GetRawReader()); err != nil {
			continue
		}
		var t time.Time
		if e.Time != nil {
			t = e.Time.Time
		}
		out = append(out, ownerSet{manager: e.Manager, time: t, set: s})
	}
	return out
}

// fieldOwner is the manager owning field of webhook hook: the entry whose
// set holds webhooks[name=hook].clientConfig.caBundle or
// webhooks[name=hook].failurePolicy (webhooks is a list keyed by name,
// +listType=map +listMapKey=name in k8s.io/api v0.37.1
// admissionregistration/v1 types.go). A field written with one value by
// several appliers is owned by all of them; the latest entry is the one
// that wrote it. "" when no entry owns it. The name is bounded
// (MaxManagerName) and unprintable runes replaced.
func fieldOwner(owners []ownerSet, hook, field string) string {
	var p fieldpath.Path
	elem := fieldpath.KeyElementByFields("name", hook)
	switch field {
	case doctor.FieldCABundle:
		p = fieldpath.Path{fieldpath.FieldNameElement("webhooks"), elem, fieldpath.FieldNameElement("clientConfig"), fieldpath.FieldNameElement("caBundle")}
	default:
		p = fieldpath.Path{fieldpath.FieldNameElement("webhooks"), elem, fieldpath.FieldNameElement("failurePolicy")}
	}
	best, found := ownerSet{}, false
	for _, o := range owners {
		if o.set.Has(p) && (!found || !o.time.Before(best.time)) {
			best, found = o, true
		}
	}
	return boundName(best.manager, MaxManagerName)
}

// boundName replaces runes that are not printable (control characters,
// invalid UTF-8) with U+FFFD and cuts the result to n bytes at a rune
// boundary, so a name set by an attacker can neither flood nor forge a
// log line or Event.
func boundName(s string, n int) string {
	if len(s) > 4*n {
		s = s[:4*n] // a rune cut here becomes U+FFFD below
	}
	s = strings.Map(func(r rune) rune {
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			return utf8.RuneError
		}
		return r
	}, s)
	if len(s) > n {
		for n > 0 && !utf8.RuneStart(s[n]) {
			n--
		}
		s = s[:n]
	}
	return s
}
