package admission

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	jsonpatch4 "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/kadmit/kadmit/internal/jsonedit"
)

var podRule = []admissionregistrationv1.RuleWithOperations{{
	Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
	Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
}}

const podJSON = `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","labels":{"a":"b"}},"spec":{"containers":[{"name":"c","image":"i"}]}}`

func reviewBody(apiVersion, uid, object string) []byte {
	return []byte(fmt.Sprintf(`{"apiVersion":%q,"kind":"AdmissionReview","request":{"uid":%q,
		"kind":{"group":"","version":"v1","kind":"Pod"},"resource":{"group":"","version":"v1","resource":"pods"},
		"namespace":"default","name":"p","operation":"CREATE","userInfo":{"username":"u"},"object":%s}}`, apiVersion, uid, object))
}

func validating(f func(ctx context.Context, req *Request) Verdict) *Webhook {
	whs, err := NewWebhooks([]Hook{{Policy: "test", Path: "/validate", Type: Validating, Rules: podRule, Validator: ValidatorFunc(f)}})
	if err != nil {
		panic(err)
	}
	return whs[0]
}

func mutating(f func(ctx context.Context, req *Request) ([]jsonedit.Op, Verdict)) *Webhook {
	whs, err := NewWebhooks([]Hook{{Policy: "test", Path: "/mutate", Type: Mutating, Rules: podRule, Mutator: MutatorFunc(f)}})
	if err != nil {
		panic(err)
	}
	return whs[0]
}

func post(t *testing.T, h http.Handler, contentType string, body []byte) (*httptest.ResponseRecorder, *Review) {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, "/x?timeout=10s", bytes.NewReader(body))
	if contentType != "" {
		r.Header.Set("Content-Type", contentType)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusOK {
		return w, nil
	}
	var rev Review
	if err := json.Unmarshal(w.Body.Bytes(), &rev); err != nil {
		t.Fatalf("response is not JSON: %v: %s", err, w.Body.String())
	}
	return w, &rev
}

func TestDecodeReview(t *testing.T) {
	for _, tc := range []struct {
		name, body, wantErr string
	}{
		{"v1", string(reviewBody(APIVersionV1, "u1", podJSON)), ""},
		{"v1beta1", string(reviewBody(APIVersionV1beta1, "u1", podJSON)), ""},
		{"not json", `{"apiVersion":`, "malformed AdmissionReview"},
		{"array", `[]`, "malformed AdmissionReview"},
		{"wrong version", strings.Replace(string(reviewBody(APIVersionV1, "u", podJSON)), "admission.k8s.io/v1", "admission.k8s.io/v2", 1), `apiVersion "admission.k8s.io/v2"`},
		{"wrong kind", `{"apiVersion":"admission.k8s.io/v1","kind":"Pod","request":{"uid":"x"}}`, `kind "Pod"`},
		{"no request", `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`, "request is missing"},
		{"no uid", `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{}}`, "request.uid is missing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rev, err := DecodeReview([]byte(tc.body))
			if tc.wantErr == "" {
				if err != nil || rev.Request.UID != "u1" {
					t.Fatalf("DecodeReview: %v, %+v", err, rev)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, ErrMalformedReview) {
				t.Fatalf("err = %v, want containing %q and wrapping ErrMalformedReview", err, tc.wantErr)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("error is not one line: %q", err)
			}
		})
	}
}

func TestHandlerEchoesVersionAndUID(t *testing.T) {
	h := NewHandler(validating(func(context.Context, *Request) Verdict { return Allow() }), HandlerOptions{})
	for _, v := range []string{APIVersionV1, APIVersionV1beta1} {
		w, rev := post(t, h, "application/json", reviewBody(v, "uid-"+v, podJSON))
		if w.Code != 200 || rev.APIVersion != v || rev.Kind != ReviewKind || string(rev.Response.UID) != "uid-"+v || !rev.Response.Allowed {
			t.Fatalf("%s: code %d review %+v", v, w.Code, rev)
		}
		if rev.Request != nil || rev.Response.Patch != nil || rev.Response.PatchType != nil {
			t.Fatalf("%s: validating response carries request or patch: %s", v, w.Body.String())
		}
		if ct := w.Header().Get("Content-Type"); ct != "application/json" {
			t.Fatalf("Content-Type %q", ct)
		}
	}
}

func TestHandlerBadInput(t *testing.T) {
	var decisions []Decision
	h := NewHandler(validating(func(context.Context, *Request) Verdict { return Allow() }),
		HandlerOptions{MaxRequestBytes: 4096, Observe: func(_ context.Context, d Decision) { decisions = append(decisions, d) }})
	big := reviewBody(APIVersionV1, "u", `{"kind":"Pod","metadata":{"name":"`+strings.Repeat("x", 5000)+`"}}`)
	for _, tc := range []struct {
		name, ct string
		body     []byte
		code     int
		msg      string
	}{
		{"no content type", "", reviewBody(APIVersionV1, "u", podJSON), 415, "is not application/json"},
		{"yaml", "application/yaml", reviewBody(APIVersionV1, "u", podJSON), 415, "is not application/json"},
		{"charset ok", "application/json; charset=utf-8", reviewBody(APIVersionV1, "u", podJSON), 200, ""},
		{"too large", "application/json", big, 413, "exceeds 4096 bytes"},
		{"malformed", "application/json", []byte(`{"apiVersion": nope`), 400, "malformed AdmissionReview"},
		{"empty", "application/json", nil, 400, "malformed AdmissionReview"},
		{"no uid", "application/json", []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{}}`), 400, "request.uid is missing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, _ := post(t, h, tc.ct, tc.body)
			if w.Code != tc.code || !strings.Contains(w.Body.String(), tc.msg) {
				t.Fatalf("code %d body %q, want %d containing %q", w.Code, w.Body.String(), tc.code, tc.msg)
			}
			if got := decisions[len(decisions)-1].HTTPCode; got != tc.code {
				t.Fatalf("observed HTTP code %d, want %d", got, tc.code)
			}
		})
	}
	r := httptest.NewRequest(http.MethodGet, "/x", nil)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusMethodNotAllowed {
		t.Fatalf("GET: %d", w.Code)
	}
}

func TestHandlerPanicIs500(t *testing.T) {
	var got Decision
	h := NewHandler(validating(func(context.Context, *Request) Verdict { panic("boom") }),
		HandlerOptions{Observe: func(_ context.Context, d Decision) { got = d }})
	w, _ := post(t, h, "application/json", reviewBody(APIVersionV1, "panic-uid", podJSON))
	if w.Code != http.StatusInternalServerError || !strings.Contains(w.Body.String(), "policy test panicked: boom") {
		t.Fatalf("code %d body %q", w.Code, w.Body.String())
	}
	if got.Panic == nil || got.Panic.Policy != "test" || got.UID != "panic-uid" || len(got.Panic.Stack) == 0 {
		t.Fatalf("decision %+v", got)
	}
}

func TestHandlerTimeout(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	h := NewHandler(validating(func(context.Context, *Request) Verdict { <-release; return Allow() }), HandlerOptions{})
	// 2 s: the handler answers at 90 % of it, and the 200 ms margin keeps
	// the check meaningful on a loaded 2-core CI machine.
	r := httptest.NewRequest(http.MethodPost, "/x?timeout=2s", bytes.NewReader(reviewBody(APIVersionV1, "u", podJSON)))
	r.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	start := time.Now()
	// A handler that does not enforce the deadline would wait for the
	// policy forever: wait a bounded time, then fail (the deferred close
	// lets it return).
	answered := make(chan struct{})
	go func() { defer close(answered); h.ServeHTTP(w, r) }()
	select {
	case <-answered:
	case <-time.After(10 * time.Second):
		t.Fatal("no answer 10s after a 2s timeout: the review deadline is not enforced")
	}
	if w.Code != http.StatusInternalServerError || !strings.Contains(w.Body.String(), "deadline") {
		t.Fatalf("code %d body %q", w.Code, w.Body.String())
	}
	// The answer must come before the API server's own deadline.
	if el := time.Since(start); el >= 2*time.Second {
		t.Fatalf("answered after %s, not before the 2s timeout", el)
	}
}

func TestDenialCarriesStatus(t *testing.T) {
	h := NewHandler(validating(func(context.Context, *Request) Verdict {
		return Deny("pod name contains %q", "offensive").WithWarnings("w1", strings.Repeat("é", 200), "line\nbreak")
	}), HandlerOptions{})
	_, rev := post(t, h, "application/json", reviewBody(APIVersionV1, "u", podJSON))
	res := rev.Response
	if res.Allowed || res.Result == nil || res.Result.Code != 403 || res.Result.Message != `pod name contains "offensive"` || res.Result.Reason != "Forbidden" {
		t.Fatalf("response %+v", res)
	}
	if len(res.Warnings) != 3 || len([]rune(res.Warnings[1])) != MaxWarningLength || res.Warnings[2] != "line break" {
		t.Fatalf("warnings %q", res.Warnings)
	}
	h = NewHandler(validating(func(context.Context, *Request) Verdict { return Invalid("bad label") }), HandlerOptions{})
	_, rev = post(t, h, "application/json", reviewBody(APIVersionV1, "u", podJSON))
	if rev.Response.Result.Code != 400 || rev.Response.Result.Reason != "BadRequest" {
		t.Fatalf("invalid: %+v", rev.Response.Result)
	}
}

func TestMutatingPatch(t *testing.T) {
	h := NewHandler(mutating(func(_ context.Context, req *Request) ([]jsonedit.Op, Verdict) {
		d := jsonedit.NewDoc(req.Object.Raw)
		if err := d.Set("ü~/<&>", "metadata", "labels", "added~/"); err != nil {
			return nil, Invalid("%v", err)
		}
		return d.Ops(), Allow().WithAuditAnnotation("decision", "labelled")
	}), HandlerOptions{})
	w, rev := post(t, h, "application/json", reviewBody(APIVersionV1beta1, "u", podJSON))
	res := rev.Response
	if !res.Allowed || res.PatchType == nil || *res.PatchType != admissionv1.PatchTypeJSONPatch || res.AuditAnnotations["decision"] != "labelled" {
		t.Fatalf("response %+v", res)
	}
	if want := `[{"op":"add","path":"/metadata/labels/added~0~1","value":"ü~/<&>"}]`; string(res.Patch) != want {
		t.Fatalf("patch %s, want %s", res.Patch, want)
	}
	if !strings.Contains(w.Body.String(), `"patch":"`) {
		t.Fatalf("patch not base64 in the review: %s", w.Body.String())
	}
	patch, err := jsonpatch4.DecodePatch(res.Patch)
	if err != nil {
		t.Fatal(err)
	}
	out, err := patch.Apply([]byte(podJSON))
	if err != nil {
		t.Fatal(err)
	}
	var pod struct {
		Metadata struct {
			Labels map[string]string `json:"labels"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(out, &pod); err != nil || pod.Metadata.Labels["added~/"] != "ü~/<&>" || pod.Metadata.Labels["a"] != "b" {
		t.Fatalf("patched object %s (patch %s): %v", out, res.Patch, err)
	}

	// A mutator that changes nothing sends no patch.
	h = NewHandler(mutating(func(context.Context, *Request) ([]jsonedit.Op, Verdict) { return nil, Allow() }), HandlerOptions{})
	_, rev = post(t, h, "application/json", reviewBody(APIVersionV1, "u", podJSON))
	if rev.Response.Patch != nil || rev.Response.PatchType != nil {
		t.Fatalf("no-op mutation sent a patch: %s", rev.Response.Patch)
	}
}

// TestMutatingChain checks the mutation contract on one path with three
// mutators: each sees the object as the previous ones left it, the response
// patch is their operations concatenated, Outcome.Object is that patch
// applied, and a denial drops every patch.
func TestMutatingChain(t *testing.T) {
	var seen []string
	set := func(name, key string) Hook {
		return Hook{Policy: name, Path: "/m", Type: Mutating, Rules: podRule, Mutator: MutatorFunc(func(_ context.Context, req *Request) ([]jsonedit.Op, Verdict) {
			seen = append(seen, string(req.Object.Raw))
			d := jsonedit.NewDoc(req.Object.Raw)
			if err := d.Set(name, "metadata", "labels", key); err != nil {
				return nil, Invalid("%v", err)
			}
			return d.Ops(), Allow("from " + name)
		})}
	}
	const obj = `{"metadata":{"name":"p"},"spec":{"activeDeadlineSeconds":9007199254740993}}`
	req := &Request{AdmissionRequest: *mustReq(t).Request}
	req.Object.Raw = []byte(obj)
	whs, err := NewWebhooks([]Hook{set("a", "x"), set("b", "y"), set("c", "x")})
	if err != nil {
		t.Fatal(err)
	}
	out, err := whs[0].Review(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) != 3 || seen[0] != obj || !strings.Contains(seen[1], `"labels":{"x":"a"}`) || !strings.Contains(seen[2], `"y":"b"`) ||
		!strings.Contains(seen[2], "9007199254740993") {
		t.Fatalf("mutators saw %q", seen)
	}
	want := `[{"op":"add","path":"/metadata/labels","value":{"x":"a"}},{"op":"add","path":"/metadata/labels/y","value":"b"},{"op":"replace","path":"/metadata/labels/x","value":"c"}]`
	if string(out.Response.Patch) != want || len(out.Patch) != 3 || out.Matched != 3 {
		t.Fatalf("patch %s (%d ops, %d matched), want %s", out.Response.Patch, len(out.Patch), out.Matched, want)
	}
	if got := string(out.Object); got != `{"metadata":{"name":"p","labels":{"x":"c","y":"b"}},"spec":{"activeDeadlineSeconds":9007199254740993}}` {
		t.Fatalf("object %s", got)
	}
	if w := out.Response.Warnings; len(w) != 3 || w[2] != "from c" {
		t.Fatalf("warnings %q", w)
	}

	deny := Hook{Policy: "no", Path: "/m", Type: Mutating, Rules: podRule, Mutator: MutatorFunc(func(context.Context, *Request) ([]jsonedit.Op, Verdict) {
		return nil, Deny("no")
	})}
	whs, err = NewWebhooks([]Hook{set("a", "x"), deny})
	if err != nil {
		t.Fatal(err)
	}
	out, err = whs[0].Review(context.Background(), req)
	if err != nil || out.Response.Allowed || out.Response.Patch != nil || out.Patch != nil || out.Policy != "no" || string(out.Object) != obj {
		t.Fatalf("denied chain: %v %+v", err, out)
	}

	bad := Hook{Policy: "bad", Path: "/m", Type: Mutating, Rules: podRule, Mutator: MutatorFunc(func(context.Context, *Request) ([]jsonedit.Op, Verdict) {
		return []jsonedit.Op{{Op: "remove", Path: "/nope"}}, Allow()
	})}
	whs, err = NewWebhooks([]Hook{bad, set("a", "x")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := whs[0].Review(context.Background(), req); err == nil || !strings.Contains(err.Error(), "policy bad: its JSONPatch does not apply") {
		t.Fatalf("patch that does not apply: %v", err)
	}
}

func TestChainOrderAndDenialStops(t *testing.T) {
	var calls []string
	mk := func(name string, v Verdict) Hook {
		return Hook{Policy: name, Path: "/v", Type: Validating, Rules: podRule, Validator: ValidatorFunc(func(context.Context, *Request) Verdict {
			calls = append(calls, name)
			return v
		})}
	}
	whs, err := NewWebhooks([]Hook{mk("a", Allow("from a")), mk("b", Deny("no")), mk("c", Allow())})
	if err != nil {
		t.Fatal(err)
	}
	out, err := whs[0].Review(context.Background(), &Request{AdmissionRequest: *mustReq(t).Request})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(calls, ",") != "a,b" || out.Policy != "b" || out.Response.Allowed || out.Response.Warnings[0] != "from a" {
		t.Fatalf("calls %v outcome %+v", calls, out)
	}
	if _, err := NewWebhooks([]Hook{mk("a", Allow()), {Policy: "m", Path: "/v", Type: Mutating, Mutator: MutatorFunc(nil)}}); err == nil {
		t.Fatal("mixed path accepted")
	}
}

func TestHookMatches(t *testing.T) {
	h := Hook{Rules: []admissionregistrationv1.RuleWithOperations{
		{Operations: []admissionregistrationv1.OperationType{"CREATE"}, Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"nodes"}}},
		{Operations: []admissionregistrationv1.OperationType{"UPDATE"}, Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"*"}, Resources: []string{"nodes/status"}}},
	}}
	req := func(op, res, sub string) *Request {
		r := &Request{}
		r.Operation, r.Resource.Version, r.Resource.Resource, r.SubResource = admissionv1.Operation(op), "v1", res, sub
		return r
	}
	for _, tc := range []struct {
		op, res, sub string
		want         bool
	}{
		{"CREATE", "nodes", "", true},
		{"UPDATE", "nodes", "", false},
		{"UPDATE", "nodes", "status", true},
		{"CREATE", "nodes", "status", false},
		{"CREATE", "pods", "", false},
	} {
		if got := h.Matches(req(tc.op, tc.res, tc.sub)); got != tc.want {
			t.Errorf("%s %s/%s: %v, want %v", tc.op, tc.res, tc.sub, got, tc.want)
		}
	}
}

// TestMatchRules holds the cases of k8s.io/apiserver's own tests
// (pkg/admission/plugin/webhook/predicates/rules/rules_test.go, v0.37.1:
// TestGroup, TestVersion, TestOperation, TestResource, TestScope), run
// through MatchRules with the other fields of the rule set to "*", plus
// the case that used to disagree: "pods/*" matches pods itself.
func TestMatchRules(t *testing.T) {
	type attrs struct {
		g, v, r, sub string
		op           admissionv1.Operation
		ns           string
	}
	a := func(g, v, r, sub string, op admissionv1.Operation) attrs { return attrs{g, v, r, sub, op, "ns"} }
	cluster := func(g, v, r, sub string) attrs { return attrs{g, v, r, sub, admissionv1.Create, ""} }
	star := []string{"*"}
	rule := func(groups, versions, resources []string, ops ...admissionregistrationv1.OperationType) admissionregistrationv1.RuleWithOperations {
		if ops == nil {
			ops = []admissionregistrationv1.OperationType{"*"}
		}
		return admissionregistrationv1.RuleWithOperations{Operations: ops, Rule: admissionregistrationv1.Rule{APIGroups: groups, APIVersions: versions, Resources: resources}}
	}
	scoped := func(r admissionregistrationv1.RuleWithOperations, s admissionregistrationv1.ScopeType) admissionregistrationv1.RuleWithOperations {
		r.Scope = &s
		return r
	}
	const c, u, d, x = admissionv1.Create, admissionv1.Update, admissionv1.Delete, admissionv1.Connect
	for _, tc := range []struct {
		name           string
		rule           admissionregistrationv1.RuleWithOperations
		match, noMatch []attrs
	}{
		{"group wildcard", rule(star, star, star), []attrs{a("g", "v", "r", "", c)}, nil},
		{"group exact", rule([]string{"g1", "g2"}, star, star), []attrs{a("g1", "v", "r", "", c), a("g2", "v2", "r3", "", c)},
			[]attrs{a("g3", "v", "r", "", c), a("g4", "v", "r", "", c)}},
		{"version wildcard", rule(star, star, star), []attrs{a("g", "v", "r", "", c)}, nil},
		{"version exact", rule(star, []string{"v1", "v2"}, star), []attrs{a("g1", "v1", "r", "", c), a("g2", "v2", "r", "", c)},
			[]attrs{a("g1", "v3", "r", "", c), a("g2", "v4", "r", "", c)}},
		{"operation wildcard", rule(star, star, star, "*"), []attrs{a("g", "v", "r", "", c), a("g", "v", "r", "", u), a("g", "v", "r", "", d), a("g", "v", "r", "", x)}, nil},
		{"operation create", rule(star, star, star, "CREATE"), []attrs{a("g", "v", "r", "", c)}, []attrs{a("g", "v", "r", "", u), a("g", "v", "r", "", d), a("g", "v", "r", "", x)}},
		{"operation update", rule(star, star, star, "UPDATE"), []attrs{a("g", "v", "r", "", u)}, []attrs{a("g", "v", "r", "", c), a("g", "v", "r", "", d), a("g", "v", "r", "", x)}},
		{"operation delete", rule(star, star, star, "DELETE"), []attrs{a("g", "v", "r", "", d)}, []attrs{a("g", "v", "r", "", c), a("g", "v", "r", "", u), a("g", "v", "r", "", x)}},
		{"operation connect", rule(star, star, star, "CONNECT"), []attrs{a("g", "v", "r", "", x)}, []attrs{a("g", "v", "r", "", c), a("g", "v", "r", "", u), a("g", "v", "r", "", d)}},
		{"operation multiple", rule(star, star, star, "UPDATE", "DELETE"), []attrs{a("g", "v", "r", "", u), a("g", "v", "r", "", d)}, []attrs{a("g", "v", "r", "", c), a("g", "v", "r", "", x)}},
		{"no subresources", rule(star, star, star), []attrs{a("g", "v", "r", "", c), a("2", "v", "r2", "", c)},
			[]attrs{a("g", "v", "r", "exec", c), a("2", "v", "r2", "proxy", c)}},
		{"r & subresources", rule(star, star, []string{"r/*"}), []attrs{a("g", "v", "r", "", c), a("g", "v", "r", "exec", c)},
			[]attrs{a("2", "v", "r2", "", c), a("2", "v", "r2", "proxy", c)}},
		{"r & subresources or r2", rule(star, star, []string{"r/*", "r2"}), []attrs{a("g", "v", "r", "", c), a("g", "v", "r", "exec", c), a("2", "v", "r2", "", c)},
			[]attrs{a("2", "v", "r2", "proxy", c)}},
		{"proxy or exec", rule(star, star, []string{"*/proxy", "*/exec"}), []attrs{a("g", "v", "r", "exec", c), a("2", "v", "r2", "proxy", c), a("2", "v", "r3", "proxy", c)},
			[]attrs{a("g", "v", "r", "", c), a("2", "v", "r2", "", c), a("2", "v", "r4", "scale", c)}},
		{"cluster scope", scoped(rule(star, star, []string{"*"}), admissionregistrationv1.ClusterScope),
			[]attrs{cluster("g", "v", "r", ""), cluster("", "v1", "namespaces", ""), a("", "v1", "namespaces", "", c)},
			[]attrs{a("g", "v", "r", "", c)}},
		{"namespace scope", scoped(rule(star, star, []string{"*"}), admissionregistrationv1.NamespacedScope),
			[]attrs{a("g", "v", "r", "", c)},
			[]attrs{cluster("", "v1", "namespaces", ""), a("", "v1", "namespaces", "", c), cluster("g", "v", "r", "")}},
		{"all scopes", scoped(rule(star, star, []string{"*"}), admissionregistrationv1.AllScopes),
			[]attrs{a("g", "v", "r", "", c), cluster("g", "v", "r", ""), cluster("", "v1", "namespaces", ""), a("", "v1", "namespaces", "", c)}, nil},
		// The case kadmit's serving matcher once got wrong, against doctor and the API server.
		{"pods/* matches pods", rule([]string{""}, []string{"v1"}, []string{"pods/*"}), []attrs{a("", "v1", "pods", "", c), a("", "v1", "pods", "status", u)},
			[]attrs{a("", "v1", "nodes", "", c)}},
		{"*/* matches everything", rule(star, star, []string{"*/*"}), []attrs{a("", "v1", "pods", "", c), a("", "v1", "pods", "exec", x)}, nil},
		{"*/status", rule(star, star, []string{"*/status"}), []attrs{a("", "v1", "nodes", "status", u)}, []attrs{a("", "v1", "nodes", "", u)}},
	} {
		for _, want := range []bool{true, false} {
			list := tc.match
			if !want {
				list = tc.noMatch
			}
			for _, at := range list {
				gvr := schema.GroupVersionResource{Group: at.g, Version: at.v, Resource: at.r}
				if got := MatchRules([]admissionregistrationv1.RuleWithOperations{tc.rule}, NewRuleAttributes(gvr, at.sub, at.op, at.ns)); got != want {
					t.Errorf("%s: %+v: match %v, want %v", tc.name, at, got, want)
				}
			}
		}
	}
}

func mustReq(t *testing.T) *Review {
	t.Helper()
	r, err := DecodeReview(reviewBody(APIVersionV1, "u", podJSON))
	if err != nil {
		t.Fatal(err)
	}
	return r
}
