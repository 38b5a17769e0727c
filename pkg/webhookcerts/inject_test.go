package webhookcerts

import (
	"bytes"
	"context"
	"encoding/json"
	"reflect"
	"sort"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"
)

// paths lists every leaf path of a JSON document ("a.b[].c").
func paths(t *testing.T, doc []byte) []string {
	t.Helper()
	var v any
	if err := json.Unmarshal(doc, &v); err != nil {
		t.Fatal(err)
	}
	var out []string
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		switch t := v.(type) {
		case map[string]any:
			for k, x := range t {
				walk(strings.TrimPrefix(prefix+"."+k, "."), x)
			}
		case []any:
			for _, x := range t {
				walk(prefix+"[]", x)
			}
		default:
			if !strings.HasPrefix(prefix, "metadata.annotations.") || prefix == "metadata.annotations."+GenerationAnnotation {
				out = append(out, prefix)
			} else {
				out = append(out, "UNEXPECTED "+prefix)
			}
		}
	}
	walk("", v)
	sort.Strings(out)
	return out
}

func applyPatches(actions []k8stesting.Action) map[string][]byte {
	out := map[string][]byte{}
	for _, a := range actions {
		if p, ok := a.(k8stesting.PatchAction); ok && p.GetPatchType() == types.ApplyPatchType {
			out[a.GetResource().Resource+"/"+p.GetName()] = p.GetPatch()
		}
	}
	return out
}

// The applies name only the webhooks' name and clientConfig.caBundle (a
// CRD's spec.conversion.webhook.clientConfig.caBundle) and the generation
// annotation, with Force and the field manager: the one field GitOps tools
// must ignore. The server-side merge keeps every other field.
func TestApplyCallShape(t *testing.T) {
	c := newCluster(t, world()...)
	r := c.rotator(t, testOptions())
	mustBootstrap(t, r)
	patches := applyPatches(append(c.kube.Actions(), c.dyn.Actions()...))
	want := map[string][]string{
		"validatingwebhookconfigurations/v":    {"apiVersion", "kind", "metadata.annotations." + GenerationAnnotation, "metadata.name", "webhooks[].clientConfig.caBundle", "webhooks[].clientConfig.caBundle", "webhooks[].name", "webhooks[].name"},
		"mutatingwebhookconfigurations/m":      {"apiVersion", "kind", "metadata.annotations." + GenerationAnnotation, "metadata.name", "webhooks[].clientConfig.caBundle", "webhooks[].name"},
		"customresourcedefinitions/" + testCRD: {"apiVersion", "kind", "metadata.annotations." + GenerationAnnotation, "metadata.name", "spec.conversion.webhook.clientConfig.caBundle"},
	}
	if len(patches) != len(want) {
		t.Fatalf("applied to %d objects, want %d: %v", len(patches), len(want), patches)
	}
	for k, w := range want {
		if got := paths(t, patches[k]); !reflect.DeepEqual(got, w) {
			t.Errorf("%s apply names %v, want %v", k, got, w)
		}
	}
	for _, a := range append(c.kube.Actions(), c.dyn.Actions()...) {
		if p, ok := a.(k8stesting.PatchActionImpl); ok && p.GetPatchType() == types.ApplyPatchType {
			if p.PatchOptions.FieldManager != DefaultFieldManager || p.PatchOptions.Force == nil || !*p.PatchOptions.Force {
				t.Errorf("%s applied with %+v, want field manager %q and Force", p.GetName(), p.PatchOptions, DefaultFieldManager)
			}
		}
	}
	// The fake's server-side apply merged: service, sideEffects and
	// admissionReviewVersions are intact, the caBundle set, and the field
	// manager owns only the caBundle, the names and the annotation.
	v, err := c.kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(context.Background(), "v", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range v.Webhooks {
		if w.ClientConfig.Service == nil || w.SideEffects == nil || len(w.AdmissionReviewVersions) == 0 || !bytes.Equal(w.ClientConfig.CABundle, r.CABundle()) {
			t.Errorf("webhook %s after apply: %+v", w.Name, w)
		}
	}
	owns := false
	for _, mf := range v.ManagedFields {
		if mf.Manager != DefaultFieldManager {
			continue
		}
		owns = true
		fs := string(mf.FieldsV1.Raw)
		if mf.Operation != metav1.ManagedFieldsOperationApply || strings.Contains(fs, "f:service") || strings.Contains(fs, "f:sideEffects") || !strings.Contains(fs, "f:caBundle") {
			t.Errorf("field manager owns %s (%s)", fs, mf.Operation)
		}
	}
	if !owns {
		t.Errorf("no managedFields entry for %q: %+v", DefaultFieldManager, v.ManagedFields)
	}
	crdObj, err := c.dyn.Resource(crdGVR).Get(context.Background(), testCRD, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	o, err := ownedFrom(WebhookInfo{Type: CRDConversion, Name: testCRD}, crdObj)
	if err != nil || len(o.hooks) != 1 || !bytes.Equal(o.hooks[0].caBundle, r.CABundle()) {
		t.Fatalf("CRD caBundle not injected: %v", err)
	}
	if svc, _, _ := unstructuredString(crdObj.Object, "spec", "conversion", "webhook", "clientConfig", "service", "name"); svc != testSvc {
		t.Error("CRD conversion service lost")
	}
}

func unstructuredString(obj map[string]any, path ...string) (string, bool, error) {
	var cur any = obj
	for _, p := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			return "", false, nil
		}
		cur = m[p]
	}
	s, ok := cur.(string)
	return s, ok, nil
}

// A configuration that does not exist gets no call (and one log line); a
// CRD without a conversion webhook gets none; nothing is applied when the
// live bundle already matches.
func TestInjectSkips(t *testing.T) {
	var objs []runtime.Object
	for _, o := range world() {
		if _, ok := o.(*admissionv1.MutatingWebhookConfiguration); ok {
			continue // "m" is missing
		}
		objs = append(objs, o)
	}
	objs[len(objs)-1] = crd(testCRD, false)
	c := newCluster(t, objs...)
	var logs logSink
	opts := testOptions()
	opts.Logger = logs.logger()
	r := c.rotator(t, opts)
	mustBootstrap(t, r)
	pass(t, r)
	pass(t, r)
	for k := range applyPatches(append(c.kube.Actions(), c.dyn.Actions()...)) {
		if k != "validatingwebhookconfigurations/v" {
			t.Errorf("applied to %s", k)
		}
	}
	for _, a := range c.kube.Actions() {
		if a.GetResource().Resource == "mutatingwebhookconfigurations" && a.GetVerb() != "get" {
			t.Errorf("%s on the missing configuration", a.GetVerb())
		}
	}
	if n := logs.count(`"name"="m"`); n != 1 {
		t.Errorf("missing configuration logged %d times, want once", n)
	}
	c.kube.ClearActions()
	c.dyn.ClearActions()
	pass(t, r)
	if p := applyPatches(append(c.kube.Actions(), c.dyn.Actions()...)); len(p) != 0 {
		t.Errorf("applied although every bundle matches: %v", p)
	}
	// The configuration appears: it is injected on the next pass.
	if _, err := c.kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(context.Background(), world()[3].(*admissionv1.MutatingWebhookConfiguration), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pass(t, r)
	if b := c.bundles(t)["m/c.example.com"]; !bytes.Equal(b, r.CABundle()) {
		t.Error("configuration created later not injected")
	}
}

// The CRD informer keeps only metadata (no managedFields, only the
// generation annotation) and spec.conversion.
func TestTrimOwnedCRD(t *testing.T) {
	u := crd(testCRD, true)
	u.SetAnnotations(map[string]string{GenerationAnnotation: "3", "kubectl.kubernetes.io/last-applied-configuration": strings.Repeat("x", 1000)})
	u.SetManagedFields([]metav1.ManagedFieldsEntry{{Manager: "kubectl"}})
	out, err := trimOwned(u)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(out)
	got := paths(t, b)
	for _, p := range got {
		if !strings.HasPrefix(p, "spec.conversion.") && !strings.HasPrefix(p, "metadata.") && p != "apiVersion" && p != "kind" {
			t.Errorf("kept %s", p)
		}
		if strings.Contains(p, "managedFields") || strings.HasPrefix(p, "UNEXPECTED") {
			t.Errorf("kept %s", p)
		}
	}
	o, err := ownedFrom(WebhookInfo{Type: CRDConversion, Name: testCRD}, out)
	if err != nil || o.generation != 3 || len(o.hooks) != 1 {
		t.Fatalf("trimmed CRD reads as %+v, %v", o, err)
	}
}
