package watch

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kadmit/kadmit/internal/doctor"
	"github.com/kadmit/kadmit/internal/testkit"
)

// fakeClock is a settable clock, safe for the informers' goroutines.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) t0() time.Time { return time.Unix(1_800_000_000, 0) }

func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// syncedCluster runs the watch's informers over cs (everything readable)
// without the evaluation loop, so the test's goroutine may call snapshot
// as the loop would.
func syncedCluster(t *testing.T, cs *fake.Clientset, now func() time.Time) *cluster {
	t.Helper()
	cl := newCluster(cs, now)
	if err := cl.register(map[string]bool{}, func() {}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	cl.start(ctx)
	if err := cl.waitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	return cl
}

// webhookNamed finds webhook name in s.
func webhookNamed(s *doctor.Snapshot, name string) *doctor.Webhook {
	for _, w := range s.Webhooks {
		if w.Name == name {
			return w
		}
	}
	return nil
}

// A caBundle flipped between two values by two field managers (an
// injector and a GitOps controller re-applying its own value) reaches
// Webhook.Writes oldest first, each write naming the manager that owns
// the field after it (from managedFields) and a digest of the value; a
// failurePolicy change by a third manager too. The webhook conversion
// stays cached while the configuration's resourceVersion does not change,
// and its Writes still follow the history (writes age out after
// FieldWriteWindow).
func TestFieldWritesNameBothManagers(t *testing.T) {
	clock := &fakeClock{}
	clock.t = clock.t0()
	cs := fake.NewClientset(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNS}}, testService("svc-h", 9443))
	cl := syncedCluster(t, cs, clock.now)
	ctx := context.Background()
	api := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	injected, gitops := []byte("bundle from the injector"), []byte("bundle from git")
	rv := 0
	// Each write is seen by the informer before the clock moves on, so
	// that the writes' times are 1 s apart.
	write := func(manager string, bundle []byte, fail bool) {
		t.Helper()
		rv++
		c := validatingConfig("cfg-h", "svc-h", fail, bundle, "h.example.com", "other.example.com")
		c.ResourceVersion = fmt.Sprint(rv) // the fake tracker keeps what it is given
		var err error
		if rv == 1 {
			_, err = api.Create(ctx, c, metav1.CreateOptions{FieldManager: manager})
		} else {
			_, err = api.Update(ctx, c, metav1.UpdateOptions{FieldManager: manager})
		}
		if err != nil {
			t.Fatal(err)
		}
		testkit.Eventually(t, 5*time.Second, "the informer to see resourceVersion "+c.ResourceVersion, func() bool {
			got, err := cl.validating.Get("cfg-h")
			return err == nil && got.ResourceVersion == c.ResourceVersion
		})
		clock.add(time.Second)
	}
	write("cert-manager-cainjector", injected, true)
	write("argocd-controller", gitops, true)
	write("cert-manager-cainjector", injected, true)
	write("argocd-controller", gitops, true)
	write("kubectl-edit", gitops, false)

	w := webhookNamed(mustSnap(t, cl), "h.example.com")
	// The last update changed only failurePolicy: a fourth caBundle write
	// would mean the history compared the wrong objects.
	want := []struct{ field, manager, value string }{
		{"caBundle", "argocd-controller", digest(gitops)},
		{"caBundle", "cert-manager-cainjector", digest(injected)},
		{"caBundle", "argocd-controller", digest(gitops)},
		{"failurePolicy", "kubectl-edit", "Ignore"},
	}
	if len(w.Writes) != len(want) {
		t.Fatalf("writes %+v, want %d", w.Writes, len(want))
	}
	for i, x := range want {
		g := w.Writes[i]
		if g.Field != x.field || g.Manager != x.manager || g.Value != x.value || !g.At.Equal(clock.t0().Add(time.Duration(i+1)*time.Second)) {
			t.Errorf("write %d: got %+v, want %+v at +%ds", i, g, x, i+1)
		}
	}
	if o := webhookNamed(mustSnap(t, cl), "other.example.com"); len(o.Writes) != len(want) {
		t.Errorf("the configuration's second webhook changed the same way and has %d writes", len(o.Writes))
	}
	if !strings.HasPrefix(w.Writes[0].Value, "sha256:") || len(w.Writes[0].Value) > 24 {
		t.Errorf("caBundle digest %q is not short", w.Writes[0].Value)
	}

	// Same resourceVersion: the same converted webhook (its compiled
	// matchConditions kept), with Writes following the history.
	again := webhookNamed(mustSnap(t, cl), "h.example.com")
	if again != w {
		t.Errorf("the webhook was converted again though its configuration did not change")
	}
	clock.add(FieldWriteWindow - 2*time.Second)
	if n := len(webhookNamed(mustSnap(t, cl), "h.example.com").Writes); n != 2 {
		t.Errorf("%d writes within %s of the last, want 2", n, FieldWriteWindow)
	}
	clock.add(time.Hour)
	if w := webhookNamed(mustSnap(t, cl), "h.example.com"); w != again || w.Writes != nil {
		t.Errorf("writes older than %s still given: %v (cached webhook reused: %v)", FieldWriteWindow, w.Writes, w == again)
	}
	if n, _ := cl.history.size(); n != 0 {
		t.Errorf("%d webhooks keep expired history", n)
	}
}

func mustSnap(t *testing.T, cl *cluster) *doctor.Snapshot {
	t.Helper()
	v, err := cl.snapshot(nil)
	if err != nil {
		t.Fatal(err)
	}
	return v.snap
}

// configWith is a configuration of the given webhooks, whose caBundle and
// failurePolicy the managedFields entry of manager owns.
func configWith(name, manager, bundle string, hooks ...string) *admissionregistrationv1.ValidatingWebhookConfiguration {
	c := validatingConfig(name, "svc", true, []byte(bundle), hooks...)
	c.ManagedFields = ownedBy(manager, hooks...)
	return c
}

// ownedBy is a managedFields entry of manager (an Update) owning the
// caBundle and failurePolicy of the webhooks hooks. The fake clientset
// tracks managedFields only of objects that have some, as an API server
// does of every object since 1.18.
func ownedBy(manager string, hooks ...string) []metav1.ManagedFieldsEntry {
	var fields []string
	for _, h := range hooks {
		fields = append(fields, fmt.Sprintf(`"k:{\"name\":\"%s\"}":{"f:clientConfig":{"f:caBundle":{}},"f:failurePolicy":{}}`, h))
	}
	return []metav1.ManagedFieldsEntry{{Manager: manager, Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "admissionregistration.k8s.io/v1", FieldsType: "FieldsV1",
		FieldsV1: metav1.NewFieldsV1(`{"f:webhooks":{` + strings.Join(fields, ",") + `}}`)}}
}

// The history's bounds: at most MaxFieldWrites per webhook (the latest),
// none older than FieldWriteWindow, nothing of a deleted configuration or
// of a webhook the configuration no longer holds, nothing of a
// configuration an evaluation does not list; manager names at most
// MaxManagerName bytes of printable runes.
func TestWriteHistoryBounds(t *testing.T) {
	h := newWriteHistory()
	t0 := time.Unix(1_800_000_000, 0)
	k := wkey{doctor.KindValidating, "cfg", "a.example.com"}
	prev := configWith("cfg", "m0", "b0", "a.example.com", "b.example.com")
	for i := 1; i <= 3*MaxFieldWrites; i++ {
		cur := configWith("cfg", fmt.Sprintf("m%d", i), fmt.Sprintf("b%d", i), "a.example.com", "b.example.com")
		h.update(t0.Add(time.Duration(i)*time.Second), prev, cur)
		prev = cur
	}
	ws := h.writes(k, t0.Add(time.Minute))
	if len(ws) != MaxFieldWrites {
		t.Fatalf("%d writes kept, want %d", len(ws), MaxFieldWrites)
	}
	if last := ws[len(ws)-1]; last.Manager != fmt.Sprintf("m%d", 3*MaxFieldWrites) || ws[0].Manager != fmt.Sprintf("m%d", 2*MaxFieldWrites+1) {
		t.Errorf("kept writes %s .. %s, want the latest %d", ws[0].Manager, last.Manager, MaxFieldWrites)
	}
	if n, w := h.size(); n != 2 || w != 2*MaxFieldWrites {
		t.Errorf("history holds %d webhooks, %d writes; want 2, %d", n, w, 2*MaxFieldWrites)
	}
	// The window: the last write was at t0+48s.
	end := t0.Add(time.Duration(3*MaxFieldWrites) * time.Second)
	if n := len(h.writes(k, end.Add(FieldWriteWindow-5*time.Second))); n != 6 {
		t.Errorf("%d writes within the window, want 6", n)
	}
	if ws := h.writes(k, end.Add(FieldWriteWindow+time.Second)); ws != nil {
		t.Errorf("expired writes returned: %v", ws)
	}
	// A webhook removed from its configuration loses its history.
	cur := configWith("cfg", "m", "new", "a.example.com")
	h.update(end, prev, cur)
	if n, _ := h.size(); n != 1 {
		t.Errorf("%d webhooks after b.example.com left the configuration, want 1", n)
	}
	// Deleted, directly or as a tombstone.
	h.forget(cur)
	if n, _ := h.size(); n != 0 {
		t.Errorf("a deleted configuration keeps %d webhooks of history", n)
	}
	// Many configurations and webhooks written, then deleted: nothing left.
	for c := range 200 {
		name := fmt.Sprintf("cfg-%d", c)
		hooks := []string{"a.example.com", "b.example.com", "c.example.com", "d.example.com", "e.example.com"}
		a, b := configWith(name, "injector", "x", hooks...), configWith(name, "gitops", "y", hooks...)
		h.update(end, a, b)
		h.update(end, b, a)
	}
	if n, w := h.size(); n != 1000 || w != 2000 {
		t.Fatalf("history of 200 configurations x 5 webhooks: %d webhooks, %d writes", n, w)
	}
	live := map[cfgKey]bool{}
	for c := range 200 {
		name := fmt.Sprintf("cfg-%d", c)
		switch {
		case c%2 == 0:
			h.forget(configWith(name, "", "", "a.example.com"))
		case c%4 == 1:
			// Deleted while the watch missed it: the next evaluation does not list it.
		default:
			live[cfgKey{doctor.KindValidating, name}] = true
		}
	}
	h.sweep(end, live)
	if n, _ := h.size(); n != 50*5 {
		t.Errorf("%d webhooks after deleting 150 of 200 configurations, want 250", n)
	}
	h.sweep(end.Add(FieldWriteWindow+time.Second), live)
	if n, w := h.size(); n != 0 || w != 0 {
		t.Errorf("%d webhooks, %d writes after the window passed", n, w)
	}

	// An attacker-chosen manager name: bounded, printable.
	long := strings.Repeat("m\x1b[31m\u202e", 400) + "\xff"
	a, b := configWith("x", long, "1", "a.example.com"), configWith("x", long, "2", "a.example.com")
	h.update(end, a, b)
	ws = h.writes(wkey{doctor.KindValidating, "x", "a.example.com"}, end)
	if len(ws) != 1 {
		t.Fatalf("writes %v", ws)
	}
	m := ws[0].Manager
	if len(m) > MaxManagerName || !utf8.ValidString(m) || strings.ContainsFunc(m, func(r rune) bool { return !unicode.IsPrint(r) && r != utf8.RuneError }) || strings.Contains(m, "\x1b") {
		t.Errorf("manager name kept as %d bytes %q", len(m), m)
	}
	// An emptied caBundle has no owner.
	h.update(end, b, configWith("x", "someone", "", "a.example.com"))
	ws = h.writes(wkey{doctor.KindValidating, "x", "a.example.com"}, end)
	if last := ws[len(ws)-1]; last.Manager != "" || last.Value != "" {
		t.Errorf("emptied caBundle recorded as %+v", last)
	}
}

// Through the informers: configurations created, rewritten by two
// managers and deleted leave no history behind.
func TestWriteHistoryFollowsDeletes(t *testing.T) {
	cs := fake.NewClientset()
	cl := syncedCluster(t, cs, time.Now)
	ctx := context.Background()
	api := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	const configs, hooks = 30, 4
	names := make([]string, hooks)
	for i := range names {
		names[i] = fmt.Sprintf("h%d.example.com", i)
	}
	for i := range configs {
		c := validatingConfig(fmt.Sprintf("cfg-%d", i), "svc", true, []byte("a"), names...)
		if _, err := api.Create(ctx, c, metav1.CreateOptions{FieldManager: "injector"}); err != nil {
			t.Fatal(err)
		}
		c = validatingConfig(c.Name, "svc", true, []byte("b"), names...)
		if _, err := api.Update(ctx, c, metav1.UpdateOptions{FieldManager: "gitops"}); err != nil {
			t.Fatal(err)
		}
	}
	testkit.Eventually(t, 10*time.Second, "every webhook's write recorded", func() bool {
		n, _ := cl.history.size()
		return n == configs*hooks
	})
	for i := range configs {
		if err := api.Delete(ctx, fmt.Sprintf("cfg-%d", i), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	testkit.Eventually(t, 10*time.Second, "the history of deleted configurations dropped", func() bool {
		n, _ := cl.history.size()
		return n == 0
	})
}

// The informers keep the configurations' managedFields (their entries name
// caBundle's field manager) and nothing else's; NetworkPolicies keep
// their spec only.
func TestClusterTransformKeepsConfigurationsManagedFields(t *testing.T) {
	c := configWith("cfg", "injector", "x", "a.example.com")
	out, err := clusterTransform(c.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	if got := out.(*admissionregistrationv1.ValidatingWebhookConfiguration); len(got.ManagedFields) != 1 || got.ManagedFields[0].Manager != "injector" {
		t.Errorf("configuration's managedFields: %v", got.ManagedFields)
	}
	svc := testService("s", 1)
	svc.ManagedFields = c.ManagedFields
	out, _ = clusterTransform(svc)
	if out.(*corev1.Service).ManagedFields != nil {
		t.Errorf("a Service keeps its managedFields")
	}
}

// The fight itself, end to end: an injector and a GitOps controller
// putting back each its own caBundle make KD609, a warning naming both
// field managers, in the webhook's state and as a Warning Event; the
// injector's own rotation before it raised none (TestNoFalseAlarms...
// covers a whole rotation).
func TestFieldManagerFightReported(t *testing.T) {
	const injector, gitops = "cert-manager-cainjector", "argocd-controller"
	cfg := validatingConfig("cfg-f", "svc-f", false, []byte("bundle 1"), "f.example.com")
	cfg.ManagedFields = ownedBy(injector, "f.example.com")
	r := startController(t, nil, testService("svc-f", 9443), slice("svc-f", 9443), cfg)
	testkit.Eventually(t, 10*time.Second, "first evaluation", r.c.Ready)
	ctx := context.Background()
	set := func(manager, bundle string) {
		t.Helper()
		if _, err := r.cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Update(ctx,
			validatingConfig("cfg-f", "svc-f", false, []byte(bundle), "f.example.com"), metav1.UpdateOptions{FieldManager: manager}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	set(injector, "bundle 2") // a rotation: no fight
	time.Sleep(300 * time.Millisecond)
	if has(r.states()["cfg-f/f.example.com"], doctor.IDFieldManagerFight, doctor.SeverityWarning) {
		t.Fatal("KD609 after one manager's rotation")
	}
	for range 2 {
		set(gitops, "bundle from git")
		set(injector, "bundle 2")
	}
	var f doctor.Finding
	testkit.Eventually(t, 10*time.Second, "KD609 confirmed", func() bool {
		for _, x := range r.states()["cfg-f/f.example.com"].findings {
			if x.ID == doctor.IDFieldManagerFight {
				f = x
				return true
			}
		}
		return false
	})
	if f.Severity != doctor.SeverityWarning || !strings.Contains(f.What, `"`+injector+`"`) || !strings.Contains(f.What, `"`+gitops+`"`) {
		t.Errorf("KD609: %s", f)
	}
	testkit.Eventually(t, 10*time.Second, "the KD609 Warning Event", func() bool {
		for _, e := range drain(r.rec) {
			if strings.HasPrefix(e, "Warning KD609 ") && strings.Contains(e, gitops) && strings.Contains(e, injector) {
				return true
			}
		}
		return false
	})
}
