package doctor

import (
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// KD609: caBundle or failurePolicy written in turn by two field managers.
//
// What the evidence can honestly show:
//
//   - From a long-running watcher (Webhook.Writes, kadmit watch): the
//     field's value changed at least twice within FightWindow with its
//     owner alternating between two managers, A -> B -> A (an emptied
//     caBundle has no owner and counts as one side: Argo CD's Replace=true
//     and `kubectl replace` empty it without owning it). That is a fight.
//
//   - From one read (Webhook.Owners and Managers, doctor): only the last
//     write. Two managers owning the field together is agreement (server-
//     side apply shares a field between appliers of the same value), not a
//     fight. What one read can show is an overwrite in progress: the field
//     is owned by someone other than the manager that keeps it (its
//     keeper: cert-manager's cainjector where the configuration carries
//     cert-manager.io/inject-ca-from*, kadmit's registrar or the
//     webhookcerts library where their entry covers the webhook), while
//     that keeper changed the configuration within FightWindow. The keeper
//     wrote the field then; someone wrote it after (else the keeper would
//     still own it); and the keeper repairs it again: the start of a
//     fight, named with both managers and times. An install that leaves
//     caBundle to its injector (the injector owns it), an injector on its
//     own, and kadmit's registrar never show this. A keeper that has not
//     written for longer than FightWindow is no fight (it may be down: the
//     certificate checks report what that breaks).

// FightWindow is how far back KD609 looks: writes within it (Writes), and
// how recently a keeper must have written for an overwrite to count as a
// fight (Owners). A fight repeats within minutes (an injector repairs at
// once, Argo CD re-syncs every 3 minutes by default, Flux every interval),
// while two writes by different managers days apart (a migration from one
// injector to another) are none. kadmit watch keeps its write history as
// long (internal/watch FieldWriteWindow).
const FightWindow = 30 * time.Minute

// maxWritesExamined bounds the writes of one field KD609 looks at: the
// newest ones (kadmit watch keeps 16 per webhook).
const maxWritesExamined = 64

// maxManagerShown bounds a manager name in KD609's text, bytes: the API
// server's own limit (FieldManagerMaxLength), enforced here again because
// the name reaches Events and logs.
const maxManagerShown = 128

// keeper is a field manager that writes a field continuously: it puts the
// value back when someone else changes it.
type keeper struct {
	names []string // field manager names, any of which
	field string
	what  string // for messages
}

// cert-manager's cainjector applies caBundle with field manager
// "cert-manager-cainjector" (its user agent's prefix, cert-manager
// pkg/controller/cainjector/setup.go: util.PrefixFromUserAgent,
// cmd/cainjector/app/controller.go: RestConfigWithUserAgent(...,
// "cainjector")); releases before server-side apply updated with the
// binary's user agent, "cainjector".
var (
	keeperCAInjector = keeper{[]string{"cert-manager-cainjector", "cainjector"}, FieldCABundle, "cert-manager's cainjector"}
	// kadmit's registrar applies its configurations, caBundle and
	// failurePolicy included, with field manager "kadmit"
	// (internal/registration FieldManager) and repairs them.
	keeperKadmitCA     = keeper{[]string{"kadmit"}, FieldCABundle, "kadmit's registrar"}
	keeperKadmitPolicy = keeper{[]string{"kadmit"}, FieldFailurePolicy, "kadmit's registrar"}
	// pkg/webhookcerts injects caBundle with DefaultFieldManager
	// "webhookcerts" unless configured otherwise.
	keeperWebhookcerts = keeper{[]string{"webhookcerts"}, FieldCABundle, "the webhookcerts injector"}
)

// certManagerAnnotations declare cert-manager's cainjector as the
// configuration's caBundle injector (cert-manager
// pkg/apis/certmanager/v1/types.go: WantInjectAnnotation,
// WantInjectFromSecretAnnotation, WantInjectAPIServerCAAnnotation).
var certManagerAnnotations = []string{"cert-manager.io/inject-ca-from", "cert-manager.io/inject-ca-from-secret", "cert-manager.io/inject-apiserver-ca"}

// keepers returns the keepers of field for w: cert-manager's cainjector
// when the configuration declares it, and kadmit's or webhookcerts' when
// their managedFields entry covers the webhook.
func keepers(w *Webhook, field string) []keeper {
	var out []keeper
	if field == FieldCABundle {
		for _, a := range certManagerAnnotations {
			if _, ok := w.Annotations[a]; ok {
				out = append(out, keeperCAInjector)
				break
			}
		}
	}
	for _, k := range []keeper{keeperKadmitCA, keeperKadmitPolicy, keeperWebhookcerts} {
		if k.field != field {
			continue
		}
		for _, m := range w.Managers {
			if k.is(m.Manager) {
				out = append(out, k)
				break
			}
		}
	}
	return out
}

func (k keeper) is(manager string) bool {
	for _, n := range k.names {
		if manager == n {
			return true
		}
	}
	return false
}

// checkFieldOwners runs KD609 for w's caBundle and failurePolicy: from the
// writes a watcher saw when there are any, else from the owners one read
// shows. At most one finding per field.
func (r *run) checkFieldOwners(w *Webhook) []Finding {
	var out []Finding
	now := r.o.Now()
	for _, field := range []string{FieldCABundle, FieldFailurePolicy} {
		if f, ok := fightFromWrites(w, field, now); ok {
			out = append(out, f)
			continue
		}
		if f, ok := fightFromOwners(w, field, now); ok {
			out = append(out, f)
		}
	}
	return out
}

// fight is two parties taking a field from each other.
type fight struct {
	a, b        string // managers; "" is the emptied field's no-owner
	flips       int
	first, last time.Time
}

// fightFromWrites finds, in w's writes of field within FightWindow of now
// (the newest maxWritesExamined), the pair of owners between which the
// field changed hands most often; a fight when that is at least twice
// (A -> B -> A).
func fightFromWrites(w *Webhook, field string, now time.Time) (Finding, bool) {
	var ws []FieldWrite
	for _, x := range w.Writes {
		if x.Field == field && now.Sub(x.At) <= FightWindow {
			ws = append(ws, x)
		}
	}
	if len(ws) > maxWritesExamined {
		ws = ws[len(ws)-maxWritesExamined:]
	}
	type pair struct{ a, b string }
	flips := map[pair]*fight{}
	var best *fight
	for i := 1; i < len(ws); i++ {
		prev, cur := ws[i-1], ws[i]
		if prev.Manager == cur.Manager {
			continue // one manager changing its own value (a rotation)
		}
		k := pair{prev.Manager, cur.Manager}
		if k.b < k.a {
			k = pair{k.b, k.a}
		}
		f := flips[k]
		if f == nil {
			// a is the side that held the field first.
			f = &fight{a: prev.Manager, b: cur.Manager, first: prev.At}
			flips[k] = f
		}
		f.flips++
		f.last = cur.At
		if best == nil || f.flips > best.flips || (f.flips == best.flips && f.last.After(best.last)) {
			best = f
		}
	}
	if best == nil || best.flips < 2 {
		return Finding{}, false
	}
	window := best.last.Sub(best.first).Round(time.Second)
	f := Finding{ID: IDFieldManagerFight, Severity: SeverityWarning,
		What: fmt.Sprintf("%s of webhook %s changed hands %d times within %s (%s to %s, UTC) between field managers %s and %s; its latest value is %s.",
			field, w.Name, best.flips, window, best.first.UTC().Format(time.RFC3339), best.last.UTC().Format(time.RFC3339),
			party(best.a), party(best.b), valueOf(ws[len(ws)-1])),
		Why: fightWhy(field, w),
		Fix: fightFix(w, field, []string{best.a, best.b}),
	}
	return f, true
}

// fightFromOwners is the one-read case (see the package comment above
// FightWindow): field owned by someone other than a keeper that changed
// the configuration within FightWindow of now.
func fightFromOwners(w *Webhook, field string, now time.Time) (Finding, bool) {
	var owners []FieldOwner
	for _, o := range w.Owners {
		if o.Field == field {
			owners = append(owners, o)
		}
	}
	for _, k := range keepers(w, field) {
		var kept *FieldOwner
		for i, m := range w.Managers {
			if k.is(m.Manager) {
				kept = &w.Managers[i] // newest first: its latest entry
				break
			}
		}
		if kept == nil || kept.Time.IsZero() || now.Sub(kept.Time) > FightWindow {
			continue // never wrote here, or not recently: no fight
		}
		owned := false
		for _, o := range owners {
			if k.is(o.Manager) {
				owned = true
			}
		}
		if owned {
			continue // the keeper owns it (alone or with an applier of the same value)
		}
		if len(owners) == 0 && (field == FieldFailurePolicy || len(w.ClientConfig.CABundle) > 0) {
			continue // a defaulted failurePolicy, or managedFields that do not cover a value: no evidence
		}
		var by string
		var names []string
		if len(owners) == 0 {
			by = "no field manager (the field was emptied, which records no owner)"
			names = []string{""}
		} else {
			var parts []string
			for _, o := range owners {
				at := ""
				if !o.Time.IsZero() {
					at = ", at " + o.Time.UTC().Format(time.RFC3339)
				}
				parts = append(parts, fmt.Sprintf("%s (%s%s)", party(o.Manager), o.Operation, at))
				names = append(names, o.Manager)
			}
			by = strings.Join(parts, ", ")
		}
		f := Finding{ID: IDFieldManagerFight, Severity: SeverityWarning,
			What: fmt.Sprintf("%s of webhook %s is owned by %s, not by %s (field manager %s), which keeps it and changed this configuration at %s, %s before this read: the field was overwritten after %s wrote it, and %s will write it again.",
				field, w.Name, by, k.what, party(kept.Manager), kept.Time.UTC().Format(time.RFC3339), now.Sub(kept.Time).Round(time.Second), k.what, k.what),
			Why: fightWhy(field, w) + " One read shows only the latest write: kadmit watch follows the writes and counts the flips.",
			Fix: fightFix(w, field, append(names, kept.Manager)),
		}
		return f, true
	}
	return Finding{}, false
}

// party names a manager for messages: quoted and bounded, since whoever
// writes the configuration chooses it.
func party(m string) string {
	if m == "" {
		return "(none: the field was emptied)"
	}
	return fmt.Sprintf("%q", boundManager(m))
}

// boundManager replaces unprintable runes and cuts m to maxManagerShown
// bytes at a rune boundary.
func boundManager(m string) string {
	if len(m) > 4*maxManagerShown {
		m = m[:4*maxManagerShown]
	}
	m = strings.Map(func(r rune) rune {
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			return utf8.RuneError
		}
		return r
	}, m)
	if len(m) > maxManagerShown {
		n := maxManagerShown
		for n > 0 && !utf8.RuneStart(m[n]) {
			n--
		}
		m = m[:n]
	}
	return m
}

func valueOf(x FieldWrite) string {
	if x.Value == "" {
		return "empty"
	}
	return fmt.Sprintf("%q", boundManager(x.Value))
}

func fightWhy(field string, w *Webhook) string {
	if field == FieldCABundle {
		why := "While the value flips, calls verified against the other side's caBundle fail with \"x509: certificate signed by unknown authority\" (an emptied caBundle fails every call): intermittent failures that clear and come back; " + consequence(w)
		return why + " Typical pairs: an injector (cert-manager's cainjector, kadmit) and a GitOps or Helm apply of a manifest that carries caBundle (a placeholder, or a CA the chart generates on every render), Argo CD's Replace=true, or two injectors for one configuration."
	}
	return "Each side puts back its own failurePolicy: whether a failed call rejects the request (Fail) or lets it through (Ignore) changes with every write. Typical pair: a registrar that owns its configuration and a GitOps apply of a manifest with another failurePolicy."
}

// fightFix is how to leave field to one writer: out of the manifest a
// GitOps tool or chart applies; Argo CD's ignoreDifferences
// (jqPathExpressions hides the field from the diff, managedFieldsManagers
// trusts the keeper's writes) with RespectIgnoreDifferences=true, so a
// sync does not put it back; for Flux, which applies server-side and so
// leaves alone a field its manifest does not declare, the
// kustomize.toolkit.fluxcd.io/ssa: IfNotPresent annotation when the
// manifest must carry it. Each names the configuration.
func fightFix(w *Webhook, field string, managers []string) string {
	kind := "ValidatingWebhookConfiguration"
	if w.Kind == KindMutating {
		kind = "MutatingWebhookConfiguration"
	}
	path := "clientConfig.caBundle"
	if field == FieldFailurePolicy {
		path = "failurePolicy"
	}
	var keep []string
	for _, m := range managers {
		for _, k := range []keeper{keeperCAInjector, keeperKadmitCA, keeperWebhookcerts} {
			if m != "" && k.is(m) && !slices.Contains(keep, m) {
				keep = append(keep, m)
			}
		}
	}
	mgrs := ""
	if len(keep) > 0 {
		var q []string
		for _, m := range keep {
			q = append(q, fmt.Sprintf("%q", boundManager(m)))
		}
		mgrs = "\n    managedFieldsManagers: [" + strings.Join(q, ", ") + "]"
	}
	return fmt.Sprintf("Leave %s to one writer: remove it from the manifest your GitOps tool or chart applies (no placeholder, no CA generated at render), and keep the tool from putting it back. Argo CD, in the Application (and no Replace=true sync option, which empties the field):\n"+
		"  spec:\n"+
		"    ignoreDifferences:\n"+
		"    - group: admissionregistration.k8s.io\n"+
		"      kind: %s\n"+
		"      name: %s\n"+
		"      jqPathExpressions: ['.webhooks[]?.%s']%s\n"+
		"    syncPolicy:\n"+
		"      syncOptions: [RespectIgnoreDifferences=true]\n"+
		"Flux (kustomize-controller applies server-side: a field the manifest does not declare stays the other writer's); if the manifest must keep it, annotate the %s %s in Git so that Flux creates it once and never re-applies it:\n"+
		"  metadata:\n"+
		"    annotations:\n"+
		"      kustomize.toolkit.fluxcd.io/ssa: IfNotPresent",
		path, kind, w.Configuration, path, strings.ReplaceAll(mgrs, "\n    ", "\n      "), kind, w.Configuration)
}
