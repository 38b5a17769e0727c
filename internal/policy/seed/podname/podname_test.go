package podname

import (
	"context"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/testkit"
)

func podRequest(op admissionv1.Operation, raw string) *admission.Request {
	return testkit.PodRequest(op, raw, "", testkit.UID("uid-1"))
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{"default", DefaultConfig(), ""},
		{"several words", Config{Words: []string{"a", "bad"}, CaseInsensitive: true}, ""},
		{"no words", Config{}, "words: must list at least one word"},
		{"empty list", Config{Words: []string{}}, "words: must list at least one word"},
		{"empty word", Config{Words: []string{"a", ""}}, "words[1]: must not be empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				if _, err := New(tt.cfg); err != nil {
					t.Fatalf("New() = %v, want nil", err)
				}
				return
			}
			if err == nil || err.Error() != tt.wantErr {
				t.Fatalf("Validate() = %v, want %q", err, tt.wantErr)
			}
			if _, err := New(tt.cfg); err == nil || err.Error() != tt.wantErr {
				t.Fatalf("New() = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

func TestDefaultConfig(t *testing.T) {
	c := DefaultConfig()
	if c.CaseInsensitive || len(c.Words) != 1 || c.Words[0] != "offensive" {
		t.Fatalf("DefaultConfig() = %+v", c)
	}
	// Callers may edit the returned slice; it must not leak into later calls.
	c.Words[0] = "x"
	if DefaultConfig().Words[0] != "offensive" {
		t.Fatal("DefaultConfig shares its words slice")
	}
}

func TestHooks(t *testing.T) {
	p, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	hooks := p.Hooks()
	if len(hooks) != 1 {
		t.Fatalf("got %d hooks, want 1", len(hooks))
	}
	h := hooks[0]
	if h.Policy != Name || h.Path != "/validate-pod" || h.Type != admission.Validating ||
		h.FailurePolicy != admissionregistrationv1.Fail || h.Validator == nil || h.Mutator != nil {
		t.Fatalf("unexpected hook %+v", h)
	}
	if len(h.Rules) != 1 {
		t.Fatalf("got %d rules, want 1", len(h.Rules))
	}
	r := h.Rules[0]
	if len(r.Operations) != 1 || r.Operations[0] != admissionregistrationv1.Create ||
		len(r.APIGroups) != 1 || r.APIGroups[0] != "" ||
		len(r.APIVersions) != 1 || r.APIVersions[0] != "v1" ||
		len(r.Resources) != 1 || r.Resources[0] != "pods" {
		t.Fatalf("unexpected rule %+v", r)
	}
}

func TestReview(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		op      admissionv1.Operation
		raw     string
		allowed bool
		code    int32
		message string
		matched int
	}{
		{
			name: "clean name allowed", cfg: DefaultConfig(), op: admissionv1.Create,
			raw: `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"nginx"}}`, allowed: true, matched: 1,
		},
		{
			name: "offensive name denied", cfg: DefaultConfig(), op: admissionv1.Create,
			raw:     `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"my-offensive-pod"}}`,
			allowed: false, code: 403, message: `pod name contains "offensive"`, matched: 1,
		},
		{
			name: "generateName used when name empty", cfg: DefaultConfig(), op: admissionv1.Create,
			raw:     `{"apiVersion":"v1","kind":"Pod","metadata":{"generateName":"offensive-"}}`,
			allowed: false, code: 403, message: `pod name contains "offensive"`, matched: 1,
		},
		{
			name: "generateName ignored when name set", cfg: DefaultConfig(), op: admissionv1.Create,
			raw:     `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"fine","generateName":"offensive-"}}`,
			allowed: true, matched: 1,
		},
		{
			name: "case-sensitive by default", cfg: DefaultConfig(), op: admissionv1.Create,
			raw: `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"Offensive"}}`, allowed: true, matched: 1,
		},
		{
			name: "case-insensitive reports word as configured", cfg: Config{Words: []string{"OffEnsive"}, CaseInsensitive: true},
			op: admissionv1.Create, raw: `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"an-OFFENSIVE-one"}}`,
			allowed: false, code: 403, message: `pod name contains "OffEnsive"`, matched: 1,
		},
		{
			name: "first configured word reported", cfg: Config{Words: []string{"zzz", "bad", "ad"}},
			op: admissionv1.Create, raw: `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"bad-zzz"}}`,
			allowed: false, code: 403, message: `pod name contains "zzz"`, matched: 1,
		},
		{
			name: "no name at all allowed", cfg: DefaultConfig(), op: admissionv1.Create,
			raw: `{"apiVersion":"v1","kind":"Pod","metadata":{}}`, allowed: true, matched: 1,
		},
		{
			name: "update not handled", cfg: DefaultConfig(), op: admissionv1.Update,
			raw: `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"offensive"}}`, allowed: true, matched: 0,
		},
		{
			name: "bad JSON is 400", cfg: DefaultConfig(), op: admissionv1.Create,
			raw: `{"metadata":`, allowed: false, code: 400, message: "pod-name: cannot parse the pod", matched: 1,
		},
		{
			name: "wrong shape is 400", cfg: DefaultConfig(), op: admissionv1.Create,
			raw: `{"metadata":{"name":42}}`, allowed: false, code: 400, message: "pod-name: cannot parse the pod", matched: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := New(tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			whs, err := admission.NewWebhooks(p.Hooks())
			if err != nil {
				t.Fatal(err)
			}
			if len(whs) != 1 {
				t.Fatalf("got %d webhooks, want 1", len(whs))
			}
			out, err := whs[0].Review(context.Background(), podRequest(tt.op, tt.raw))
			if err != nil {
				t.Fatal(err)
			}
			resp := out.Response
			if resp.UID != "uid-1" {
				t.Errorf("UID = %q", resp.UID)
			}
			if out.Matched != tt.matched {
				t.Errorf("Matched = %d, want %d", out.Matched, tt.matched)
			}
			if resp.Allowed != tt.allowed {
				t.Fatalf("Allowed = %v, want %v (result %+v)", resp.Allowed, tt.allowed, resp.Result)
			}
			if resp.Patch != nil || out.Patch != nil {
				t.Errorf("validating webhook returned a patch: %s", resp.Patch)
			}
			if tt.allowed {
				if resp.Result != nil {
					t.Errorf("Result = %+v, want nil", resp.Result)
				}
				return
			}
			if out.Policy != Name {
				t.Errorf("Policy = %q, want %q", out.Policy, Name)
			}
			if resp.Result.Code != tt.code {
				t.Errorf("Code = %d, want %d", resp.Result.Code, tt.code)
			}
			if tt.code == 403 && resp.Result.Message != tt.message {
				t.Errorf("Message = %q, want %q", resp.Result.Message, tt.message)
			}
			if tt.code == 400 && !strings.HasPrefix(resp.Result.Message, tt.message) {
				t.Errorf("Message = %q, want prefix %q", resp.Result.Message, tt.message)
			}
		})
	}
}

func TestNewCopiesWords(t *testing.T) {
	cfg := Config{Words: []string{"bad"}}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Words[0] = "good"
	v := p.Validate(context.Background(), podRequest(admissionv1.Create, `{"metadata":{"name":"bad-pod"}}`))
	if v.Allowed || v.Message != `pod name contains "bad"` {
		t.Fatalf("verdict = %+v, want denial for \"bad\"", v)
	}
}
