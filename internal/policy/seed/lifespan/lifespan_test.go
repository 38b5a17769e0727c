package lifespan

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/testkit"
)

func ptr[T any](v T) *T { return &v }

func podRequest(op admissionv1.Operation, raw string) *admission.Request {
	return testkit.PodRequest(op, raw, "", testkit.UID("uid-1"))
}

// equalTol is a toleration as JSON sees it, for building expectations.
func equalTol(i int) map[string]any {
	return map[string]any{"key": TaintKey, "operator": "Equal", "value": strconv.Itoa(i), "effect": "NoSchedule"}
}

var existsTol = map[string]any{"key": TaintKey, "operator": "Exists", "effect": "NoSchedule"}

func equalTols(from, to int) []any {
	var out []any
	for i := from; i <= to; i++ {
		out = append(out, equalTol(i))
	}
	return out
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func decodeAny(t *testing.T, b []byte) any {
	t.Helper()
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
	return v
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{"default", DefaultConfig(), ""},
		{"zero", Config{Max: 0}, ""},
		{"limit", Config{Max: 1000}, ""},
		{"negative", Config{Max: -1}, "max: must be >= 0, got -1"},
		{"too large", Config{Max: 1001}, "max: must be <= 1000, got 1001"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			_, newErr := New(tt.cfg)
			if tt.wantErr == "" {
				if err != nil || newErr != nil {
					t.Fatalf("Validate() = %v, New() = %v, want nil", err, newErr)
				}
				return
			}
			if err == nil || err.Error() != tt.wantErr {
				t.Fatalf("Validate() = %v, want %q", err, tt.wantErr)
			}
			if newErr == nil || newErr.Error() != tt.wantErr {
				t.Fatalf("New() = %v, want %q", newErr, tt.wantErr)
			}
		})
	}
}

func TestDefaultConfig(t *testing.T) {
	if c := DefaultConfig(); c.Max != 14 {
		t.Fatalf("DefaultConfig() = %+v", c)
	}
}

func TestHooks(t *testing.T) {
	p, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	hooks := p.Hooks()
	if len(hooks) != 1 {
		t.Fatalf("got %d hooks", len(hooks))
	}
	h := hooks[0]
	want := []admissionregistrationv1.RuleWithOperations{{
		Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
		Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
	}}
	if h.Policy != Name || h.Path != "/mutate-pod" || h.Type != admission.Mutating || h.Mutator == nil || h.Validator != nil ||
		h.FailurePolicy != admissionregistrationv1.Fail || !reflect.DeepEqual(h.Rules, want) {
		t.Fatalf("unexpected hook %+v", h)
	}
}

func TestTolerations(t *testing.T) {
	tests := []struct {
		requested *string
		max       int
		want      []string // values, or "Exists"
		wantErr   string
	}{
		{nil, 14, []string{"Exists"}, ""},
		{ptr("3"), 5, []string{"3", "4", "5"}, ""},
		{ptr("0"), 2, []string{"0", "1", "2"}, ""},
		{ptr("14"), 14, []string{"14"}, ""},
		{ptr("0"), 0, []string{"0"}, ""},
		{ptr("03"), 5, []string{"3", "4", "5"}, ""},
		{ptr("15"), 14, nil, `label acme.com/lifespan-requested must be an integer in [0, 14], got "15"`},
		{ptr("1"), 0, nil, `label acme.com/lifespan-requested must be an integer in [0, 0], got "1"`},
		{ptr(""), 14, nil, `label acme.com/lifespan-requested must be an integer in [0, 14], got ""`},
		{ptr("abc"), 14, nil, `got "abc"`},
		{ptr("-1"), 14, nil, `got "-1"`},
		{ptr("+3"), 14, nil, `got "+3"`},
		{ptr(" 3"), 14, nil, `got " 3"`},
		{ptr("3 "), 14, nil, `got "3 "`},
		{ptr("3.0"), 14, nil, `got "3.0"`},
		{ptr("1e1"), 14, nil, `got "1e1"`},
		{ptr("99999999999999999999999"), 14, nil, `got "99999999999999999999999"`},
	}
	for _, tt := range tests {
		name := "nil"
		if tt.requested != nil {
			name = strconv.Quote(*tt.requested)
		}
		t.Run(fmt.Sprintf("%s/max=%d", name, tt.max), func(t *testing.T) {
			got, err := Tolerations(tt.requested, tt.max)
			if tt.wantErr != "" {
				if err == nil || !strings.HasSuffix(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want suffix %q", err, tt.wantErr)
				}
				if !errors.Is(err, ErrInvalidLabel) {
					t.Fatalf("err %v does not match ErrInvalidLabel", err)
				}
				var le *LabelError
				if !errors.As(err, &le) || le.Max != tt.max || le.Value != *tt.requested {
					t.Fatalf("err = %#v, want *LabelError", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var vals []string
			for _, tol := range got {
				if tol.Key != TaintKey || tol.Effect != corev1.TaintEffectNoSchedule {
					t.Fatalf("unexpected toleration %+v", tol)
				}
				switch tol.Operator {
				case corev1.TolerationOpExists:
					if tol.Value != "" {
						t.Fatalf("Exists toleration with value %+v", tol)
					}
					vals = append(vals, "Exists")
				case corev1.TolerationOpEqual:
					vals = append(vals, tol.Value)
				default:
					t.Fatalf("unexpected operator %+v", tol)
				}
			}
			if !reflect.DeepEqual(vals, tt.want) {
				t.Fatalf("got %v, want %v", vals, tt.want)
			}
		})
	}
}

func TestReview(t *testing.T) {
	customTol := map[string]any{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoExecute", "tolerationSeconds": json.Number("30")}
	tests := []struct {
		name    string
		max     int
		pod     string
		op      admissionv1.Operation
		wantTol []any // nil: no patch expected
		code    int32 // != 0: denial expected
		message string
	}{
		{
			name:    "no label gets Exists",
			pod:     `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"containers":[{"name":"c","image":"nginx"}]}}`,
			wantTol: []any{existsTol},
		},
		{
			name: "no label and Exists already present",
			pod:  `{"metadata":{"name":"p"},"spec":{"tolerations":[{"key":"acme.com/lifespan-remaining","operator":"Exists","effect":"NoSchedule"}]}}`,
		},
		{
			name:    "no label, Exists with another effect does not count",
			pod:     `{"metadata":{"name":"p"},"spec":{"tolerations":[{"key":"acme.com/lifespan-remaining","operator":"Exists","effect":"NoExecute"}]}}`,
			wantTol: []any{map[string]any{"key": TaintKey, "operator": "Exists", "effect": "NoExecute"}, existsTol},
		},
		{
			name:    "label 3 gets 3 through 14",
			pod:     `{"metadata":{"name":"p","labels":{"acme.com/lifespan-requested":"3"}},"spec":{}}`,
			wantTol: equalTols(3, 14),
		},
		{
			name:    "label 14 gets only 14",
			pod:     `{"metadata":{"name":"p","labels":{"acme.com/lifespan-requested":"14"}}}`,
			wantTol: equalTols(14, 14),
		},
		{
			name:    "label 0 gets all",
			pod:     `{"metadata":{"name":"p","labels":{"acme.com/lifespan-requested":"0"}},"spec":{"tolerations":null}}`,
			wantTol: equalTols(0, 14),
		},
		{
			name:    "custom max",
			max:     4,
			pod:     `{"metadata":{"name":"p","labels":{"acme.com/lifespan-requested":"2"}}}`,
			wantTol: equalTols(2, 4),
		},
		{
			name: "existing tolerations kept in place, only missing appended",
			pod: `{"metadata":{"name":"p","labels":{"acme.com/lifespan-requested":"10"}},"spec":{"tolerations":[` +
				`{"key":"acme.com/lifespan-remaining","operator":"Equal","value":"12","effect":"NoSchedule"},` +
				`{"key":"dedicated","operator":"Equal","value":"gpu","effect":"NoExecute","tolerationSeconds":30},` +
				`{"key":"acme.com/lifespan-remaining","value":"10","effect":"NoSchedule"}]}}`,
			wantTol: []any{
				equalTol(12), customTol,
				map[string]any{"key": TaintKey, "value": "10", "effect": "NoSchedule"},
				equalTol(11), equalTol(13), equalTol(14),
			},
		},
		{
			name: "label with all tolerations present is unchanged",
			pod: `{"metadata":{"name":"p","labels":{"acme.com/lifespan-requested":"13"}},"spec":{"tolerations":[` +
				`{"key":"acme.com/lifespan-remaining","operator":"Equal","value":"14","effect":"NoSchedule"},` +
				`{"key":"acme.com/lifespan-remaining","operator":"Equal","value":"13","effect":"NoSchedule"}]}}`,
		},
		{
			name: "a near-miss toleration does not count",
			pod: `{"metadata":{"name":"p","labels":{"acme.com/lifespan-requested":"14"}},"spec":{"tolerations":[` +
				`{"key":"acme.com/lifespan-remaining","operator":"Equal","value":"14","effect":"NoExecute"}]}}`,
			wantTol: []any{map[string]any{"key": TaintKey, "operator": "Equal", "value": "14", "effect": "NoExecute"}, equalTol(14)},
		},
		{
			name:    "labelled pod does not get Exists",
			pod:     `{"metadata":{"name":"p","labels":{"acme.com/lifespan-requested":"14","app":"x"}}}`,
			wantTol: equalTols(14, 14),
		},
		{name: "value too large", pod: `{"metadata":{"labels":{"acme.com/lifespan-requested":"15"}}}`, code: 400,
			message: `label acme.com/lifespan-requested must be an integer in [0, 14], got "15"`},
		{name: "value not a number", pod: `{"metadata":{"labels":{"acme.com/lifespan-requested":"abc"}}}`, code: 400,
			message: `label acme.com/lifespan-requested must be an integer in [0, 14], got "abc"`},
		{name: "negative value", pod: `{"metadata":{"labels":{"acme.com/lifespan-requested":"-1"}}}`, code: 400,
			message: `label acme.com/lifespan-requested must be an integer in [0, 14], got "-1"`},
		{name: "leading space", pod: `{"metadata":{"labels":{"acme.com/lifespan-requested":" 3"}}}`, code: 400,
			message: `label acme.com/lifespan-requested must be an integer in [0, 14], got " 3"`},
		{name: "fraction", pod: `{"metadata":{"labels":{"acme.com/lifespan-requested":"3.0"}}}`, code: 400,
			message: `label acme.com/lifespan-requested must be an integer in [0, 14], got "3.0"`},
		{name: "empty value", pod: `{"metadata":{"labels":{"acme.com/lifespan-requested":""}}}`, code: 400,
			message: `label acme.com/lifespan-requested must be an integer in [0, 14], got ""`},
		{name: "bad JSON", pod: `{"metadata":`, code: 400, message: "lifespan: cannot parse the pod: "},
		{name: "wrong types", pod: `{"spec":{"tolerations":{}}}`, code: 400, message: "lifespan: cannot parse the pod: "},
		{name: "update is not handled", op: admissionv1.Update, pod: `{"metadata":{"name":"p"}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			if tt.max != 0 {
				cfg.Max = tt.max
			}
			p, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			whs, err := admission.NewWebhooks(p.Hooks())
			if err != nil || len(whs) != 1 {
				t.Fatalf("NewWebhooks: %v, %d webhooks", err, len(whs))
			}
			op := tt.op
			if op == "" {
				op = admissionv1.Create
			}
			out, err := whs[0].Review(context.Background(), podRequest(op, tt.pod))
			if err != nil {
				t.Fatal(err)
			}
			resp := out.Response
			if tt.code != 0 {
				if resp.Allowed || resp.Result == nil || resp.Result.Code != tt.code || out.Policy != Name {
					t.Fatalf("response = %+v (policy %q), want denial with code %d", resp, out.Policy, tt.code)
				}
				if !strings.HasPrefix(resp.Result.Message, tt.message) {
					t.Fatalf("message = %q, want prefix %q", resp.Result.Message, tt.message)
				}
				if resp.Patch != nil {
					t.Fatalf("denial carries a patch %s", resp.Patch)
				}
				return
			}
			if !resp.Allowed {
				t.Fatalf("denied: %+v", resp.Result)
			}
			if tt.wantTol == nil {
				if resp.Patch != nil || resp.PatchType != nil {
					t.Fatalf("unexpected patch %s", resp.Patch)
				}
				return
			}
			if resp.PatchType == nil || *resp.PatchType != admissionv1.PatchTypeJSONPatch {
				t.Fatalf("PatchType = %v", resp.PatchType)
			}
			for _, o := range out.Patch {
				if !strings.HasPrefix(o.Path, "/spec") {
					t.Errorf("patch touches %s: %s", o.Path, resp.Patch)
				}
			}
			patch, err := jsonpatch.DecodePatch(resp.Patch)
			if err != nil {
				t.Fatal(err)
			}
			patched, err := patch.Apply([]byte(tt.pod))
			if err != nil {
				t.Fatalf("apply %s: %v", resp.Patch, err)
			}
			// The expected object is the input with spec.tolerations replaced.
			var want map[string]any
			if err := json.Unmarshal([]byte(tt.pod), &want); err != nil {
				t.Fatal(err)
			}
			spec, _ := want["spec"].(map[string]any)
			if spec == nil {
				spec = map[string]any{}
				want["spec"] = spec
			}
			spec["tolerations"] = decodeAny(t, []byte(mustJSON(t, tt.wantTol)))
			if got := decodeAny(t, patched); !reflect.DeepEqual(got, decodeAny(t, []byte(mustJSON(t, want)))) {
				t.Fatalf("patched pod\n got %s\nwant %s", patched, mustJSON(t, want))
			}
			if !reflect.DeepEqual(decodeAny(t, out.Object), decodeAny(t, patched)) {
				t.Fatalf("Outcome.Object %s differs from the patched pod %s", out.Object, patched)
			}

			// Reinvocation on the output must change nothing.
			again, err := whs[0].Review(context.Background(), podRequest(op, string(patched)))
			if err != nil {
				t.Fatal(err)
			}
			if !again.Response.Allowed || again.Response.Patch != nil {
				t.Fatalf("second pass: allowed=%v patch=%s", again.Response.Allowed, again.Response.Patch)
			}
			if ops, v := p.Mutate(context.Background(), podRequest(op, string(patched))); ops != nil || !v.Allowed {
				t.Fatalf("Mutate on its own output = %v, %+v; want nil, allowed", ops, v)
			}
		})
	}
}

// The mutated JSON must keep what a typed round trip would drop or rewrite,
// so the patch the API server applies contains only the tolerations.
func TestMutatePreservesUnknownFields(t *testing.T) {
	pod := `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","creationTimestamp":null,` +
		`"labels":{"acme.com/lifespan-requested":"14"}},"spec":{"futureField":{"x":[1,2.50,1e3]},` +
		`"containers":[{"name":"c","image":"a<b>&c","resources":{}}]},"status":{},"extra":12345678901234567890}`
	p, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	whs, err := admission.NewWebhooks(p.Hooks())
	if err != nil {
		t.Fatal(err)
	}
	out, err := whs[0].Review(context.Background(), podRequest(admissionv1.Create, pod))
	if err != nil {
		t.Fatal(err)
	}
	wantPatch := `[{"op":"add","path":"/spec/tolerations","value":[{"key":"acme.com/lifespan-remaining","operator":"Equal","value":"14","effect":"NoSchedule"}]}]`
	if string(out.Response.Patch) != wantPatch {
		t.Fatalf("patch\n got %s\nwant %s", out.Response.Patch, wantPatch)
	}
	mutated := out.Object
	for _, s := range []string{`"creationTimestamp":null`, `"futureField":{"x":[1,2.50,1e3]}`, `"extra":12345678901234567890`, `"image":"a<b>&c"`, `"resources":{}`, `"status":{}`} {
		if !strings.Contains(string(mutated), s) {
			t.Errorf("mutated pod lost %s: %s", s, mutated)
		}
	}
}
