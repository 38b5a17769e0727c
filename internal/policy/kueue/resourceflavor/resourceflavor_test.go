package resourceflavor

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metavalidation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/policy/policytest"
	"github.com/kadmit/kadmit/internal/testkit"
)

func req(op admissionv1.Operation, obj, old string) *admission.Request {
	return testkit.Request(op, metav1.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta1", Resource: "resourceflavors"}, obj, old)
}

func flavor(spec string) string {
	return `{"apiVersion":"kueue.x-k8s.io/v1beta1","kind":"ResourceFlavor","metadata":{"name":"f"},"spec":{` + spec + `}}`
}

// wantForbidden checks v against Kueue's webhook answer for errs:
// allowed when none, else 403 with ErrorList.ToAggregate's message.
func wantForbidden(t *testing.T, v admission.Verdict, errs field.ErrorList) {
	t.Helper()
	if len(errs) == 0 {
		if !v.Allowed {
			t.Fatalf("denied: %d %s", v.Code, v.Message)
		}
		return
	}
	if want := errs.ToAggregate().Error(); v.Allowed || v.Code != 403 || v.Reason != metav1.StatusReasonForbidden || v.Message != want {
		t.Fatalf("verdict %d %s %q\nwant 403 %q", v.Code, v.Reason, v.Message, want)
	}
}

// TestUpstreamValidateResourceFlavor carries over Kueue v0.13.0's
// pkg/webhooks/resourceflavor_webhook_test.go TestValidateResourceFlavor
// (:31) and the webhook cases of
// test/integration/singlecluster/webhook/core/resourceflavor_test.go (403
// Forbidden), then kadmit's own cases for the same rules.
func TestUpstreamValidateResourceFlavor(t *testing.T) {
	p, _ := New(DefaultConfig())
	labels := field.NewPath("spec", "nodeLabels")
	taints := field.NewPath("spec", "nodeTaints")
	for _, tc := range []struct {
		name, spec string
		want       field.ErrorList
	}{
		{"empty", ``, nil},
		{"valid", `"nodeLabels":{"foo":"bar"},"nodeTaints":[{"key":"spot","value":"true","effect":"NoSchedule"}]`, nil},
		{"invalid label name", `"nodeLabels":{"@abc":"foo"}`, metavalidation.ValidateLabelName("@abc", labels)},
		{"invalid label value", `"nodeLabels":{"foo":"@abc"}`, field.ErrorList{field.Invalid(labels, "@abc",
			strings.Join(validation.IsValidLabelValue("@abc"), "; "))}},
		// integration test "Should fail to create with invalid label name".
		{"integration: invalid label name is Forbidden", `"nodeLabels":{"@abc":"foo"}`, metavalidation.ValidateLabelName("@abc", labels)},
		// kadmit's cases.
		{"taint key", `"nodeTaints":[{"key":"bad key","effect":"NoSchedule"}]`, metavalidation.ValidateLabelName("bad key", taints.Index(0).Child("key"))},
		{"taint value", `"nodeTaints":[{"key":"k","value":"-v-","effect":"NoSchedule"}]`, field.ErrorList{field.Invalid(taints.Index(0).Child("value"), "-v-",
			strings.Join(validation.IsValidLabelValue("-v-"), ";"))}},
		{"duplicate taint", `"nodeTaints":[{"key":"k","effect":"NoSchedule"},{"key":"k","value":"x","effect":"NoSchedule"}]`, func() field.ErrorList {
			d := field.Duplicate(taints.Index(1), corev1.Taint{Key: "k", Value: "x", Effect: corev1.TaintEffectNoSchedule})
			d.Detail = "taints must be unique by key and effect pair"
			return field.ErrorList{d}
		}()},
		{"same key, other effect", `"nodeTaints":[{"key":"k","effect":"NoSchedule"},{"key":"k","effect":"NoExecute"}]`, nil},
		{"toleration key", `"tolerations":[{"key":"@abc","operator":"Equal","value":"v","effect":"NoSchedule"}]`,
			metavalidation.ValidateLabelName("@abc", field.NewPath("spec", "tolerations").Index(0).Child("key"))},
		// The webhook checks nothing else of a toleration: its value is
		// free text (the CRD allows it).
		{"toleration value is not checked", `"tolerations":[{"key":"k","operator":"Equal","value":"not a label value!","effect":"NoSchedule"}]`, nil},
		{"eight labels", `"nodeLabels":{` + nLabels(8) + `}`, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantForbidden(t, p.Validate(context.Background(), req(admissionv1.Create, flavor(tc.spec), "")), tc.want)
			// UPDATE runs the same checks on the new flavor.
			wantForbidden(t, p.Validate(context.Background(), req(admissionv1.Update, flavor(tc.spec), flavor(`"nodeLabels":{"x":"y"}`))), tc.want)
		})
	}
}

func nLabels(n int) string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf(`"l%d":""`, i)
	}
	return strings.Join(out, ",")
}

func nTaints(n int) string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf(`{"key":"t%d","effect":"NoExecute"}`, i)
	}
	return strings.Join(out, ",")
}

// TestSchemaRules: the CRD's rules (resourceflavor_types.go:44-98 at
// v0.13.0), answered 422 Invalid as the API server does; the first four
// cases are Kueue's integration tests' (BeInvalidError).
func TestSchemaRules(t *testing.T) {
	p, _ := New(DefaultConfig())
	for _, tc := range []struct {
		name, spec, old string
		msg             string // "" allowed
	}{
		{"integration: invalid number of taint", `"nodeTaints":[` + nTaints(9) + `]`, "", `spec.nodeTaints: Too many: 9: must have at most 8 items`},
		{"integration: invalid number of nodeSelector", `"nodeLabels":{` + nLabels(9) + `}`, "", `spec.nodeLabels: Too many: 9: must have at most 8 items`},
		{"integration: valid number of nodeSelector and taint", `"nodeTaints":[` + nTaints(8) + `],"nodeLabels":{` + nLabels(8) + `}`, "", ""},
		{"integration: update with invalid taint effect", `"nodeTaints":[{"key":"foo","value":"bar","effect":"Invalid"}]`, `{}`, `spec.nodeTaints: Invalid value: "array": supported taint effect values`},
		{"integration: invalid taints", `"nodeTaints":[{"key":"skdajf"},{"key":"@foo","value":"bar","effect":"NoSchedule"}]`, "", `spec.nodeTaints[0].effect: Required value`},
		{"integration: invalid tolerations", `"tolerations":[{"key":"@abc","operator":"Equal","value":"v","effect":"NoSchedule"},{"key":"abc","operator":"Exists","value":"v","effect":"NoSchedule"},{"key":"abc","operator":"Equal","value":"v","effect":"not-valid"},{"key":"abc","operator":"Equal","value":"v","effect":"NoSchedule"}]`, "",
			`[spec.tolerations: Invalid value: "array": a value must be empty when 'operator' is 'Exists', spec.tolerations: Invalid value: "array": supported taint effect values`},
		{"nine tolerations", `"tolerations":[` + strings.Repeat(`{"operator":"Exists"},`, 8) + `{"operator":"Exists"}]`, "", `spec.tolerations: Too many: 9: must have at most 8 items`},
		{"empty key needs Exists", `"tolerations":[{"operator":"Equal","value":"v"}]`, "", "operator must be Exists when 'key' is empty"},
		{"no key, no operator", `"tolerations":[{"effect":"NoSchedule"}]`, "", "operator must be Exists when 'key' is empty"},
		{"tolerationSeconds needs NoExecute", `"tolerations":[{"key":"k","operator":"Exists","effect":"NoSchedule","tolerationSeconds":5}]`, "", "effect must be 'NoExecute' when 'tolerationSeconds' is set"},
		{"unknown operator", `"tolerations":[{"key":"k","operator":"In"}]`, "", "supported toleration values: 'Equal'(default), 'Exists'"},
		{"taint key required", `"nodeTaints":[{"effect":"NoSchedule"}]`, "", `spec.nodeTaints[0].key: Required value`},
		{"topology needs a node label", `"topologyName":"t"`, "", "at least one nodeLabel is required when topology is set"},
		{"topology with a label", `"topologyName":"t","nodeLabels":{"a":"b"}`, "", ""},
		// Issue 12: Kueue lets every spec field change unless the old
		// flavor has a topology.
		{"labels change", `"nodeLabels":{"zone":"b"}`, `{"nodeLabels":{"zone":"a"}}`, ""},
		{"taint added, toleration removed", `"nodeTaints":[{"key":"k","effect":"NoSchedule"}]`, `{"tolerations":[{"key":"k","operator":"Exists"}]}`, ""},
		{"topology added", `"nodeLabels":{"zone":"a"},"topologyName":"t"`, `{"nodeLabels":{"zone":"a"}}`, ""},
		{"spec with topology is frozen", `"nodeLabels":{"zone":"b"},"topologyName":"t"`, `{"nodeLabels":{"zone":"a"},"topologyName":"t"}`, "resourceFlavorSpec are immutable when topologyName is set"},
		{"topology removed", `"nodeLabels":{"zone":"a"}`, `{"nodeLabels":{"zone":"a"},"topologyName":"t"}`, "resourceFlavorSpec are immutable when topologyName is set"},
		{"unchanged spec with topology", `"topologyName":"t","nodeLabels":{"zone":"a"}`, `{"nodeLabels":{"zone":"a"},"topologyName":"t"}`, ""},
		// Issue 20: tolerationSeconds is an int64 to the rule; 2^53+1 is
		// not 2^53 (float64 cannot tell them apart).
		{"tolerationSeconds 2^53+1 after 2^53 is a change", `"topologyName":"t","nodeLabels":{"zone":"a"},"tolerations":[{"key":"k","operator":"Exists","effect":"NoExecute","tolerationSeconds":9007199254740993}]`,
			`{"nodeLabels":{"zone":"a"},"topologyName":"t","tolerations":[{"key":"k","operator":"Exists","effect":"NoExecute","tolerationSeconds":9007199254740992}]}`, "resourceFlavorSpec are immutable when topologyName is set"},
		{"tolerationSeconds 2^53+1 unchanged", `"topologyName":"t","nodeLabels":{"zone":"a"},"tolerations":[{"key":"k","operator":"Exists","effect":"NoExecute","tolerationSeconds":9007199254740993}]`,
			`{"nodeLabels":{"zone":"a"},"topologyName":"t","tolerations":[{"tolerationSeconds":9007199254740993,"key":"k","operator":"Exists","effect":"NoExecute"}]}`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := req(admissionv1.Create, flavor(tc.spec), "")
			if tc.old != "" {
				r = req(admissionv1.Update, flavor(tc.spec), `{"metadata":{"name":"f"},"spec":`+tc.old+`}`)
			}
			v := p.Validate(context.Background(), r)
			if tc.msg == "" {
				if !v.Allowed {
					t.Fatalf("denied: %+v", v)
				}
				return
			}
			if v.Allowed || v.Code != 422 || v.Reason != metav1.StatusReasonInvalid ||
				!strings.HasPrefix(v.Message, `ResourceFlavor.kueue.x-k8s.io "f" is invalid: `) || !strings.Contains(v.Message, tc.msg) {
				t.Fatalf("verdict %d %s %q, want 422 containing %q", v.Code, v.Reason, v.Message, tc.msg)
			}
		})
	}
}

// mutate runs p.Mutate and returns the patched flavor, nil when unchanged.
func mutate(t *testing.T, p *Policy, r *admission.Request) ([]byte, admission.Verdict) {
	t.Helper()
	return policytest.Mutate(t, p, r)
}

// TestMutate: Kueue's Default adds the finalizer (integration test "Should
// have a finalizer"); nothing else changes.
func TestMutate(t *testing.T) {
	p, _ := New(DefaultConfig())
	out, v := mutate(t, p, req(admissionv1.Create, flavor(`"tolerations":[{"key":"k","value":"v"}]`), ""))
	if !v.Allowed || !strings.Contains(string(out), `"finalizers":["`+ResourceInUseFinalizer+`"]`) || strings.Contains(string(out), "operator") {
		t.Fatalf("out %s verdict %+v", out, v)
	}
	if out2, _ := mutate(t, p, req(admissionv1.Create, string(out), "")); out2 != nil {
		t.Fatalf("finalizer added twice: %s", out2)
	}
	off, _ := New(Config{AddFinalizer: new(false)})
	if out, _ := mutate(t, off, req(admissionv1.Create, flavor(``), "")); out != nil {
		t.Fatalf("addFinalizer false changed the flavor: %s", out)
	}
}

// typedFlavor is a ResourceFlavor with its full metadata, for the
// differential test's typed round trip.
type typedFlavor struct {
	APIVersion        string `json:"apiVersion,omitempty"`
	Kind              string `json:"kind,omitempty"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              Spec `json:"spec"`
}

// TestMutateDifferential: the patch applied by the API server's library
// gives what defaulting the typed flavor gives, and changes nothing else.
func TestMutateDifferential(t *testing.T) {
	p, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	corpus := map[string]string{
		"plain":              flavor(``),
		"tolerations":        flavor(`"tolerations":[{"key":"a","value":"v"},{"operator":"Exists"},{"key":"b","operator":"Exists"},{"key":"c~/","operator":"","effect":"NoExecute","tolerationSeconds":9007199254740993}]`),
		"finalizers present": `{"metadata":{"name":"f","finalizers":["other","` + ResourceInUseFinalizer + `"]},"spec":{}}`,
		"finalizers null":    `{"metadata":{"name":"f","finalizers":null,"generation":9007199254740993},"spec":{"nodeLabels":{"a/b":"<&>"}}}`,
		"finalizers empty":   `{"metadata":{"finalizers":[]},"spec":{"tolerations":[]}}`,
		"no metadata":        `{"spec":{"tolerations":[{"key":"k"}]}}`,
		"escaped keys":       `{"metadata":{"name":"f"},"spec":{"tolerations":[{"key":"k"}]}}`,
		"unknown fields":     `{"metadata":{"name":"f","creationTimestamp":null},"spec":{"futureField":[1,2.50,1e3],"topologyName":"t"},"status":{"n":12345678901234567890}}`,
	}
	for name, in := range corpus {
		t.Run(name, func(t *testing.T) {
			ops, v := p.Mutate(context.Background(), req(admissionv1.Create, in, ""))
			if !v.Allowed {
				t.Fatalf("denied: %+v", v)
			}
			policytest.Check(t, []byte(in), ops, func(f *typedFlavor) {
				if !slices.Contains(f.Finalizers, ResourceInUseFinalizer) {
					f.Finalizers = append(f.Finalizers, ResourceInUseFinalizer)
				}
			})
		})
	}
}

func TestHooks(t *testing.T) {
	p, _ := New(DefaultConfig())
	hs := p.Hooks()
	if len(hs) != 2 || hs[0].Path != MutatePath || hs[1].Path != ValidatePath || hs[0].FailurePolicy != "Fail" ||
		hs[1].Rules[0].APIGroups[0] != "kueue.x-k8s.io" || hs[1].Rules[0].Resources[0] != "resourceflavors" {
		t.Fatalf("hooks %+v", hs)
	}
}

// TestCelEqualNumbers: CEL's == on numbers as the API server sees them,
// exact at 2^53 and at int64's ends.
func TestCelEqualNumbers(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want bool
	}{
		{`9007199254740993`, `9007199254740992`, false},
		{`9007199254740993`, `9007199254740993`, true},
		{`9223372036854775807`, `9223372036854775806`, false},
		{`1`, `1.0`, true},
		{`1`, `1.5`, false},
		{`9007199254740993`, `9007199254740992.0`, false},
		{`9223372036854775807`, `9.223372036854775807e18`, false}, // the float is 2^63, outside int64
		{`{"a":[1,2]}`, `{"a":[2,1]}`, false},
		{`{"a":1,"b":"x"}`, `{"b":"x","a":1}`, true},
		{`{"a":null}`, `{}`, false},
	} {
		if got := sameJSON([]byte(tc.a), []byte(tc.b)); got != tc.want {
			t.Errorf("sameJSON(%s, %s) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
		if got := sameJSON([]byte(tc.b), []byte(tc.a)); got != tc.want {
			t.Errorf("sameJSON(%s, %s) = %v, want %v", tc.b, tc.a, got, tc.want)
		}
	}
}
