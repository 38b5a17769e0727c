package celpolicy

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// sensitivePolicy is one policy of kind (ValidatingAdmissionPolicy or
// MutatingAdmissionPolicy) named "p" whose resourceRules are rules and
// excludeResourceRules excludes (YAML flow sequences).
func sensitivePolicy(kind, rules, excludes string) string {
	body := "  validations: [{expression: 'true'}]\n"
	if kind == "MutatingAdmissionPolicy" {
		body = "  mutations: [{patchType: JSONPatch, jsonPatch: {expression: '[JSONPatch{op: \"test\", path: \"/kind\", value: object.kind}]'}}]\n"
		body += "  reinvocationPolicy: Never\n"
	}
	ex := ""
	if excludes != "" {
		ex = "    excludeResourceRules: " + excludes + "\n"
	}
	return "apiVersion: admissionregistration.k8s.io/v1\nkind: " + kind + "\nmetadata: {name: p}\nspec:\n  matchConstraints:\n    resourceRules: " + rules + "\n" + ex + body
}

// By default no declared policy may match a sensitive group: named, through
// a wildcard group, or with a subresource; the error names the file, the
// policy, the rule and the group, and the flag that lifts it. With
// AllowSensitiveGroups the same documents load.
func TestSensitiveGroupsRefused(t *testing.T) {
	type tc struct {
		rules, excludes string
		want            string
	}
	cases := map[string]tc{}
	for _, g := range SensitiveGroups {
		cases["group "+g] = tc{rules: fmt.Sprintf(`[{apiGroups: ["apps", %q], apiVersions: ["v1"], operations: ["CREATE"], resources: ["*"]}]`, g),
			want: fmt.Sprintf(`spec.matchConstraints.resourceRules[0].apiGroups: %q: declared policies may not match`, g)}
	}
	cases["subresource"] = tc{rules: `[{apiGroups: [""], apiVersions: ["v1"], operations: ["CREATE"], resources: ["pods"]}, {apiGroups: ["certificates.k8s.io"], apiVersions: ["v1"], operations: ["UPDATE"], resources: ["certificatesigningrequests/approval"]}]`,
		want: `spec.matchConstraints.resourceRules[1].apiGroups: "certificates.k8s.io"`}
	cases["resource names"] = tc{rules: `[{apiGroups: ["rbac.authorization.k8s.io"], apiVersions: ["v1"], operations: ["CREATE"], resources: ["clusterrolebindings"], resourceNames: ["cluster-admin"]}]`,
		want: `"rbac.authorization.k8s.io": declared policies may not match`}
	cases["wildcard group"] = tc{rules: `[{apiGroups: ["*"], apiVersions: ["*"], operations: ["*"], resources: ["*"]}]`,
		want: `spec.matchConstraints.resourceRules[0].apiGroups: "*" includes "rbac.authorization.k8s.io"`}
	cases["wildcard group, named resource"] = tc{rules: `[{apiGroups: ["*"], apiVersions: ["v1"], operations: ["CREATE"], resources: ["clusterrolebindings"]}]`,
		want: `"*" includes "rbac.authorization.k8s.io"`}
	all := `["rbac.authorization.k8s.io", "admissionregistration.k8s.io", "certificates.k8s.io", "authentication.k8s.io", "authorization.k8s.io"]`
	// Excludes that leave part of a group matched do not count.
	partial := map[string]string{
		"some operations":      `[{apiGroups: ` + all + `, apiVersions: ["*"], operations: ["CREATE", "DELETE"], resources: ["*/*"]}]`,
		"no subresources":      `[{apiGroups: ` + all + `, apiVersions: ["*"], operations: ["*"], resources: ["*"]}]`,
		"one version":          `[{apiGroups: ` + all + `, apiVersions: ["v1"], operations: ["*"], resources: ["*/*"]}]`,
		"named objects":        `[{apiGroups: ` + all + `, apiVersions: ["*"], operations: ["*"], resources: ["*/*"], resourceNames: ["x"]}]`,
		"namespaced only":      `[{apiGroups: ` + all + `, apiVersions: ["*"], operations: ["*"], resources: ["*/*"], scope: Namespaced}]`,
		"one group left":       `[{apiGroups: ["rbac.authorization.k8s.io", "admissionregistration.k8s.io", "certificates.k8s.io", "authentication.k8s.io"], apiVersions: ["*"], operations: ["*"], resources: ["*/*"]}]`,
		"split, one op short":  `[{apiGroups: ` + all + `, apiVersions: ["*"], operations: ["CREATE", "UPDATE", "DELETE"], resources: ["*/*"]}]`,
		"rbac resources named": `[{apiGroups: ` + all + `, apiVersions: ["*"], operations: ["*"], resources: ["clusterrolebindings", "*"]}]`,
	}
	for name, ex := range partial {
		cases["wildcard group, exclude "+name] = tc{rules: `[{apiGroups: ["*"], apiVersions: ["*"], operations: ["*"], resources: ["*"]}]`, excludes: ex, want: `"*" includes`}
	}
	for _, kind := range []string{"ValidatingAdmissionPolicy", "MutatingAdmissionPolicy"} {
		for name, c := range cases {
			t.Run(kind+"/"+name, func(t *testing.T) {
				doc := sensitivePolicy(kind, c.rules, c.excludes)
				_, err := LoadAll(nil, []Document{{Name: "ConfigMap ns/policies data[p.yaml]", Data: doc}})
				want := "ConfigMap ns/policies data[p.yaml] (document 0): " + kind + " p: "
				if err == nil || !errors.Is(err, ErrInput) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), SensitiveGroupsFlag) {
					t.Fatalf("err = %v\nwant it to contain %q, %q and %q", err, want, c.want, SensitiveGroupsFlag)
				}
				if _, err := LoadWith(LoadOptions{AllowSensitiveGroups: true}, nil, []Document{{Name: "x", Data: doc}}); err != nil {
					t.Fatalf("with AllowSensitiveGroups: %v", err)
				}
			})
		}
	}
}

// What stays accepted by default: ordinary groups, a wildcard group whose
// excludes take every sensitive group out whole, and a sensitive group in
// excludeResourceRules only (excludes narrow; they cannot widen).
func TestSensitiveGroupsAccepted(t *testing.T) {
	all := `["rbac.authorization.k8s.io", "admissionregistration.k8s.io", "certificates.k8s.io", "authentication.k8s.io", "authorization.k8s.io"]`
	cases := map[string]struct{ rules, excludes string }{
		"ordinary groups":   {`[{apiGroups: ["", "apps", "batch", "authorization.example.com"], apiVersions: ["*"], operations: ["*"], resources: ["*/*"]}]`, ""},
		"wildcard excluded": {`[{apiGroups: ["*"], apiVersions: ["*"], operations: ["*"], resources: ["*"]}]`, `[{apiGroups: ` + all + `, apiVersions: ["*"], operations: ["*"], resources: ["*/*"]}]`},
		"wildcard excluded per group, ops listed": {`[{apiGroups: ["*"], apiVersions: ["*"], operations: ["CREATE"], resources: ["pods"]}]`,
			`[{apiGroups: ["rbac.authorization.k8s.io", "admissionregistration.k8s.io"], apiVersions: ["*"], operations: ["*"], resources: ["*/*"]}, {apiGroups: ["certificates.k8s.io", "authentication.k8s.io", "authorization.k8s.io"], apiVersions: ["*"], operations: ["CREATE", "UPDATE", "DELETE", "CONNECT"], resources: ["*/*"], scope: "*"}]`},
		"sensitive only excluded": {`[{apiGroups: ["apps"], apiVersions: ["v1"], operations: ["CREATE"], resources: ["deployments"]}]`, `[{apiGroups: ["rbac.authorization.k8s.io"], apiVersions: ["v1"], operations: ["CREATE"], resources: ["roles"]}]`},
	}
	for _, kind := range []string{"ValidatingAdmissionPolicy", "MutatingAdmissionPolicy"} {
		for name, c := range cases {
			t.Run(kind+"/"+name, func(t *testing.T) {
				if _, err := LoadAll(nil, []Document{{Name: "x", Data: sensitivePolicy(kind, c.rules, c.excludes)}}); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

// Load (files), LoadReader and Set.Validate apply the same default as
// LoadAll; ValidateWith lifts it.
func TestSensitiveGroupsEveryEntryPoint(t *testing.T) {
	doc := sensitivePolicy("MutatingAdmissionPolicy", `[{apiGroups: ["rbac.authorization.k8s.io"], apiVersions: ["v1"], operations: ["CREATE"], resources: ["clusterrolebindings"]}]`, "")
	if _, err := LoadReader("r.yaml", strings.NewReader(doc)); err == nil || !strings.Contains(err.Error(), "declared policies may not match") {
		t.Errorf("LoadReader: %v", err)
	}
	p := filepath.Join(t.TempDir(), "f.yaml")
	if err := os.WriteFile(p, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(p); err == nil || !strings.Contains(err.Error(), "f.yaml (document 0): MutatingAdmissionPolicy p: ") {
		t.Errorf("Load: %v", err)
	}
	s := &Set{Sources: map[string]Source{}}
	if err := s.addReader("r.yaml", strings.NewReader(doc)); err != nil {
		t.Fatal(err)
	}
	if err := s.Validate(); err == nil || !strings.Contains(err.Error(), "declared policies may not match") {
		t.Errorf("Validate: %v", err)
	}
	if err := s.ValidateWith(LoadOptions{AllowSensitiveGroups: true}); err != nil {
		t.Errorf("ValidateWith: %v", err)
	}
}
