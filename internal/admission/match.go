package admission

import (
	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	apiserveradmission "k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/predicates/rules"
)

// This file is kadmit's one rule matcher, used to serve (Hook.Matches), by
// `kadmit review` (through Webhook.Review) and by `kadmit doctor`. It is the
// API server's own: k8s.io/apiserver/pkg/admission/plugin/webhook/
// predicates/rules.Matcher (v0.37.1), so kadmit calls a hook for exactly the
// requests the API server would send it, wildcards included: "*" is every
// main resource but no subresource, "*/*" everything, "pods/*" pods and
// every pods subresource, "*/status" the status subresource of anything; an
// operation, group or version "*" matches any; scope Namespaced or Cluster
// by whether the request has a namespace (a Namespace object is
// cluster-scoped).

// RuleAttributes describes req as rule matching reads it: its resource,
// subresource, operation and namespace.
func RuleAttributes(req *Request) apiserveradmission.Attributes {
	r := req.Resource
	return NewRuleAttributes(schema.GroupVersionResource{Group: r.Group, Version: r.Version, Resource: r.Resource},
		req.SubResource, req.Operation, req.Namespace)
}

// NewRuleAttributes describes a request for MatchRules: resource is the
// lower-case plural ("pods"), subresource "" or e.g. "status", namespace ""
// for a cluster-scoped object (for a namespaced one, its namespace, or any
// non-empty name when only the scope matters).
func NewRuleAttributes(resource schema.GroupVersionResource, subresource string, op admissionv1.Operation, namespace string) apiserveradmission.Attributes {
	return apiserveradmission.NewAttributesRecord(nil, nil, schema.GroupVersionKind{}, namespace, "", resource, subresource,
		apiserveradmission.Operation(op), nil, false, nil)
}

// MatchRules reports whether any of rules selects the request attrs
// describes, with the API server's rules.Matcher.
func MatchRules(rs []admissionregistrationv1.RuleWithOperations, attrs apiserveradmission.Attributes) bool {
	for _, r := range rs {
		m := rules.Matcher{Rule: r, Attr: attrs}
		if m.Matches() {
			return true
		}
	}
	return false
}
