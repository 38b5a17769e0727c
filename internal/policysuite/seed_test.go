package policysuite

import (
	"context"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	apiserveradmission "k8s.io/apiserver/pkg/admission"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/celpolicy"
	"github.com/kadmit/kadmit/internal/jsonedit"
	"github.com/kadmit/kadmit/internal/policy/seed/lifespan"
	"github.com/kadmit/kadmit/internal/policy/seed/podname"
	"github.com/kadmit/kadmit/internal/testkit"
)

// seedPods are pods as the API server sends them (metadata and spec set),
// covering every branch of the pod-name and lifespan built-ins.
var seedPods = map[string]string{
	"plain":                `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"web-1","namespace":"shop"},"spec":{"containers":[{"name":"c","image":"nginx"}]}}`,
	"offensive name":       `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"an-offensive-pod","namespace":"shop"},"spec":{"containers":[{"name":"c","image":"nginx"}]}}`,
	"offensive generate":   `{"apiVersion":"v1","kind":"Pod","metadata":{"generateName":"offensive-","namespace":"shop"},"spec":{"containers":[{"name":"c","image":"nginx"}]}}`,
	"name wins over gen":   `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"fine","generateName":"offensive-","namespace":"shop"},"spec":{"containers":[{"name":"c","image":"nginx"}]}}`,
	"case differs":         `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"Offensive","namespace":"shop"},"spec":{"containers":[{"name":"c","image":"nginx"}]}}`,
	"no name at all":       `{"apiVersion":"v1","kind":"Pod","metadata":{"namespace":"shop"},"spec":{"containers":[{"name":"c","image":"nginx"}]}}`,
	"label 0":              `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","labels":{"acme.com/lifespan-requested":"0"}},"spec":{"containers":[{"name":"c"}]}}`,
	"label 14":             `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","labels":{"acme.com/lifespan-requested":"14"}},"spec":{"containers":[{"name":"c"}]}}`,
	"label 007":            `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","labels":{"acme.com/lifespan-requested":"007"}},"spec":{"containers":[{"name":"c"}],"tolerations":[]}}`,
	"label 15":             `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","labels":{"acme.com/lifespan-requested":"15"}},"spec":{"containers":[{"name":"c"}]}}`,
	"label empty":          `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","labels":{"acme.com/lifespan-requested":""}},"spec":{"containers":[{"name":"c"}]}}`,
	"label word":           `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","labels":{"acme.com/lifespan-requested":"abc"}},"spec":{"containers":[{"name":"c"}]}}`,
	"label huge":           `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","labels":{"acme.com/lifespan-requested":"99999999999"}},"spec":{"containers":[{"name":"c"}]}}`,
	"label zeros then 15":  `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","labels":{"acme.com/lifespan-requested":"0000000000015"}},"spec":{"containers":[{"name":"c"}]}}`,
	"label zeros then 9":   `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","labels":{"acme.com/lifespan-requested":"00000000000009"}},"spec":{"containers":[{"name":"c"}]}}`,
	"existing tolerations": `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","labels":{"acme.com/lifespan-requested":"10"}},"spec":{"containers":[{"name":"c"}],"tolerations":[{"key":"acme.com/lifespan-remaining","operator":"Equal","value":"12","effect":"NoSchedule"},{"key":"acme.com/lifespan-remaining","value":"10","effect":"NoSchedule"},{"key":"other","operator":"Exists"}]}}`,
	"all present":          `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","labels":{"acme.com/lifespan-requested":"14"}},"spec":{"containers":[{"name":"c"}],"tolerations":[{"key":"acme.com/lifespan-remaining","operator":"Equal","value":"14","effect":"NoSchedule"}]}}`,
	"exists present":       `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"containers":[{"name":"c"}],"tolerations":[{"key":"acme.com/lifespan-remaining","operator":"Exists","effect":"NoSchedule"}]}}`,
	"exists wrong effect":  `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"containers":[{"name":"c"}],"tolerations":[{"key":"acme.com/lifespan-remaining","operator":"Exists","effect":"NoExecute","tolerationSeconds":30}]}}`,
	"other labels":         `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","labels":{"app":"x","acme.com/lifespan-requested":"13"}},"spec":{"containers":[{"name":"c"}]}}`,
	"unicode name":         `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"pöd-offensive-名前"},"spec":{"containers":[{"name":"c"}]}}`,
}

func podRequest(raw string) (*admission.Request, *celpolicy.Request) {
	areq := testkit.Request(admissionv1.Create, testkit.Pods, raw, "", testkit.Namespace("shop"))
	creq := &celpolicy.Request{
		Kind: schema.GroupVersionKind{Version: "v1", Kind: "Pod"}, Resource: schema.GroupVersionResource{Version: "v1", Resource: "pods"},
		Namespace: "shop", Name: "p", Operation: apiserveradmission.Create, Object: []byte(raw),
	}
	return areq, creq
}

func seedEngine(t *testing.T, dir string) *celpolicy.Engine {
	t.Helper()
	set, err := celpolicy.Load("../../examples/cel/" + dir + "/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	e, err := celpolicy.New(set, celpolicy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// TestSeedEquivalents: examples/cel/pod-name and examples/cel/lifespan
// decide exactly like the built-in Go policies on the same pods: the same
// allow or deny, the built-in's message as the policy's own part of the
// in-tree message, and (lifespan) the same mutated object. The one
// expected difference: a denial's code is the ValidatingAdmissionPolicy
// reason's (403 Forbidden, 422 Invalid) where lifespan's built-in answers
// 400, a code a validation's reason cannot state.
func TestSeedEquivalents(t *testing.T) {
	ctx := context.Background()
	pn, err := podname.New(podname.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	ls, err := lifespan.New(lifespan.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	pnE, lsE := seedEngine(t, "pod-name"), seedEngine(t, "lifespan")
	for name, pod := range seedPods {
		t.Run(name, func(t *testing.T) {
			areq, creq := podRequest(pod)

			want := pn.Validate(ctx, areq)
			got, err := Evaluate(ctx, pnE, creq)
			if err != nil {
				t.Fatal(err)
			}
			sameDecision(t, "pod-name", want, got)
			if !got.Allowed && got.Status.Code != want.Code {
				t.Errorf("pod-name: code %d, built-in %d", got.Status.Code, want.Code)
			}

			ops, lwant := ls.Mutate(ctx, areq)
			// Named (generateName) as the API server names the built-in's
			// result before validation, with a known suffix.
			lgot, err := EvaluateWith(ctx, lsE, creq, fixedName("xxxxx"))
			if err != nil {
				t.Fatal(err)
			}
			sameDecision(t, "lifespan", lwant, lgot)
			if !lwant.Allowed {
				return
			}
			wantObj, err := jsonedit.Apply([]byte(pod), ops)
			if err != nil {
				t.Fatal(err)
			}
			if wantObj, _, err = admission.GenerateName(wantObj, fixedName("xxxxx")); err != nil {
				t.Fatal(err)
			}
			gotObj := lgot.Object
			if gotObj == nil {
				gotObj = []byte(pod)
			}
			if !sameJSON(wantObj, gotObj) {
				t.Errorf("lifespan object:\n got  %s\n want %s", gotObj, wantObj)
			}
		})
	}
}

func sameDecision(t *testing.T, policy string, want admission.Verdict, got *celpolicy.Decision) {
	t.Helper()
	if want.Allowed != got.Allowed {
		t.Fatalf("%s: allowed %v (%v), built-in %v (%s)", policy, got.Allowed, got.Status, want.Allowed, want.Message)
	}
	if !want.Allowed && !strings.HasSuffix(got.Message(), "denied request: "+want.Message) {
		t.Errorf("%s: message %q, want the suffix %q", policy, got.Message(), want.Message)
	}
}

// fixedName is a names.NameGenerator with a known suffix.
type fixedName string

func (f fixedName) GenerateName(base string) string { return base + string(f) }
