package celpolicy

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const vapHeader = `apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: p}
spec:
  matchConstraints:
    resourceRules: [{apiGroups: [""], apiVersions: ["v1"], operations: ["CREATE"], resources: ["pods"]}]
`

// Every refusal names the file and the document, and says what to fix.
func TestLoadErrors(t *testing.T) {
	cases := map[string]struct{ body, want string }{
		"unknown field": {vapHeader + "  validations: [{expresion: 'true'}]\n",
			`x.yaml (document 0): ValidatingAdmissionPolicy p: json: unknown field "expresion"`},
		"bad expression": {vapHeader + "  validations: [{expression: 'object.metadata.name.startWith(\"a\")'}]\n",
			"x.yaml (document 0): ValidatingAdmissionPolicy p: spec.validations[0].expression: compilation failed"},
		"missing policy": {vapHeader + "  validations: [{expression: 'true'}]\n---\napiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicyBinding\nmetadata: {name: b}\nspec: {policyName: q, validationActions: [Deny]}\n",
			`x.yaml (document 1): ValidatingAdmissionPolicyBinding b: spec.policyName: no ValidatingAdmissionPolicy "q" is loaded`},
		"no actions": {vapHeader + "  validations: [{expression: 'true'}]\n---\napiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicyBinding\nmetadata: {name: b}\nspec: {policyName: p}\n",
			"spec.validationActions: Required value"},
		"duplicate": {vapHeader + "  validations: [{expression: 'true'}]\n---\n" + vapHeader + "  validations: [{expression: 'true'}]\n",
			"x.yaml (document 1): ValidatingAdmissionPolicy p is also defined at "},
		"no kind":      {"metadata: {name: x}\n", "x.yaml (document 0): Object 'Kind' is missing"},
		"map v1alpha1": {"apiVersion: admissionregistration.k8s.io/v1alpha1\nkind: MutatingAdmissionPolicy\nmetadata: {name: m}\n", "kadmit reads admissionregistration.k8s.io/v1 or v1beta1"},
		"bad yaml":     {vapHeader + "  validations: [\n", "x.yaml (document 0)"},
		// The API server has no default for a MutatingAdmissionPolicy's
		// reinvocationPolicy and refuses it without one.
		"map without reinvocationPolicy": {"apiVersion: admissionregistration.k8s.io/v1\nkind: MutatingAdmissionPolicy\nmetadata: {name: m}\nspec:\n  matchConstraints:\n    resourceRules: [{apiGroups: [\"\"], apiVersions: [v1], operations: [CREATE], resources: [pods]}]\n  mutations: [{patchType: JSONPatch, jsonPatch: {expression: '[JSONPatch{op: \"test\", path: \"/kind\", value: object.kind}]'}}]\n",
			"x.yaml (document 0): MutatingAdmissionPolicy m: spec.reinvocationPolicy: Required value"},
		"param ref bad": {vapHeader + "  validations: [{expression: 'true'}]\n---\napiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicyBinding\nmetadata: {name: b}\nspec: {policyName: p, validationActions: [Deny], paramRef: {name: x}}\n", "spec.paramRef.parameterNotFoundAction: Required value"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, "x.yaml")
			if err := os.WriteFile(p, []byte(c.body), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := Load(p)
			if err == nil || !errors.Is(err, ErrInput) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want it to contain %q", err, c.want)
			}
		})
	}
}

func TestLoadBounds(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "big.yaml")
	if err := os.WriteFile(p, []byte(strings.Repeat("#", MaxFileBytes+1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(p); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("big file: %v", err)
	}
	var b strings.Builder
	for i := 0; i <= MaxDocuments; i++ {
		b.WriteString("---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: c" + itoa(i) + ", namespace: d}\n")
	}
	if b.Len() > MaxFileBytes {
		t.Fatalf("test input too large: %d", b.Len())
	}
	q := filepath.Join(dir, "many.yaml")
	if err := os.WriteFile(q, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(q); err == nil || !strings.Contains(err.Error(), "more than 2000 documents") {
		t.Errorf("many documents: %v", err)
	}
}

func itoa(i int) string {
	const digits = "0123456789"
	if i == 0 {
		return "0"
	}
	var out []byte
	for ; i > 0; i /= 10 {
		out = append([]byte{digits[i%10]}, out...)
	}
	return string(out)
}
