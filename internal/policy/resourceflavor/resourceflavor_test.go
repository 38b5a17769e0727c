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
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/policy/policytest"
)

func req(op admissionv1.Operation, obj, old string) *admission.Request {
	r := &admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: "u", Operation: op,
		Resource: metav1.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta1", Resource: "resourceflavors"},
		Object:   runtime.RawExtension{Raw: []byte(obj)},
	}}
	if old != "" {
		r.OldObject = runtime.RawExtension{Raw: []byte(old)}
	}
	return r
}

func flavor(spec string) string {
	return `{"apiVersion":"kueue.x-k8s.io/v1beta1","kind":"ResourceFlavor","metadata":{"name":"f"},"spec":{` + spec + `}}`
}

func TestValidate(t *testing.T) {
	p, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	nine := make([]string, 9)
	for i := range nine {
		nine[i] = fmt.Sprintf(`"k%d":"v"`, i)
	}
	ninet := make([]string, 9)
	for i := range ninet {
		ninet[i] = fmt.Sprintf(`{"key":"k%d","effect":"NoSchedule"}`, i)
	}
	for _, tc := range []struct {
		name, spec string
		code       int32
		msg        string
	}{
		{"empty spec", ``, 0, ""},
		{"good", `"nodeLabels":{"cloud.provider.com/instance":"spot","zone":"a"},"nodeTaints":[{"key":"spot","value":"true","effect":"NoSchedule"}],"tolerations":[{"key":"spot","operator":"Exists","effect":"NoSchedule"}]`, 0, ""},
		{"eight labels", `"nodeLabels":{` + strings.Join(nine[:8], ",") + `}`, 0, ""},
		{"nine labels", `"nodeLabels":{` + strings.Join(nine, ",") + `}`, 400, "spec.nodeLabels: must have at most 8 labels, has 9"},
		{"bad label key", `"nodeLabels":{"bad key":"v"}`, 400, `spec.nodeLabels: key "bad key"`},
		{"bad label value", `"nodeLabels":{"k":"-v-"}`, 400, `spec.nodeLabels[k]: value "-v-"`},
		{"nine taints", `"nodeTaints":[` + strings.Join(ninet, ",") + `]`, 400, "at most 8 taints"},
		{"taint without effect", `"nodeTaints":[{"key":"k"}]`, 400, `spec.nodeTaints[0].effect: must be NoSchedule, PreferNoSchedule or NoExecute, got ""`},
		{"taint bad effect", `"nodeTaints":[{"key":"k","effect":"Never"}]`, 400, "spec.nodeTaints[0].effect"},
		{"taint bad key", `"nodeTaints":[{"key":"a/b/c","effect":"NoSchedule"}]`, 400, "spec.nodeTaints[0].key"},
		{"duplicate taint", `"nodeTaints":[{"key":"k","effect":"NoSchedule"},{"key":"k","value":"x","effect":"NoSchedule"}]`, 400, "spec.nodeTaints[1]: duplicate taint"},
		{"same key other effect", `"nodeTaints":[{"key":"k","effect":"NoSchedule"},{"key":"k","effect":"NoExecute"}]`, 0, ""},
		{"toleration exists with value", `"tolerations":[{"key":"k","operator":"Exists","value":"v"}]`, 400, "spec.tolerations[0].value: must be empty when operator is Exists"},
		{"toleration empty key equal", `"tolerations":[{"operator":"Equal","value":"v"}]`, 400, "spec.tolerations[0].operator: must be Exists when key is empty"},
		{"toleration empty key exists", `"tolerations":[{"operator":"Exists"}]`, 0, ""},
		{"toleration bad operator", `"tolerations":[{"key":"k","operator":"In"}]`, 400, `operator: must be Equal or Exists, got "In"`},
		{"toleration bad effect", `"tolerations":[{"key":"k","effect":"Sometimes"}]`, 400, "spec.tolerations[0].effect"},
		{"toleration seconds without NoExecute", `"tolerations":[{"key":"k","effect":"NoSchedule","tolerationSeconds":5}]`, 400, "tolerationSeconds: only allowed with effect NoExecute"},
		{"toleration seconds with NoExecute", `"tolerations":[{"key":"k","effect":"NoExecute","tolerationSeconds":5}]`, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := p.Validate(context.Background(), req(admissionv1.Create, flavor(tc.spec), ""))
			if tc.code == 0 {
				if !v.Allowed {
					t.Fatalf("denied: %+v", v)
				}
				return
			}
			if v.Allowed || v.Code != tc.code || !strings.Contains(v.Message, tc.msg) {
				t.Fatalf("verdict %+v, want %d %q", v, tc.code, tc.msg)
			}
		})
	}
}

func TestImmutable(t *testing.T) {
	p, _ := New(DefaultConfig())
	base := `"nodeLabels":{"zone":"a"},"tolerations":[{"key":"k","operator":"Exists"}]`
	for _, tc := range []struct {
		name, spec, field string
	}{
		{"unchanged", base, ""},
		{"label changed", `"nodeLabels":{"zone":"b"},"tolerations":[{"key":"k","operator":"Exists"}]`, "nodeLabels"},
		{"taint added", base + `,"nodeTaints":[{"key":"k","effect":"NoSchedule"}]`, "nodeTaints"},
		{"toleration removed", `"nodeLabels":{"zone":"a"}`, "tolerations"},
		{"topology added", base + `,"topologyName":"t"`, "topologyName"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := p.Validate(context.Background(), req(admissionv1.Update, flavor(tc.spec), flavor(base)))
			if tc.field == "" {
				if !v.Allowed {
					t.Fatalf("denied: %+v", v)
				}
				return
			}
			if v.Allowed || v.Code != 403 || !strings.Contains(v.Message, "spec."+tc.field+" is immutable") {
				t.Fatalf("verdict %+v", v)
			}
		})
	}
	// Metadata changes (labels, finalizers) are fine.
	old := flavor(base)
	now := strings.Replace(old, `"name":"f"`, `"name":"f","labels":{"a":"b"}`, 1)
	if v := p.Validate(context.Background(), req(admissionv1.Update, now, old)); !v.Allowed {
		t.Fatalf("metadata change denied: %+v", v)
	}
	// An empty list and an absent one are the same spec.
	if v := p.Validate(context.Background(), req(admissionv1.Update, flavor(`"nodeTaints":[]`), flavor(``))); !v.Allowed {
		t.Fatalf("empty vs absent: %+v", v)
	}
}

// mutate runs p.Mutate and returns the patched flavor, nil when unchanged.
func mutate(t *testing.T, p *Policy, r *admission.Request) ([]byte, admission.Verdict) {
	t.Helper()
	return policytest.Mutate(t, p, r)
}

func TestMutate(t *testing.T) {
	p, _ := New(DefaultConfig())
	out, v := mutate(t, p, req(admissionv1.Create, flavor(`"tolerations":[{"key":"k","value":"v"}]`), ""))
	if !v.Allowed || !strings.Contains(string(out), `"operator":"Equal"`) {
		t.Fatalf("out %s verdict %+v", out, v)
	}
	if out2, _ := mutate(t, p, req(admissionv1.Create, string(out), "")); out2 != nil {
		t.Fatalf("not idempotent: %s", out2)
	}
	if out, _ := mutate(t, p, req(admissionv1.Create, flavor(``), "")); out != nil {
		t.Fatalf("plain flavor changed: %s", out)
	}
	pf, _ := New(Config{AddFinalizer: true})
	out, _ = mutate(t, pf, req(admissionv1.Create, flavor(``), ""))
	if !strings.Contains(string(out), `"finalizers":["`+ResourceInUseFinalizer+`"]`) {
		t.Fatalf("no finalizer: %s", out)
	}
	if out2, _ := mutate(t, pf, req(admissionv1.Create, string(out), "")); out2 != nil {
		t.Fatalf("finalizer added twice: %s", out2)
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
	p, err := New(Config{AddFinalizer: true})
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
				for i := range f.Spec.Tolerations {
					if t := &f.Spec.Tolerations[i]; t.Operator == "" && t.Key != "" {
						t.Operator = corev1.TolerationOpEqual
					}
				}
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
