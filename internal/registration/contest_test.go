package registration

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"

	"github.com/kadmit/kadmit/internal/metrics"
	"github.com/kadmit/kadmit/internal/testkit"
)

// ownsCABundle is a managedFields FieldsV1 owning the caBundle of each
// named webhook.
func ownsCABundle(webhooks ...string) *metav1.FieldsV1 {
	var parts []string
	for _, w := range webhooks {
		parts = append(parts, fmt.Sprintf(`"k:{\"name\":\"%s\"}":{".":{},"f:clientConfig":{"f:caBundle":{}}}`, w))
	}
	return metav1.NewFieldsV1(`{"f:webhooks":{` + strings.Join(parts, ",") + `}}`)
}

func entry(manager string, op metav1.ManagedFieldsOperationType, at time.Time, f *metav1.FieldsV1) metav1.ManagedFieldsEntry {
	t := metav1.NewTime(at)
	return metav1.ManagedFieldsEntry{Manager: manager, Operation: op, APIVersion: "admissionregistration.k8s.io/v1", Time: &t, FieldsType: "FieldsV1", FieldsV1: f}
}

// TestFindRevert: who rewrote a caBundle, read from managedFields as the
// API server leaves them after each kind of write.
func TestFindRevert(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	want := map[string][]byte{"a.kadmit.io": []byte("CA"), "b.kadmit.io": []byte("CA")}
	stale := map[string][]byte{"a.kadmit.io": []byte("OLD"), "b.kadmit.io": []byte("CA")}
	removed := map[string][]byte{"a.kadmit.io": nil, "b.kadmit.io": []byte("CA")}
	long := strings.Repeat("m", 100) + "\nforged"
	for name, c := range map[string]struct {
		live    map[string][]byte
		fields  []metav1.ManagedFieldsEntry
		want    revert
		reverts bool
	}{
		"same bundles": {live: want, fields: []metav1.ManagedFieldsEntry{entry(FieldManager, metav1.ManagedFieldsOperationApply, t0, ownsCABundle("a.kadmit.io", "b.kadmit.io"))}},
		// Another replica (or a newer Secret) wrote it as kadmit: never a fight.
		"kadmit owns the other value": {live: stale, fields: []metav1.ManagedFieldsEntry{entry(FieldManager, metav1.ManagedFieldsOperationApply, t0, ownsCABundle("a.kadmit.io", "b.kadmit.io"))}},
		// An Update (Argo CD, kubectl edit) takes the fields it changes.
		"updated by argocd": {live: stale, reverts: true, fields: []metav1.ManagedFieldsEntry{
			entry(FieldManager, metav1.ManagedFieldsOperationApply, t0, ownsCABundle("b.kadmit.io")),
			entry("argocd-controller", metav1.ManagedFieldsOperationUpdate, t0.Add(time.Second), ownsCABundle("a.kadmit.io")),
		}, want: revert{webhooks: []string{"a.kadmit.io"}, manager: "argocd-controller", operation: "Update", owns: true}},
		// A forced apply (Flux's kustomize-controller, Argo CD's
		// ServerSideApply) too.
		"applied by flux": {live: stale, reverts: true, fields: []metav1.ManagedFieldsEntry{
			entry(FieldManager, metav1.ManagedFieldsOperationApply, t0, ownsCABundle("b.kadmit.io")),
			entry("kustomize-controller", metav1.ManagedFieldsOperationApply, t0.Add(time.Second), ownsCABundle("a.kadmit.io")),
		}, want: revert{webhooks: []string{"a.kadmit.io"}, manager: "kustomize-controller", operation: "Apply", owns: true}},
		// A removal leaves the field owned by nobody: the newest other
		// writer is named, as such.
		"removed, another writer": {live: removed, reverts: true, fields: []metav1.ManagedFieldsEntry{
			entry("helm", metav1.ManagedFieldsOperationUpdate, t0.Add(-time.Hour), metav1.NewFieldsV1(`{"f:metadata":{"f:labels":{}}}`)),
			entry(FieldManager, metav1.ManagedFieldsOperationApply, t0, ownsCABundle("b.kadmit.io")),
			entry("argocd-controller", metav1.ManagedFieldsOperationUpdate, t0.Add(-time.Minute), metav1.NewFieldsV1(`{"f:metadata":{"f:annotations":{}}}`)),
		}, want: revert{webhooks: []string{"a.kadmit.io"}, manager: "argocd-controller", operation: "Update"}},
		"removed, nobody else": {live: removed, reverts: true, fields: []metav1.ManagedFieldsEntry{
			entry(FieldManager, metav1.ManagedFieldsOperationApply, t0, ownsCABundle("b.kadmit.io")),
		}, want: revert{webhooks: []string{"a.kadmit.io"}, manager: UnknownManager}},
		// A webhook not registered yet is a change, not a revert.
		"webhook missing": {live: map[string][]byte{"b.kadmit.io": []byte("CA")}},
		// Whoever may write the configuration chooses the name: bounded
		// and escaped before it reaches a label, an Event or a log.
		"long manager": {live: stale, reverts: true, fields: []metav1.ManagedFieldsEntry{
			entry(long, metav1.ManagedFieldsOperationUpdate, t0, ownsCABundle("a.kadmit.io")),
		}, want: revert{webhooks: []string{"a.kadmit.io"}, manager: strings.Repeat("m", MaxManagerBytes) + "…[43 bytes cut]", operation: "Update", owns: true}},
	} {
		t.Run(name, func(t *testing.T) {
			got, ok := findRevert(metav1.ObjectMeta{ManagedFields: c.fields}, c.live, want)
			if ok != c.reverts {
				t.Fatalf("reverted = %t, want %t (%+v)", ok, c.reverts, got)
			}
			if fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Errorf("revert = %+v, want %+v", got, c.want)
			}
		})
	}
}

// TestContestBackoffBounds: the first ContestFreeRepairs reverts are
// repaired at once, then the wait doubles from ContestInitialBackoff and
// never exceeds ContestMaxBackoff however long the fight; a revert that
// comes while the registrar has not written again is the same revert; a
// revert ContestQuiet after the last starts over.
func TestContestBackoffBounds(t *testing.T) {
	c := &contest{armed: true}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	rev := revert{manager: "argocd-controller", owns: true}
	var waits []time.Duration
	for i := range 200 {
		rv := fmt.Sprint(2 * i)
		if !c.observe(now, rev, "", rv) {
			t.Fatalf("revert %d not counted", i+1)
		}
		// The other side writes again before the repair: not counted.
		if c.observe(now, rev, "", fmt.Sprint(2*i+1)) {
			t.Fatalf("revert %d counted twice", i+1)
		}
		// The repair is written, and the informer still shows the
		// revert: the same revert, not counted again.
		c.armed = true
		if c.observe(now, rev, "", fmt.Sprint(2*i+1)) {
			t.Fatalf("revert %d counted again from a lagging cache", i+1)
		}
		waits = append(waits, c.wait(now))
		if c.wait(now) > ContestMaxBackoff {
			t.Fatalf("revert %d waits %v, above the bound %v", i+1, c.wait(now), ContestMaxBackoff)
		}
		now = now.Add(c.wait(now) + time.Second) // repaired, reverted a second later
		c.armed = true
	}
	for i := range ContestFreeRepairs {
		if waits[i] != 0 {
			t.Errorf("revert %d waits %v, want an immediate repair", i+1, waits[i])
		}
	}
	want := ContestInitialBackoff
	for i := ContestFreeRepairs; i < len(waits); i++ {
		if waits[i] != want {
			t.Fatalf("revert %d waits %v, want %v (all: %v)", i+1, waits[i], want, waits[:i+1])
		}
		want = min(2*want, ContestMaxBackoff)
	}
	if !c.active(now) {
		t.Fatal("not active during the fight")
	}
	if c.active(now.Add(ContestQuiet)) {
		t.Fatal("still active ContestQuiet after the last revert")
	}
	// The other side stopped for ContestQuiet: the next revert is repaired at
	// once again.
	now = c.last.Add(ContestQuiet)
	c.observe(now, rev, "", "")
	if c.reverts != 1 || c.wait(now) != 0 || c.rev.manager != rev.manager {
		t.Fatalf("after the quiet period: revert %d by %q waits %v, want the first, at once, by %q", c.reverts, c.rev.manager, c.wait(now), rev.manager)
	}
}

// fight is a registrar (driven by calls to write, not Run, on a settable
// clock) with real metrics, an Event recorder, and a second writer.
type fight struct {
	*harness
	clock *fakeClock
	rec   *record.FakeRecorder
	prom  *prometheus.Registry
	p     pki
	stale []byte
}

func newFight(t *testing.T) *fight {
	t.Helper()
	f := &fight{clock: newFakeClock(), rec: record.NewFakeRecorder(100), prom: prometheus.NewRegistry(), p: newPKI(t), stale: newPKI(t).ca}
	obs, err := metrics.NewRegistration(f.prom)
	if err != nil {
		t.Fatal(err)
	}
	f.harness = newHarness(t, fake.NewClientset(), "kadmit", f.p, func(o *RegistrarOptions) {
		o.Now, o.Recorder, o.Observer = f.clock.Now, f.rec, obs
	})
	f.mustWrite(t, false)
	settled(t, f.reg, f.p.ca)
	return f
}

// mustWrite runs one write of the source's bundle and checks whether it
// was held back.
func (f *fight) mustWrite(t *testing.T, wantHeld bool) {
	t.Helper()
	held, err := f.reg.write(f.ctx, *f.bundle.Load(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if held != wantHeld {
		t.Fatalf("write held = %t, want %t", held, wantHeld)
	}
}

// revert resets the validating configuration's caBundles to f.stale with
// an Update as manager (Argo CD with Replace=true, or a chart rendering
// its own CA), and waits for the registrar's cache to show it.
func (f *fight) revert(t *testing.T, manager string) {
	t.Helper()
	v, err := f.cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(f.ctx, "kadmit", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range v.Webhooks {
		v.Webhooks[i].ClientConfig.CABundle = f.stale
	}
	if _, err := f.cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Update(f.ctx, v, metav1.UpdateOptions{FieldManager: manager}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "revert in the cache", func() bool {
		return bytes.Equal(cachedBundles(f.reg)["ValidatingWebhookConfiguration/pod-name.kadmit.io"], f.stale)
	})
}

func (f *fight) events() []string {
	var out []string
	for {
		select {
		case e := <-f.rec.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

func (f *fight) metric(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := f.prom.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue next
				}
			}
			if m.GetGauge() != nil {
				return m.GetGauge().GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	return -1
}

// TestRegistrarBacksOffFromAFight: a second field manager that resets the
// caBundle after every repair gets ContestFreeRepairs immediate repairs,
// then repairs after a doubling, bounded wait; the registrar says who it
// is fighting in one Warning Event, the metrics, readiness and Contested;
// a change of what kadmit wants is never held back; after ContestQuiet
// without a revert, everything clears and repairs are immediate again.
func TestRegistrarBacksOffFromAFight(t *testing.T) {
	f := newFight(t)
	const vwc = "ValidatingWebhookConfiguration"
	patches := countPatches(f.cs)
	backoff := time.Duration(0)
	const rounds = ContestFreeRepairs + 12 // past ContestMaxBackoff
	for i := 1; i <= rounds; i++ {
		f.revert(t, "argocd-controller")
		if i <= ContestFreeRepairs {
			f.mustWrite(t, false)
		} else {
			backoff = min(max(2*backoff, ContestInitialBackoff), ContestMaxBackoff)
			f.mustWrite(t, true)
			if got := f.reg.contestLeft(); got != backoff {
				t.Fatalf("revert %d: repair waits %v, want %v", i, got, backoff)
			}
			// Looks before the wait is over write nothing.
			f.clock.Add(backoff - time.Millisecond)
			f.mustWrite(t, true)
			f.clock.Add(time.Millisecond)
			f.mustWrite(t, false)
		}
		settled(t, f.reg, f.p.ca)
		f.mustWrite(t, false) // the cache shows the repair: nothing to write
		f.clock.Add(time.Second)
	}
	if n := countPatches(f.cs) - patches; n != rounds {
		t.Errorf("%d writes for %d reverts, want one repair each", n, rounds)
	}
	if got := f.metric(t, "kadmit_registration_ca_bundle_contested", "kind", vwc, "manager", "argocd-controller"); got != 1 {
		t.Errorf("contested gauge = %v, want 1", got)
	}
	if got := f.metric(t, "kadmit_registration_ca_bundle_reverts_total", "kind", vwc); got != rounds {
		t.Errorf("reverts_total = %v, want %d", got, rounds)
	}
	if got := f.metric(t, "kadmit_registration_repair_backoff_seconds", "kind", vwc); got != ContestMaxBackoff.Seconds() {
		t.Errorf("backoff gauge = %v, want %v", got, ContestMaxBackoff.Seconds())
	}
	if got := f.metric(t, "kadmit_registration_writes_total", "kind", vwc); got != rounds+1 {
		t.Errorf("writes_total = %v, want %d (registration and every repair)", got, rounds+1)
	}
	// One Warning for the fight, naming the manager (not one per revert).
	evs := f.events()
	if len(evs) != 1 || !strings.HasPrefix(evs[0], "Warning "+ReasonCABundleContested+" ") || !strings.Contains(evs[0], `"argocd-controller"`) ||
		!strings.Contains(evs[0], "pod-name.kadmit.io") {
		t.Fatalf("Events = %q, want one Warning %s naming argocd-controller and the webhook", evs, ReasonCABundleContested)
	}
	if err := f.reg.Contested(); err == nil || !strings.Contains(err.Error(), `"argocd-controller"`) || !strings.Contains(err.Error(), vwc) {
		t.Fatalf("Contested() = %v", err)
	}

	// One more revert: while the stale bundle is in place, readiness fails
	// and names the fight.
	f.revert(t, "argocd-controller")
	f.mustWrite(t, true)
	if err := f.reg.Ready(); err == nil || !strings.Contains(err.Error(), "unknown authority") || !strings.Contains(err.Error(), "argocd-controller") {
		t.Fatalf("Ready() with the other side's bundle = %v, want the verification error naming the fight", err)
	}
	// A new bundle (a rotation, a new cert-manager CA) is written at once.
	grown := append(bytes.Clone(newPKI(t).ca), f.p.ca...)
	f.setBundle(grown)
	f.mustWrite(t, false)
	settled(t, f.reg, grown)

	// A second manager takes over: announced at once.
	f.clock.Add(ContestEventInterval)
	f.revert(t, "kustomize-controller")
	f.mustWrite(t, true)
	if evs := f.events(); len(evs) != 1 || !strings.Contains(evs[0], `"kustomize-controller"`) {
		t.Fatalf("Events after a new manager = %q", evs)
	}
	if got := f.metric(t, "kadmit_registration_ca_bundle_contested", "manager", "argocd-controller"); got != -1 {
		t.Errorf("the previous manager's contested series is still there (%v)", got)
	}

	// Quiet: the fight ends, the series clear, a Normal Event says so, and
	// the next revert is repaired at once.
	f.clock.Add(ContestMaxBackoff)
	f.mustWrite(t, false)
	settled(t, f.reg, grown)
	f.clock.Add(ContestQuiet)
	f.reg.expireContests(f.clock.Now())
	if err := f.reg.Contested(); err != nil {
		t.Fatalf("Contested() after the quiet period = %v", err)
	}
	if got := f.metric(t, "kadmit_registration_ca_bundle_contested"); got != -1 {
		t.Errorf("contested series after the quiet period: %v", got)
	}
	if got := f.metric(t, "kadmit_registration_repair_backoff_seconds", "kind", vwc); got != 0 {
		t.Errorf("backoff gauge after the quiet period = %v", got)
	}
	if evs := f.events(); len(evs) != 1 || !strings.HasPrefix(evs[0], "Normal "+ReasonCABundleContestEnded+" ") {
		t.Fatalf("Events after the quiet period = %q", evs)
	}
	f.revert(t, "argocd-controller")
	f.mustWrite(t, false)
}

// TestRegistrarOwnManagerIsNoFight: a different caBundle written by
// kadmit's own field manager (another replica, whose certificate source
// differs for a moment) is repaired as before and counted as no revert.
func TestRegistrarOwnManagerIsNoFight(t *testing.T) {
	f := newFight(t)
	other := newPKI(t).ca
	for i := range ContestFreeRepairs + 3 {
		mwc, vwc, err := Build(testHooks(), Options{Name: "kadmit", URL: "https://127.0.0.1:9443", CABundle: other})
		if err != nil {
			t.Fatal(err)
		}
		if err := Apply(f.ctx, f.cs, mwc, vwc); err != nil {
			t.Fatal(err)
		}
		testkit.Eventually(t, 10*time.Second, "other replica's bundle in the cache", func() bool {
			return bytes.Equal(cachedBundles(f.reg)["ValidatingWebhookConfiguration/pod-name.kadmit.io"], other)
		})
		f.mustWrite(t, false)
		settled(t, f.reg, f.p.ca)
		f.clock.Add(time.Second)
		if err := f.reg.Contested(); err != nil {
			t.Fatalf("round %d: Contested() = %v", i, err)
		}
	}
	if got := f.metric(t, "kadmit_registration_ca_bundle_reverts_total"); got != -1 {
		t.Errorf("reverts counted: %v", got)
	}
	if evs := f.events(); len(evs) != 0 {
		t.Errorf("Events: %q", evs)
	}
}

// TestRegistrarEventsBounded: a fight whose manager name changes at every
// revert (whoever may write the configuration picks the names) yields at
// most ContestEventBurst Warnings at once, then one per
// ContestEventInterval, and one contested series.
func TestRegistrarEventsBounded(t *testing.T) {
	f := newFight(t)
	start := f.clock.Now()
	const contested = 6 // waits 1s, 2s, 4s, 8s, 16s, 32s
	for i := 1; i <= ContestFreeRepairs+contested; i++ {
		f.revert(t, fmt.Sprintf("manager-%d", i))
		held, err := f.reg.write(f.ctx, f.p.ca, 0)
		if err != nil {
			t.Fatal(err)
		}
		if held {
			f.clock.Add(f.reg.contestLeft())
			f.mustWrite(t, false)
		}
		settled(t, f.reg, f.p.ca)
		f.mustWrite(t, false)
	}
	elapsed := f.clock.Now().Sub(start)
	evs := f.events()
	if limit := ContestEventBurst + int(elapsed/ContestEventInterval); len(evs) > limit || len(evs) >= contested {
		t.Fatalf("%d Warnings for %d managers in %v; want at most %d", len(evs), contested, elapsed, limit)
	}
	if got := testutil.CollectAndCount(f.prom, "kadmit_registration_ca_bundle_contested"); got != 1 {
		t.Errorf("%d contested series, want 1 (the latest manager's)", got)
	}
}
