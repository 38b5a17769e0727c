package admission

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
)

// The per-Webhook match cache must answer as MatchRules does, for more
// attribute combinations than it holds, and start over when Hooks change.
func TestWebhookMatcherAgreesWithMatchRules(t *testing.T) {
	scope := admissionregistrationv1.NamespacedScope
	rule := func(res string, ops ...admissionregistrationv1.OperationType) admissionregistrationv1.RuleWithOperations {
		return admissionregistrationv1.RuleWithOperations{Operations: ops, Rule: admissionregistrationv1.Rule{
			APIGroups: []string{"", "apps"}, APIVersions: []string{"v1"}, Resources: []string{res}}}
	}
	nsRule := rule("*/*", admissionregistrationv1.Create)
	nsRule.Scope = &scope
	hooks := []Hook{
		{Rules: []admissionregistrationv1.RuleWithOperations{rule("pods", admissionregistrationv1.Create)}},
		{Rules: []admissionregistrationv1.RuleWithOperations{rule("pods/*", admissionregistrationv1.OperationAll)}},
		{Rules: []admissionregistrationv1.RuleWithOperations{rule("*/status", admissionregistrationv1.Update)}},
		{Rules: []admissionregistrationv1.RuleWithOperations{nsRule}},
	}
	w := &Webhook{Path: "/x", Type: Validating, Hooks: hooks}
	check := func(w *Webhook) {
		t.Helper()
		for round := range 2 { // the second round reads the cache
			for i := range maxMatchCache + 20 {
				for _, op := range []admissionv1.Operation{admissionv1.Create, admissionv1.Update, admissionv1.Delete} {
					for _, ns := range []string{"", "shop"} {
						req := &Request{}
						req.Resource.Group = []string{"", "apps", "batch"}[i%3]
						req.Resource.Version = "v1"
						req.Resource.Resource = []string{"pods", "nodes", "namespaces", fmt.Sprintf("r%d", i)}[i%4]
						req.SubResource = []string{"", "status", "exec"}[i%3]
						req.Operation, req.Namespace = op, ns
						m := w.matcher(req)
						for h := range w.Hooks {
							if got, want := m.match(w, h), MatchRules(w.Hooks[h].Rules, RuleAttributes(req)); got != want {
								t.Fatalf("round %d hook %d %+v: %v, want %v", round, h, req.Resource, got, want)
							}
						}
					}
				}
			}
		}
		if c := w.matched.Load(); c == nil || len(c.m) > maxMatchCache {
			t.Fatalf("cache %v: want at most %d entries", c, maxMatchCache)
		}
	}
	check(w)
	w.Hooks = []Hook{hooks[3], hooks[0]} // a new slice: the cache starts over
	check(w)
}

// A client-controlled resource name of any size is matched correctly but
// never kept by the match cache: 64 entries must not pin 64 huge strings.
func TestWebhookMatcherKeepsNoHugeKeys(t *testing.T) {
	w := &Webhook{Path: "/x", Type: Validating, Hooks: []Hook{{Rules: []admissionregistrationv1.RuleWithOperations{{
		Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.OperationAll},
		Rule:       admissionregistrationv1.Rule{APIGroups: []string{"*"}, APIVersions: []string{"*"}, Resources: []string{"*"}}}}}}}
	for i := range maxMatchCache {
		req := &Request{}
		req.Resource.Version = "v1"
		req.Resource.Resource = fmt.Sprintf("r%d", i) + string(bytes.Repeat([]byte("x"), maxMatchKeyBytes))
		req.Operation = admissionv1.Create
		if m := w.matcher(req); !m.match(w, 0) {
			t.Fatalf("request %d: the catch-all hook does not match", i)
		}
	}
	if c := w.matched.Load(); c != nil && len(c.m) != 0 {
		t.Fatalf("cache kept %d oversized keys", len(c.m))
	}
	req := &Request{}
	req.Resource.Version, req.Resource.Resource, req.Operation = "v1", "pods", admissionv1.Create
	w.matcher(req)
	if c := w.matched.Load(); c == nil || len(c.m) != 1 {
		t.Fatalf("a normal key was not cached: %v", c)
	}
}

func TestQueryTimeoutAgreesWithQuery(t *testing.T) {
	for _, q := range []string{"", "timeout=10s", "timeout=", "a=b&timeout=3s", "timeout=1s&timeout=2s", "timeoutx=1s",
		"x&timeout=5s", "timeout", "time%6Fut=7s", "timeout=1%73", "a=1;timeout=2s", "timeout=+1s", "&&timeout=4s&"} {
		r := httptest.NewRequest("POST", "/validate?"+q, nil)
		if got, want := queryTimeout(r), r.URL.Query().Get("timeout"); got != want {
			t.Errorf("%q: %q, want %q", q, got, want)
		}
	}
}

// appendResponse must write what encoding/json writes.
func TestAppendResponseMatchesEncodingJSON(t *testing.T) {
	pt := admissionv1.PatchTypeJSONPatch
	for i, resp := range []*admissionv1.AdmissionResponse{
		{UID: "705ab4f5-6393-11e8-b7cc-42010a800002", Allowed: true},
		{UID: "u", Allowed: true, Patch: []byte(`[{"op":"add","path":"/spec/tolerations/-","value":{"key":"a<b>&c"}}]`), PatchType: &pt},
		{UID: "u\"\\<>&\u2028é\x00\x1f", Allowed: true, Warnings: []string{"w1", "<b>&\u2029", "tab\there"},
			AuditAnnotations: map[string]string{"z": "1", "a": "x\"y", "m/k": "é"}},
		{UID: "u", Allowed: false},
		{UID: "u", Allowed: true, Patch: []byte("x"), Warnings: []string{}, AuditAnnotations: map[string]string{}},
		{UID: "bad\xffutf8", Allowed: true, Warnings: []string{"\xfe"}},
	} {
		for _, v := range []string{APIVersionV1, APIVersionV1beta1} {
			got, ok := appendResponse(nil, v, resp)
			if !ok {
				t.Fatalf("case %d: not handled", i)
			}
			var buf bytes.Buffer
			enc := json.NewEncoder(&buf)
			enc.SetEscapeHTML(false)
			if err := enc.Encode(Review{APIVersion: v, Kind: ReviewKind, Response: resp}); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, buf.Bytes()) {
				t.Errorf("case %d:\n got %s\nwant %s", i, got, buf.Bytes())
			}
		}
	}
	if _, ok := appendResponse(nil, APIVersionV1, &admissionv1.AdmissionResponse{UID: "u", Result: &metav1.Status{Code: 403}}); ok {
		t.Error("a response with a Status must be left to encoding/json")
	}
}
