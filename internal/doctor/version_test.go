package doctor

import (
	"context"
	"net"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/version"
	fakediscovery "k8s.io/client-go/discovery/fake"
	"k8s.io/client-go/kubernetes/fake"
)

// The three server versions the version-aware rules distinguish, as
// /version reports them; nil is a version doctor could not read.
var (
	v135 = &version.Info{Major: "1", Minor: "35", GitVersion: "v1.35.4"}
	v136 = &version.Info{Major: "1", Minor: "36", GitVersion: "v1.36.3"}
	v137 = &version.Info{Major: "1", Minor: "37", GitVersion: "v1.37.1"}
)

func TestServerMinor(t *testing.T) {
	cases := []struct {
		v    *version.Info
		want int
		ok   bool
	}{
		{v137, 37, true},
		{&version.Info{GitVersion: "v1.36.3-gke.1014001"}, 36, true},
		{&version.Info{GitVersion: "v1.35.0+k3s1"}, 35, true},
		{&version.Info{Major: "1", Minor: "37+"}, 37, true},
		{&version.Info{GitVersion: "v0.0.0-master+$Format:%H$"}, 0, false}, // a development build (client-go's fake)
		{nil, 0, false},
	}
	for _, c := range cases {
		if m, ok := serverMinor(c.v); m != c.want || ok != c.ok {
			t.Errorf("serverMinor(%+v) = %d, %v; want %d, %v", c.v, m, ok, c.want, c.ok)
		}
	}
}

// LoadSnapshot reads /version through discovery.
func TestLoadSnapshotServerVersion(t *testing.T) {
	cs := fake.NewClientset()
	cs.Discovery().(*fakediscovery.FakeDiscovery).FakedServerVersion = v136
	snap, err := LoadSnapshot(context.Background(), cs)
	if err != nil {
		t.Fatal(err)
	}
	if snap.ServerVersion == nil || snap.ServerVersion.GitVersion != "v1.36.3" {
		t.Errorf("ServerVersion = %+v", snap.ServerVersion)
	}
}

func versionRun(v *version.Info, hooks ...*Webhook) *run {
	return newRun(nil, &Snapshot{Webhooks: hooks, ServerVersion: v}, Options{})
}

func authHook(rules ...admissionregistrationv1.RuleWithOperations) *Webhook {
	return FromValidating(&admissionregistrationv1.ValidatingWebhookConfiguration{Webhooks: []admissionregistrationv1.ValidatingWebhook{{Name: "audit-auth.example.com", Rules: rules}}})[0]
}

// A webhook that audits TokenReviews and SubjectAccessReviews (a field
// pattern: "who authenticated") is never called from 1.37 on; 1.35 and
// 1.36 still call it; an unknown version is said to be unknown.
func TestVersionRulesVirtualResources(t *testing.T) {
	only := authHook(
		rule([]string{"authentication.k8s.io"}, []string{"v1"}, []string{"tokenreviews"}, "CREATE"),
		rule([]string{"authorization.k8s.io"}, []string{"v1"}, []string{"subjectaccessreviews", "selfsubjectaccessreviews"}, "CREATE"))
	for _, v := range []*version.Info{v135, v136} {
		if fs := versionRun(v, only).checkVersionRules(only); len(fs) != 0 {
			t.Errorf("%s: %+v", v.GitVersion, fs)
		}
	}
	fs := versionRun(v137, only).checkVersionRules(only)
	if len(fs) != 1 || fs[0].Severity != SeverityInfo || fs[0].ID != IDVirtualResourceRule ||
		!strings.Contains(fs[0].What, "select only tokenreviews (authentication.k8s.io), subjectaccessreviews (authorization.k8s.io), selfsubjectaccessreviews (authorization.k8s.io), which API server v1.37.1 never sends") ||
		!strings.Contains(fs[0].What, "never called") || !strings.Contains(fs[0].Why, "ExcludeAdmissionWebhookVirtualResources=false") ||
		!strings.Contains(fs[0].Fix, `[{"op":"remove","path":"/webhooks/0"}]`) {
		t.Errorf("1.37: %+v", fs)
	}
	fs = versionRun(nil, only).checkVersionRules(only)
	if len(fs) != 1 || !strings.Contains(fs[0].What, "could not read") || !strings.Contains(fs[0].Fix, "kubectl version") {
		t.Errorf("unknown version: %+v", fs)
	}

	// Mixed: pods stay, the reviews go; the fix keeps the rest of the rule.
	mixed := authHook(rule([]string{"", "authentication.k8s.io"}, []string{"v1"}, []string{"pods", "tokenreviews"}, "CREATE"),
		rule([]string{"authorization.k8s.io"}, []string{"v1"}, []string{"subjectaccessreviews"}, "CREATE"))
	fs = versionRun(v137, mixed).checkVersionRules(mixed)
	if len(fs) != 1 || !strings.Contains(fs[0].What, "never called for these") {
		t.Fatalf("mixed: %+v", fs)
	}
	// The first rule keeps tokenreviews (its entry serves group "" too:
	// only entries whose groups are all the review's own are dropped); the
	// second rule, subjectaccessreviews alone, goes.
	if !strings.Contains(fs[0].Fix, `"resources":["pods","tokenreviews"]`) || strings.Contains(fs[0].Fix, "subjectaccessreviews") {
		t.Errorf("mixed fix: %s", fs[0].Fix)
	}
	// Named only through apiGroups "*": never called for the reviews,
	// but the rule still selects other groups' resources of that name.
	star := authHook(rule([]string{"*"}, []string{"*"}, []string{"tokenreviews"}, "CREATE"))
	fs = versionRun(v137, star).checkVersionRules(star)
	if len(fs) != 1 || !strings.Contains(fs[0].What, "never called for these") || fs[0].Fix != "" {
		t.Errorf("star: %+v", fs)
	}
	// Wildcards name no virtual resource by name: KD606's text carries it.
	wild := authHook(rule([]string{"*"}, []string{"*"}, []string{"*"}, "*"))
	if fs := versionRun(v137, wild).checkVersionRules(wild); len(fs) != 0 {
		t.Errorf("wildcard: %+v", fs)
	}
}

// KD606 ("every resource goes through the webhook") names TokenReviews
// only where the server still sends them to webhooks.
func TestWildcardTextFollowsVersion(t *testing.T) {
	for _, c := range []struct {
		v         *version.Info
		want, not string
	}{
		{v135, "tokenreviews, subjectaccessreviews", "no longer"},
		{v136, "tokenreviews, subjectaccessreviews", "no longer"},
		{v137, "not TokenReviews or SubjectAccessReviews, which API server v1.37.1 no longer sends", "tokenreviews"},
		{nil, "before Kubernetes 1.37 also tokenreviews", "no longer"},
	} {
		w := authHook(rule([]string{"*"}, []string{"*"}, []string{"*"}, "*"))
		u := "https://127.0.0.1:30998/"
		w.ClientConfig.URL = &u
		snap := &Snapshot{Webhooks: []*Webhook{w}, Namespaces: map[string]map[string]string{}, NamespacesKnown: true, Backends: map[string]*Backend{}, ServerVersion: c.v}
		rep, err := Diagnose(context.Background(), nil, snap, Options{Dial: func(context.Context, string, string) (net.Conn, error) { return nil, ErrDialNotAllowed }})
		if err != nil {
			t.Fatal(err)
		}
		f := rep.Webhooks[0].ByID(IDWildcardResources)
		if len(f) != 1 || !strings.Contains(f[0].Why, c.want) || strings.Contains(f[0].Why, c.not) {
			t.Errorf("%+v: KD606 %+v", c.v, f)
		}
	}
}

// An API binding naming a *.static.k8s.io policy binds nothing (static
// and API policies are separate universes): KD004 from 1.36, not KD901;
// on 1.35 there is no static admission, so it is a missing policy.
func TestStaticPolicyBinding(t *testing.T) {
	set := &PolicySet{ValidatingBinding: []admissionregistrationv1.ValidatingAdmissionPolicyBinding{*vapb("protect-admission", "deny-admission-edits.static.k8s.io", nil), *vapb("orphan", "no-such-policy", nil)}}
	for _, c := range []struct {
		v    *version.Info
		want string
		note string
	}{
		{v135, IDPolicyBindingMissing, ""},
		{v136, IDStaticAdmission, "alpha in 1.36"},
		{v137, IDStaticAdmission, ""},
		{nil, IDStaticAdmission, "could not read"},
	} {
		reps := checkPolicies(set, c.v)
		var got *PolicyReport
		for i := range reps {
			if reps[i].Name == "protect-admission" {
				got = &reps[i]
			}
			if reps[i].Name == "orphan" && (len(reps[i].Findings) != 1 || reps[i].Findings[0].ID != IDPolicyBindingMissing) {
				t.Errorf("%+v: orphan %+v", c.v, reps[i].Findings)
			}
		}
		if got == nil || len(got.Findings) != 1 || got.Findings[0].ID != c.want || !strings.Contains(got.Findings[0].What, c.note) {
			t.Errorf("%+v: %+v", c.v, got)
			continue
		}
		if c.want == IDStaticAdmission && (got.Findings[0].Severity != SeverityWarning || !strings.Contains(got.Findings[0].What, "enforces nothing") ||
			!strings.Contains(got.Findings[0].Fix, "kubectl delete validatingadmissionpolicybinding protect-admission") || !strings.Contains(got.Findings[0].Why, "staticManifestsDir")) {
			t.Errorf("%+v: %+v", c.v, got.Findings[0])
		}
	}
}
