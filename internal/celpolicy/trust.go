package celpolicy

import (
	"fmt"
	"slices"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
)

// SensitiveGroups are the API groups declared policies may not match
// unless LoadOptions.AllowSensitiveGroups is set: the groups that decide
// who may do what (RBAC), what admission runs (webhook configurations and
// in-tree policies), which certificates are issued, and who a request is
// (token and access reviews). A mutating policy on clusterrolebindings
// could add its author to the next cluster-admin binding; a validating
// one could refuse every RBAC change. In tree, the same power needs create
// on cluster-scoped admissionregistration objects, which only cluster
// admins hold; whoever may write kadmit's policy files or policies
// ConfigMap should not gain it by default (docs/security.md, "Declared
// policies are a trust root").
var SensitiveGroups = []string{
	"rbac.authorization.k8s.io",
	"admissionregistration.k8s.io",
	"certificates.k8s.io",
	"authentication.k8s.io",
	"authorization.k8s.io",
}

// SensitiveGroupsFlag is the flag of kadmit serve, review and test that
// sets LoadOptions.AllowSensitiveGroups; errors name it.
const SensitiveGroupsFlag = "--policies-allow-sensitive-groups"

// LoadOptions change what LoadWith accepts. The zero value is the safe
// default that Load and LoadAll use.
type LoadOptions struct {
	// AllowSensitiveGroups lets policies match resources of
	// SensitiveGroups. Without it, a ValidatingAdmissionPolicy or
	// MutatingAdmissionPolicy whose spec.matchConstraints.resourceRules
	// name one of those groups, or the wildcard group "*" not narrowed by
	// excludeResourceRules (see checkSensitive), is refused at load.
	AllowSensitiveGroups bool
}

// checkSensitive refuses match constraints that can reach SensitiveGroups.
//
// Only spec.matchConstraints counts: a binding's matchResources and the
// policy's matchConditions can only narrow what the policy matches (the
// API server requires both to match, k8s.io/apiserver v0.37.1
// pkg/admission/plugin/policy/generic/policy_matcher.go), so they can
// neither widen a policy into these groups nor be needed to keep it out.
//
// A resource rule is refused when its apiGroups name a sensitive group
// (any version, resource, subresource, operation or resourceNames). A rule
// with the wildcard group "*" is refused unless excludeResourceRules take
// every sensitive group out entirely: for each group, an exclude rule
// naming it (or "*") with apiVersions ["*"], resources "*/*" (all
// resources and their subresources; "*" alone leaves subresources
// matched), every operation, scope "*" and no resourceNames. A partial
// exclusion (some operations, some versions, named objects) does not
// count, so excludes cannot be used to pass the check while still matching
// part of a group. The error names the rule and the group.
//
// matchPolicy Equivalent cannot widen a rule into these groups: the API
// server's equivalent resources are those sharing storage (e.g.
// extensions and apps deployments), and no other group serves these
// groups' resources.
func checkSensitive(m *admissionregistrationv1.MatchResources) error {
	if m == nil {
		return nil
	}
	for i, r := range m.ResourceRules {
		for _, g := range r.APIGroups {
			if slices.Contains(SensitiveGroups, g) {
				return fmt.Errorf("spec.matchConstraints.resourceRules[%d].apiGroups: %q: declared policies may not match resources of %s by default (%s lifts this; docs/security.md)",
					i, g, strings.Join(SensitiveGroups, ", "), SensitiveGroupsFlag)
			}
		}
		if !slices.Contains(r.APIGroups, "*") {
			continue
		}
		for _, g := range SensitiveGroups {
			if !excludedWhole(m.ExcludeResourceRules, g) {
				return fmt.Errorf("spec.matchConstraints.resourceRules[%d].apiGroups: \"*\" includes %q, which declared policies may not match by default: list the groups the policy is for, or exclude %s with excludeResourceRules (apiVersions [\"*\"], resources [\"*/*\"], operations [\"*\"]), or set %s (docs/security.md)",
					i, g, strings.Join(SensitiveGroups, ", "), SensitiveGroupsFlag)
			}
		}
	}
	return nil
}

// excludedWhole reports whether one of rules excludes every request to
// group: all versions, resources with subresources, operations and
// scopes, for every object name.
func excludedWhole(rules []admissionregistrationv1.NamedRuleWithOperations, group string) bool {
	for _, r := range rules {
		if len(r.ResourceNames) > 0 {
			continue
		}
		if !slices.Contains(r.APIGroups, group) && !slices.Contains(r.APIGroups, "*") {
			continue
		}
		if !slices.Contains(r.APIVersions, "*") || !slices.Contains(r.Resources, "*/*") {
			continue
		}
		if r.Scope != nil && *r.Scope != admissionregistrationv1.AllScopes {
			continue
		}
		if allOperations(r.Operations) {
			return true
		}
	}
	return false
}

func allOperations(ops []admissionregistrationv1.OperationType) bool {
	if slices.Contains(ops, admissionregistrationv1.OperationAll) {
		return true
	}
	for _, op := range []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update, admissionregistrationv1.Delete, admissionregistrationv1.Connect} {
		if !slices.Contains(ops, op) {
			return false
		}
	}
	return true
}
