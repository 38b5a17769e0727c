package policysuite

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apiserver/pkg/admission"

	kadmission "github.com/kadmit/kadmit/internal/admission"
)

// A policy that denies everything with a message spelling out what it saw
// of request.dryRun and request.options: each test expects the exact
// message, so a dryRun or option that does not reach the policy, or a
// default that is not the API server's, fails.
const echoPolicy = `apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: echo}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - {apiGroups: [""], apiVersions: [v1], operations: ["*"], resources: [configmaps]}
  validations:
  - expression: "false"
    messageExpression: >-
      'dryRun=' + string(request.dryRun) +
      ' kind=' + request.options.kind + ' apiVersion=' + request.options.apiVersion +
      ' fieldManager=' + request.options.?fieldManager.orValue('-') +
      ' optionsDryRun=' + request.options.?dryRun.orValue(['-']).join(',') +
      ' propagationPolicy=' + request.options.?propagationPolicy.orValue('-')
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: echo}
spec: {policyName: echo, validationActions: [Deny]}
`

const echoSuite = `apiVersion: kadmit.io/v1alpha1
kind: PolicyTest
metadata: {name: echo}
policies: [policy.yaml]
tests:
- name: create defaults
  object: &cm {apiVersion: v1, kind: ConfigMap, metadata: {name: c, namespace: default}}
  expect: {allowed: false, messageContains: "dryRun=false kind=CreateOptions apiVersion=meta.k8s.io/v1 fieldManager=- optionsDryRun=- propagationPolicy=-"}
- name: create dry run
  dryRun: true
  object: *cm
  expect: {allowed: false, messageContains: "dryRun=true kind=CreateOptions apiVersion=meta.k8s.io/v1 fieldManager=- optionsDryRun=All "}
- name: create options
  options: {fieldManager: kubectl-create, fieldValidation: Strict}
  object: *cm
  expect: {allowed: false, messageContains: "dryRun=false kind=CreateOptions apiVersion=meta.k8s.io/v1 fieldManager=kubectl-create optionsDryRun=- "}
- name: options dryRun makes a dry run
  options: {kind: CreateOptions, apiVersion: meta.k8s.io/v1, dryRun: [All]}
  object: *cm
  expect: {allowed: false, messageContains: "dryRun=true kind=CreateOptions apiVersion=meta.k8s.io/v1 fieldManager=- optionsDryRun=All "}
- name: update
  operation: UPDATE
  options: {fieldManager: kubectl-edit}
  oldObject: *cm
  object: *cm
  expect: {allowed: false, messageContains: "dryRun=false kind=UpdateOptions apiVersion=meta.k8s.io/v1 fieldManager=kubectl-edit "}
- name: delete
  operation: DELETE
  dryRun: true
  options: {propagationPolicy: Foreground}
  oldObject: *cm
  expect: {allowed: false, messageContains: "dryRun=true kind=DeleteOptions apiVersion=meta.k8s.io/v1 fieldManager=- optionsDryRun=All propagationPolicy=Foreground"}
`

func writeSuite(t *testing.T, policy, suite string) *Suite {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "policy.yaml"), []byte(policy), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "suite.yaml")
	if err := os.WriteFile(path, []byte(suite), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := ReadSuite(path)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestDryRunAndOptionsReachPolicies(t *testing.T) {
	rs, err := Run(context.Background(), writeSuite(t, echoPolicy, echoSuite))
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 6 {
		t.Fatalf("%d results", len(rs))
	}
	for _, r := range rs {
		if len(r.Failures) > 0 {
			t.Errorf("%s:\n  %s", r.Test, strings.Join(r.Failures, "\n  "))
		}
	}
}

func TestOptionsRefused(t *testing.T) {
	for _, c := range []struct {
		op      admission.Operation
		options string
		dryRun  bool
		want    string
	}{
		{admission.Create, `{"gracePeriodSeconds": 0}`, false, `a CREATE request carries CreateOptions (fields dryRun, fieldManager, fieldValidation): json: unknown field "gracePeriodSeconds"`},
		{admission.Update, `{"propagationPolicy": "Orphan"}`, false, `a UPDATE request carries UpdateOptions`},
		{admission.Delete, `{"fieldManager": "x"}`, false, `a DELETE request carries DeleteOptions (fields dryRun, gracePeriodSeconds,`},
		{admission.Create, `{"kind": "PatchOptions"}`, false, `options: kind PatchOptions: a CREATE request carries CreateOptions`},
		{admission.Delete, `{"kind": "DeleteOptions", "apiVersion": "v1"}`, false, `options: apiVersion v1: options are meta.k8s.io/v1`},
		{admission.Create, `"fieldManager=x"`, false, `options: must be an object of CreateOptions fields`},
		{admission.Create, `{"dryRun": ["Some"]}`, false, `the API server refuses these CreateOptions before admission: dryRun: Unsupported value`},
		{admission.Update, `{"fieldValidation": "Loud"}`, false, `fieldValidation: Unsupported value: "Loud"`},
		{admission.Create, `{"fieldManager": "` + strings.Repeat("m", 129) + `"}`, false, `fieldManager: Too long`},
		{admission.Delete, `{"propagationPolicy": "Later"}`, false, `propagationPolicy: Unsupported value`},
		{admission.Connect, `{"fieldManager": "x"}`, false, `CONNECT requests carry no options and are never dry runs`},
		{admission.Connect, ``, true, `CONNECT requests carry no options and are never dry runs`},
	} {
		_, _, err := kadmission.RequestOptions(admissionv1.Operation(c.op), json.RawMessage(c.options), c.dryRun)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %s dryRun=%v: got %v, want %q", c.op, c.options, c.dryRun, err, c.want)
		}
	}
	// CONNECT without either has no options, as the API server sends it.
	if o, dry, err := kadmission.RequestOptions(admissionv1.Connect, nil, false); err != nil || o != nil || dry {
		t.Errorf("CONNECT: %s %v %v", o, dry, err)
	}
}

// A wrong option is an input error naming the suite and the test.
func TestOptionsInputError(t *testing.T) {
	suite := `apiVersion: kadmit.io/v1alpha1
kind: PolicyTest
policies: [policy.yaml]
tests:
- name: delete option on create
  options: {gracePeriodSeconds: 0}
  object: {apiVersion: v1, kind: ConfigMap, metadata: {name: c, namespace: default}}
  expect: {allowed: true}
`
	_, err := Run(context.Background(), writeSuite(t, echoPolicy, suite))
	if !errors.Is(err, ErrInput) || !strings.Contains(err.Error(), "tests[0] (delete option on create): options: a CREATE request carries CreateOptions") {
		t.Fatalf("got %v", err)
	}
}
