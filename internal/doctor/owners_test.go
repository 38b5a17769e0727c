package doctor

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

var ownersNow = time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)

// mfEntry is a managedFields entry as the API server writes it.
func mfEntry(manager string, op metav1.ManagedFieldsOperationType, ago time.Duration, fields string) metav1.ManagedFieldsEntry {
	return metav1.ManagedFieldsEntry{Manager: manager, Operation: op, APIVersion: "admissionregistration.k8s.io/v1",
		Time: &metav1.Time{Time: ownersNow.Add(-ago)}, FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(fields)}
}

// hookSet is the FieldsV1 of one webhook list item with the given fields
// (`"f:failurePolicy":{}` ...); item adds the item itself and its key.
func hookSet(name string, item bool, fields ...string) string {
	parts := fields
	if item {
		parts = append([]string{`".":{}`, `"f:name":{}`}, fields...)
	}
	return fmt.Sprintf(`{"f:webhooks":{"k:{\"name\":\"%s\"}":{%s}}}`, name, strings.Join(parts, ","))
}

const (
	fCABundle = `"f:clientConfig":{"f:caBundle":{}}`
	fService  = `"f:clientConfig":{"f:url":{}}`
	fRest     = `"f:failurePolicy":{},"f:rules":{},"f:sideEffects":{},"f:admissionReviewVersions":{}`
	fNoPolicy = `"f:rules":{},"f:sideEffects":{},"f:admissionReviewVersions":{}`
	fBoth     = `"f:clientConfig":{"f:caBundle":{},"f:url":{}}`
)

// ownersConfig is a one-webhook MutatingWebhookConfiguration "cfg" (webhook
// "w.example.com") with the given managedFields and annotations.
func ownersConfig(ann map[string]string, entries ...metav1.ManagedFieldsEntry) *admissionregistrationv1.MutatingWebhookConfiguration {
	u := "https://127.0.0.1:30999/"
	none := admissionregistrationv1.SideEffectClassNone
	return &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "cfg", Annotations: ann, ManagedFields: entries},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{Name: "w.example.com", ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: &u, CABundle: testBundle},
			SideEffects: &none, AdmissionReviewVersions: []string{"v1"}}},
	}
}

func ownersFindings(t *testing.T, w *Webhook) []Finding {
	t.Helper()
	snap := &Snapshot{Webhooks: []*Webhook{w}, Namespaces: map[string]map[string]string{}, NamespacesKnown: true, Backends: map[string]*Backend{}}
	rep, err := Diagnose(context.Background(), nil, snap, Options{Now: func() time.Time { return ownersNow },
		Dial: func(context.Context, string, string) (net.Conn, error) { return nil, ErrDialNotAllowed }})
	if err != nil {
		t.Fatal(err)
	}
	return rep.Webhooks[0].ByID(IDFieldManagerFight)
}

var injectFrom = map[string]string{"cert-manager.io/inject-ca-from": "team-a/webhook-cert"}

func TestFromMutatingOwners(t *testing.T) {
	ann := map[string]string{"cert-manager.io/inject-ca-from": "ns/cert"}
	c := ownersConfig(ann,
		mfEntry("helm", metav1.ManagedFieldsOperationUpdate, time.Hour, hookSet("w.example.com", true, fService, fRest)),
		mfEntry("cert-manager-cainjector", metav1.ManagedFieldsOperationApply, time.Minute, hookSet("w.example.com", true, fCABundle)),
		mfEntry("other-hook-only", metav1.ManagedFieldsOperationApply, time.Minute, hookSet("other.example.com", true, fCABundle)),
	)
	ifNeeded := admissionregistrationv1.IfNeededReinvocationPolicy
	c.Webhooks = append(c.Webhooks, c.Webhooks[0])
	c.Webhooks[1].Name, c.Webhooks[1].ReinvocationPolicy = "other.example.com", &ifNeeded
	ws := FromMutating(c)
	w := ws[0]
	ann["changed"] = "after" // the webhook keeps its own copy
	if w.ReinvocationPolicy != admissionregistrationv1.NeverReinvocationPolicy || ws[1].ReinvocationPolicy != ifNeeded || w.Annotations["cert-manager.io/inject-ca-from"] != "ns/cert" || w.Annotations["changed"] != "" {
		t.Errorf("defaults/annotations: %+v %+v", w.ReinvocationPolicy, w.Annotations)
	}
	want := []FieldOwner{
		{Field: FieldCABundle, Manager: "cert-manager-cainjector", Operation: "Apply", Time: ownersNow.Add(-time.Minute)},
		{Field: FieldFailurePolicy, Manager: "helm", Operation: "Update", Time: ownersNow.Add(-time.Hour)},
	}
	if fmt.Sprint(w.Owners) != fmt.Sprint(want) {
		t.Errorf("Owners = %+v\nwant %+v", w.Owners, want)
	}
	if len(w.Managers) != 2 || w.Managers[0].Manager != "cert-manager-cainjector" || w.Managers[1].Manager != "helm" {
		t.Errorf("Managers = %+v", w.Managers)
	}
	if len(ws[1].Owners) != 1 || ws[1].Owners[0].Manager != "other-hook-only" {
		t.Errorf("other webhook's Owners = %+v", ws[1].Owners)
	}
	v := FromValidating(&admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "v"}, Webhooks: []admissionregistrationv1.ValidatingWebhook{{Name: "x"}}})
	if v[0].ReinvocationPolicy != admissionregistrationv1.NeverReinvocationPolicy || v[0].Owners != nil {
		t.Errorf("validating: %+v", v[0])
	}

	// Bound: 40 appliers of the same caBundle.
	var many []metav1.ManagedFieldsEntry
	for i := range 40 {
		many = append(many, mfEntry(fmt.Sprintf("applier-%d", i), metav1.ManagedFieldsOperationApply, time.Duration(i)*time.Second, hookSet("w.example.com", true, fCABundle)))
	}
	w = FromMutating(ownersConfig(nil, many...))[0]
	if len(w.Owners) != MaxFieldOwners || len(w.Managers) != MaxFieldOwners || w.Owners[0].Manager != "applier-0" {
		t.Errorf("%d owners, %d managers (newest %q); want %d each, newest first", len(w.Owners), len(w.Managers), w.Owners[0].Manager, MaxFieldOwners)
	}
}

// Normal installs give no KD609.
func TestFieldOwnersNoFalseAlarm(t *testing.T) {
	cases := map[string]*admissionregistrationv1.MutatingWebhookConfiguration{
		// kadmit's registrar applies everything, caBundle included.
		"kadmit registrar": ownersConfig(nil, mfEntry("kadmit", metav1.ManagedFieldsOperationApply, time.Minute, hookSet("w.example.com", true, fBoth, fRest))),
		// Helm installs without caBundle, cert-manager's cainjector injects;
		// a later helm upgrade changes other fields only.
		"helm + cainjector": ownersConfig(injectFrom,
			mfEntry("helm", metav1.ManagedFieldsOperationUpdate, time.Minute, hookSet("w.example.com", true, fService, fRest)),
			mfEntry("cert-manager-cainjector", metav1.ManagedFieldsOperationApply, 10*time.Minute, hookSet("w.example.com", true, fCABundle))),
		"kubectl + cainjector just injected": ownersConfig(injectFrom,
			mfEntry("kubectl-client-side-apply", metav1.ManagedFieldsOperationUpdate, time.Hour, hookSet("w.example.com", true, fService, fRest)),
			mfEntry("cert-manager-cainjector", metav1.ManagedFieldsOperationApply, 5*time.Second, hookSet("w.example.com", true, fCABundle))),
		// Two appliers of the same value share the field: agreement.
		"co-owned": ownersConfig(injectFrom,
			mfEntry("argocd-controller", metav1.ManagedFieldsOperationApply, time.Minute, hookSet("w.example.com", true, fBoth, fRest)),
			mfEntry("cert-manager-cainjector", metav1.ManagedFieldsOperationApply, 2*time.Minute, hookSet("w.example.com", true, fCABundle))),
		// The injector wrote long ago and someone changed caBundle since:
		// no fight (the certificate checks say what is broken).
		"keeper idle": ownersConfig(injectFrom,
			mfEntry("helm", metav1.ManagedFieldsOperationUpdate, time.Minute, hookSet("w.example.com", true, fBoth, fRest)),
			mfEntry("cert-manager-cainjector", metav1.ManagedFieldsOperationApply, 2*time.Hour, hookSet("w.example.com", true))),
		// kadmit applies without failurePolicy (defaulted to Fail, owned by
		// nobody): no one took it from kadmit.
		"defaulted failurePolicy": ownersConfig(nil, mfEntry("kadmit", metav1.ManagedFieldsOperationApply, time.Second, hookSet("w.example.com", true, fBoth, fNoPolicy))),
		// A caBundle no entry covers (managedFields stripped by a
		// backup/restore): no evidence either way.
		"caBundle without owner": ownersConfig(injectFrom,
			mfEntry("cert-manager-cainjector", metav1.ManagedFieldsOperationApply, 5*time.Second, hookSet("w.example.com", true))),
		// No keeper at all: a chart that manages its own caBundle.
		"self-managed chart": ownersConfig(nil, mfEntry("helm", metav1.ManagedFieldsOperationUpdate, time.Second, hookSet("w.example.com", true, fBoth, fRest))),
	}
	for name, c := range cases {
		if fs := ownersFindings(t, FromMutating(c)[0]); len(fs) > 0 {
			t.Errorf("%s: %+v", name, fs)
		}
	}
}

// One read: caBundle owned by Argo CD while cert-manager's cainjector,
// which the annotation declares, wrote the configuration seconds before.
func TestFieldOwnersOverwriteInOneRead(t *testing.T) {
	c := ownersConfig(injectFrom,
		mfEntry("argocd-controller", metav1.ManagedFieldsOperationUpdate, 20*time.Second, hookSet("w.example.com", true, fBoth, fRest)),
		mfEntry("cert-manager-cainjector", metav1.ManagedFieldsOperationApply, 25*time.Second, hookSet("w.example.com", true)))
	fs := ownersFindings(t, FromMutating(c)[0])
	if len(fs) != 1 {
		t.Fatalf("want one KD609: %+v", fs)
	}
	f := fs[0]
	for _, want := range []string{`caBundle of webhook w.example.com is owned by "argocd-controller" (Update, at 2026-11-28T11:59:40Z)`, `cert-manager's cainjector (field manager "cert-manager-cainjector")`, "25s before this read"} {
		if !strings.Contains(f.What, want) {
			t.Errorf("What lacks %q: %s", want, f.What)
		}
	}
	for _, want := range []string{"ignoreDifferences:", "kind: MutatingWebhookConfiguration", "name: cfg", "jqPathExpressions: ['.webhooks[]?.clientConfig.caBundle']",
		`managedFieldsManagers: ["cert-manager-cainjector"]`, "RespectIgnoreDifferences=true", "kustomize.toolkit.fluxcd.io/ssa: IfNotPresent"} {
		if !strings.Contains(f.Fix, want) {
			t.Errorf("Fix lacks %q:\n%s", want, f.Fix)
		}
	}
	if f.Severity != SeverityWarning || !strings.Contains(f.Why, "unknown authority") {
		t.Errorf("%+v", f)
	}

	// Emptied (Argo CD Replace=true): nobody owns an empty caBundle.
	c = ownersConfig(injectFrom,
		mfEntry("argocd-controller", metav1.ManagedFieldsOperationUpdate, 20*time.Second, hookSet("w.example.com", true, fService, fRest)),
		mfEntry("cert-manager-cainjector", metav1.ManagedFieldsOperationApply, 10*time.Second, hookSet("w.example.com", true)))
	c.Webhooks[0].ClientConfig.CABundle = nil
	fs = ownersFindings(t, FromMutating(c)[0])
	if len(fs) != 1 || !strings.Contains(fs[0].What, "owned by no field manager") {
		t.Fatalf("emptied: %+v", fs)
	}

	// kadmit's registrar keeps failurePolicy too; webhookcerts keeps caBundle.
	c = ownersConfig(nil,
		mfEntry("kadmit", metav1.ManagedFieldsOperationApply, time.Minute, hookSet("w.example.com", true, fBoth, fNoPolicy)),
		mfEntry("argocd-controller", metav1.ManagedFieldsOperationUpdate, 30*time.Second, hookSet("w.example.com", false, `"f:failurePolicy":{}`)))
	fs = ownersFindings(t, FromMutating(c)[0])
	if len(fs) != 1 || !strings.HasPrefix(fs[0].What, "failurePolicy of webhook w.example.com") || !strings.Contains(fs[0].What, "kadmit's registrar") ||
		!strings.Contains(fs[0].Fix, "jqPathExpressions: ['.webhooks[]?.failurePolicy']") {
		t.Fatalf("failurePolicy: %+v", fs)
	}
	c = ownersConfig(nil,
		mfEntry("webhookcerts", metav1.ManagedFieldsOperationApply, time.Minute, hookSet("w.example.com", true)),
		mfEntry("helm", metav1.ManagedFieldsOperationUpdate, 30*time.Second, hookSet("w.example.com", true, fBoth, fRest)))
	fs = ownersFindings(t, FromMutating(c)[0])
	if len(fs) != 1 || !strings.Contains(fs[0].What, `owned by "helm"`) || !strings.Contains(fs[0].Fix, `managedFieldsManagers: ["webhookcerts"]`) {
		t.Fatalf("webhookcerts: %+v", fs)
	}
}

func fightWrites(ago time.Duration, pairs ...string) []FieldWrite {
	var out []FieldWrite
	for i := 0; i < len(pairs); i += 2 {
		out = append(out, FieldWrite{Field: FieldCABundle, Manager: pairs[i], Value: pairs[i+1], At: ownersNow.Add(-ago + time.Duration(i)*time.Minute)})
	}
	return out
}

// From the watch's history: the owner alternating A -> B -> A is a fight;
// one manager rotating, a single hand-over, or old writes are not.
func TestFieldOwnersFromWrites(t *testing.T) {
	w := FromMutating(ownersConfig(injectFrom))[0]
	// Argo CD's Replace=true empties caBundle, the cainjector puts it back.
	w.Writes = fightWrites(10*time.Minute, "cert-manager-cainjector", "sha256:aaaaaaaaaaaa", "", "", "cert-manager-cainjector", "sha256:aaaaaaaaaaaa", "", "", "cert-manager-cainjector", "sha256:aaaaaaaaaaaa")
	fs := ownersFindings(t, w)
	if len(fs) != 1 {
		t.Fatalf("want one KD609: %+v", fs)
	}
	for _, want := range []string{"caBundle of webhook w.example.com changed hands 4 times within 8m0s", `"cert-manager-cainjector"`, "(none: the field was emptied)", `latest value is "sha256:aaaaaaaaaaaa"`} {
		if !strings.Contains(fs[0].What, want) {
			t.Errorf("What lacks %q: %s", want, fs[0].What)
		}
	}
	// Two managers with values.
	w.Writes = fightWrites(5*time.Minute, "kadmit", "sha256:a", "argocd-controller", "sha256:b", "kadmit", "sha256:a")
	if fs = ownersFindings(t, w); len(fs) != 1 || !strings.Contains(fs[0].What, `2 times`) || !strings.Contains(fs[0].Fix, `managedFieldsManagers: ["kadmit"]`) {
		t.Errorf("A->B->A: %+v", fs)
	}
	for name, ws := range map[string][]FieldWrite{
		"rotation":  fightWrites(5*time.Minute, "kadmit", "sha256:a", "kadmit", "sha256:b", "kadmit", "sha256:c"),
		"migration": fightWrites(5*time.Minute, "cert-manager-cainjector", "sha256:a", "kadmit", "sha256:b"),
		"old":       fightWrites(3*time.Hour, "kadmit", "sha256:a", "argocd-controller", "sha256:b", "kadmit", "sha256:a"),
	} {
		w.Writes = ws
		if fs := ownersFindings(t, w); len(fs) > 0 {
			t.Errorf("%s: %+v", name, fs)
		}
	}
}

// Bounds: only the newest maxWritesExamined writes are looked at, and a
// manager name set by an attacker is cut and cleaned before it reaches a
// message.
func TestFieldOwnersBounds(t *testing.T) {
	w := FromMutating(ownersConfig(nil))[0]
	for i := range 10000 {
		m := []string{"a", "b"}[i%2]
		w.Writes = append(w.Writes, FieldWrite{Field: FieldCABundle, Manager: m, Value: m, At: ownersNow.Add(-time.Minute + time.Duration(i)*time.Millisecond)})
	}
	fs := ownersFindings(t, w)
	if len(fs) != 1 || !strings.Contains(fs[0].What, fmt.Sprintf("changed hands %d times", maxWritesExamined-1)) {
		t.Fatalf("bounded writes: %+v", fs)
	}
	evil := "x\x1b[31m\n" + strings.Repeat("é", 600)
	w.Writes = fightWrites(5*time.Minute, "kadmit", "v", evil, "w", "kadmit", "v")
	fs = ownersFindings(t, w)
	if len(fs) != 1 {
		t.Fatalf("%+v", fs)
	}
	p := party(evil)
	if len(p) > maxManagerShown+2+6 || strings.ContainsAny(boundManager(evil), "\x1b\n") || !strings.Contains(fs[0].What, p) {
		t.Errorf("manager shown as %d bytes: %q", len(p), p)
	}
}
