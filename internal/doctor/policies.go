package doctor

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/client-go/kubernetes"
)

// PolicySet is the in-cluster admission policies (admissionregistration.k8s.io/v1
// ValidatingAdmissionPolicy, MutatingAdmissionPolicy and their bindings)
// and what doctor found out about the kinds and objects their params name.
type PolicySet struct {
	Validating        []admissionregistrationv1.ValidatingAdmissionPolicy
	ValidatingBinding []admissionregistrationv1.ValidatingAdmissionPolicyBinding
	Mutating          []admissionregistrationv1.MutatingAdmissionPolicy
	MutatingBinding   []admissionregistrationv1.MutatingAdmissionPolicyBinding
	// ParamKinds maps "apiVersion/Kind" of every paramKind to how the API
	// server serves it; absent when discovery could not be asked.
	ParamKinds map[string]ParamKindInfo
	// Params maps "apiVersion/Kind/namespace/name" of every param a
	// binding names to whether it exists; absent when not checked.
	Params map[string]bool
	Gaps   []AccessGap
}

// ParamKindInfo is what discovery says about a paramKind.
type ParamKindInfo struct {
	// Served is false when the API server does not serve the kind (its
	// CRD is missing or not established).
	Served     bool
	Resource   string // plural resource name
	Namespaced bool
	// CRD is true for kinds outside the built-in API groups (served by a
	// CustomResourceDefinition).
	CRD bool
}

// PolicyReport holds the findings of one policy or binding.
type PolicyReport struct {
	// Kind is ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
	// MutatingAdmissionPolicy or MutatingAdmissionPolicyBinding.
	Kind string `json:"kind"`
	Name string `json:"name"`
	// Policy is, for a binding, the name of the policy it binds.
	Policy   string    `json:"policy,omitempty"`
	Findings []Finding `json:"findings"`
}

// policyRef is what the checks need of a policy of either kind.
type policyRef struct {
	kind, name    string
	paramKind     *admissionregistrationv1.ParamKind
	failurePolicy admissionregistrationv1.FailurePolicyType // defaulted to Fail
	warnings      []admissionregistrationv1.ExpressionWarning
}

// bindingRef is what the checks need of a binding of either kind.
type bindingRef struct {
	kind, name, policyKind, policyName string
	paramRef                           *admissionregistrationv1.ParamRef
}

func (p *PolicySet) policies() map[string]*policyRef {
	out := map[string]*policyRef{}
	for _, v := range p.Validating {
		r := &policyRef{kind: "ValidatingAdmissionPolicy", name: v.Name, paramKind: v.Spec.ParamKind, failurePolicy: admissionregistrationv1.Fail}
		if v.Spec.FailurePolicy != nil {
			r.failurePolicy = *v.Spec.FailurePolicy
		}
		if v.Status.TypeChecking != nil {
			r.warnings = v.Status.TypeChecking.ExpressionWarnings
		}
		out[r.kind+"/"+r.name] = r
	}
	for _, m := range p.Mutating {
		r := &policyRef{kind: "MutatingAdmissionPolicy", name: m.Name, paramKind: m.Spec.ParamKind, failurePolicy: admissionregistrationv1.Fail}
		if m.Spec.FailurePolicy != nil {
			r.failurePolicy = *m.Spec.FailurePolicy
		}
		out[r.kind+"/"+r.name] = r
	}
	return out
}

func (p *PolicySet) bindings() []bindingRef {
	var out []bindingRef
	for _, b := range p.ValidatingBinding {
		out = append(out, bindingRef{kind: "ValidatingAdmissionPolicyBinding", name: b.Name, policyKind: "ValidatingAdmissionPolicy", policyName: b.Spec.PolicyName, paramRef: b.Spec.ParamRef})
	}
	for _, b := range p.MutatingBinding {
		out = append(out, bindingRef{kind: "MutatingAdmissionPolicyBinding", name: b.Name, policyKind: "MutatingAdmissionPolicy", policyName: b.Spec.PolicyName, paramRef: b.Spec.ParamRef})
	}
	return out
}

// builtinGroup reports whether an API group is Kubernetes' own (core,
// unqualified such as "apps", or *.k8s.io), as opposed to one a
// CustomResourceDefinition serves. Groups a CRD may claim under k8s.io
// need an api-approved annotation, so they are rare.
func builtinGroup(group string) bool {
	return group == "" || !strings.Contains(group, ".") || strings.HasSuffix(group, ".k8s.io")
}

func paramKindKey(pk *admissionregistrationv1.ParamKind) string { return pk.APIVersion + "/" + pk.Kind }

func paramKey(pk *admissionregistrationv1.ParamKind, ns, name string) string {
	return paramKindKey(pk) + "/" + ns + "/" + name
}

// loadPolicies lists the policies and bindings, asks discovery about each
// paramKind and reads each param a binding names by namespace and name.
// Policy APIs the API server does not serve (e.g. MutatingAdmissionPolicy
// off on 1.35) and refused reads become gaps.
func loadPolicies(ctx context.Context, cs kubernetes.Interface) (*PolicySet, error) {
	p := &PolicySet{ParamKinds: map[string]ParamKindInfo{}, Params: map[string]bool{}}
	reg := cs.AdmissionregistrationV1()
	gap := func(res string, err error, lost string) error {
		if isAccessGap(err) || apierrors.IsNotFound(err) {
			p.Gaps = append(p.Gaps, newGap("list", res, "admissionregistration.k8s.io", "", err, lost))
			return nil
		}
		return fmt.Errorf("list %s: %w", res, err)
	}
	const lostPolicy = "whether in-cluster policies bind to missing policies or params (KD901, KD902), restart deadlocks (KD903) or type errors (KD904)"
	if l, err := reg.ValidatingAdmissionPolicies().List(ctx, metav1.ListOptions{}); err != nil {
		if err := gap("validatingadmissionpolicies", err, lostPolicy); err != nil {
			return nil, err
		}
	} else {
		p.Validating = l.Items
	}
	if l, err := reg.ValidatingAdmissionPolicyBindings().List(ctx, metav1.ListOptions{}); err != nil {
		if err := gap("validatingadmissionpolicybindings", err, lostPolicy); err != nil {
			return nil, err
		}
	} else {
		p.ValidatingBinding = l.Items
	}
	if l, err := reg.MutatingAdmissionPolicies().List(ctx, metav1.ListOptions{}); err != nil {
		if err := gap("mutatingadmissionpolicies", err, lostPolicy); err != nil {
			return nil, err
		}
	} else {
		p.Mutating = l.Items
	}
	if l, err := reg.MutatingAdmissionPolicyBindings().List(ctx, metav1.ListOptions{}); err != nil {
		if err := gap("mutatingadmissionpolicybindings", err, lostPolicy); err != nil {
			return nil, err
		}
	} else {
		p.MutatingBinding = l.Items
	}

	pols := p.policies()
	for _, k := range slices.Sorted(maps.Keys(pols)) {
		pk := pols[k].paramKind
		if pk == nil {
			continue
		}
		if _, done := p.ParamKinds[paramKindKey(pk)]; done {
			continue
		}
		info, err := discoverKind(cs, pk)
		if err != nil {
			p.Gaps = append(p.Gaps, AccessGap{Verb: "get", Resource: "discovery " + pk.APIVersion, Reason: "failed: " + trimErr(err),
				Lost: "whether paramKind " + pk.Kind + " is served (KD902, KD903)"})
			continue
		}
		p.ParamKinds[paramKindKey(pk)] = info
	}
	for _, b := range p.bindings() {
		pol := pols[b.policyKind+"/"+b.policyName]
		if pol == nil || pol.paramKind == nil || b.paramRef == nil || b.paramRef.Name == "" {
			continue
		}
		info, ok := p.ParamKinds[paramKindKey(pol.paramKind)]
		if !ok || !info.Served {
			continue
		}
		ns := b.paramRef.Namespace
		if info.Namespaced && ns == "" {
			continue // looked up in each request's namespace: nothing to check once
		}
		key := paramKey(pol.paramKind, ns, b.paramRef.Name)
		if _, done := p.Params[key]; done {
			continue
		}
		exists, err := paramExists(ctx, cs, pol.paramKind, info, ns, b.paramRef.Name)
		switch {
		case isAccessGap(err):
			p.Gaps = append(p.Gaps, newGap("get", info.Resource, groupOf(pol.paramKind), ns, err, "whether param "+b.paramRef.Name+" of binding "+b.name+" exists (KD902)"))
		case err != nil:
			return nil, fmt.Errorf("get param %s of binding %s: %w", b.paramRef.Name, b.name, err)
		default:
			p.Params[key] = exists
		}
	}
	return p, nil
}

func groupOf(pk *admissionregistrationv1.ParamKind) string {
	gv, err := schema.ParseGroupVersion(pk.APIVersion)
	if err != nil {
		return ""
	}
	return gv.Group
}

func trimErr(err error) string {
	s := err.Error()
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return s
}

// discoverKind asks discovery how apiVersion/kind is served.
func discoverKind(cs kubernetes.Interface, pk *admissionregistrationv1.ParamKind) (ParamKindInfo, error) {
	gv, err := schema.ParseGroupVersion(pk.APIVersion)
	if err != nil {
		return ParamKindInfo{}, fmt.Errorf("paramKind apiVersion %q: %w", pk.APIVersion, err)
	}
	info := ParamKindInfo{CRD: !builtinGroup(gv.Group)}
	rl, err := cs.Discovery().ServerResourcesForGroupVersion(pk.APIVersion)
	if apierrors.IsNotFound(err) {
		return info, nil
	}
	if err != nil {
		return info, err
	}
	for _, r := range rl.APIResources {
		if r.Kind == pk.Kind && !strings.Contains(r.Name, "/") {
			info.Served, info.Resource, info.Namespaced = true, r.Name, r.Namespaced
			return info, nil
		}
	}
	return info, nil
}

// paramExists gets one param object (ConfigMaps and Secrets through the
// typed client, anything else through the REST client as metadata).
func paramExists(ctx context.Context, cs kubernetes.Interface, pk *admissionregistrationv1.ParamKind, info ParamKindInfo, ns, name string) (bool, error) {
	var err error
	switch {
	case pk.APIVersion == "v1" && pk.Kind == "ConfigMap":
		_, err = cs.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
	case pk.APIVersion == "v1" && pk.Kind == "Secret":
		_, err = cs.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
	default:
		rc := cs.Discovery().RESTClient()
		if rc == nil {
			return false, fmt.Errorf("no REST client to read %s", pk.Kind)
		}
		path := "/apis/" + pk.APIVersion
		if pk.APIVersion == "v1" {
			path = "/api/v1"
		}
		if info.Namespaced {
			path += "/namespaces/" + ns
		}
		path += "/" + info.Resource + "/" + name
		err = rc.Get().AbsPath(path).SetHeader("Accept", "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json").Do(ctx).Error()
	}
	switch {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, err
	}
	return true, nil
}

// checkPolicies runs the KD9xx checks over the snapshot's policies; v is
// the API server's version (a binding naming a static policy is KD004
// from 1.36 on, see staticBindingFinding).
func checkPolicies(p *PolicySet, v *version.Info) []PolicyReport {
	if p == nil {
		return nil
	}
	pols := p.policies()
	byKey := map[string]*PolicyReport{}
	var order []string
	bound := map[string]string{}
	for _, b := range p.bindings() {
		bound[b.kind+"/"+b.name] = b.policyName
	}
	add := func(kind, name string, f Finding) {
		k := kind + "/" + name
		if byKey[k] == nil {
			byKey[k] = &PolicyReport{Kind: kind, Name: name, Policy: bound[k]}
			order = append(order, k)
		}
		byKey[k].Findings = append(byKey[k].Findings, f)
	}
	for _, k := range slices.Sorted(maps.Keys(pols)) {
		pol := pols[k]
		if pol.paramKind != nil && pol.failurePolicy == admissionregistrationv1.Fail {
			info, known := p.ParamKinds[paramKindKey(pol.paramKind)]
			if !known || info.CRD {
				add(pol.kind, pol.name, Finding{ID: IDPolicyParamKindFail, Severity: SeverityWarning,
					What: fmt.Sprintf("%s %s has failurePolicy Fail (the default) and paramKind %s %s, a custom resource.", pol.kind, pol.name, pol.paramKind.APIVersion, pol.paramKind.Kind),
					Why:  "After an API server restart the policy's params can only be read once the CustomResourceDefinition is served again and its informer has synced; until then every request the policy matches fails with \"failed to configure policy: failed to find resource referenced by paramKind\" (as kube-apiserver v1.37.1 answers while the kind is not served) or \"paramKind kind ... not yet synced to use for admission\" (k8s.io/apiserver v0.37.1 pkg/admission/plugin/policy/generic/policy_dispatcher.go:319). If it matches what the control plane needs to recover (pods, leases, the CRD's own controller), the cluster cannot come back: the deadlock of open-policy-agent/gatekeeper #4530.",
					Fix:  policyFailurePolicyFix(pol),
				})
			}
		}
		if len(pol.warnings) > 0 {
			var ws []string
			for _, w := range pol.warnings {
				ws = append(ws, w.FieldRef+": "+w.Warning)
			}
			sort.Strings(ws)
			add(pol.kind, pol.name, Finding{ID: IDPolicyTypeCheck, Severity: SeverityWarning,
				What: fmt.Sprintf("%s %s: the API server's type checking reports %d problem(s) (status.typeChecking): %s", pol.kind, pol.name, len(ws), strings.Join(ws, "; ")),
				Why:  "An expression that fails type checking errors when evaluated: with failurePolicy Fail the matched requests are rejected, with Ignore the validation is silently skipped.",
				Fix:  fmt.Sprintf("kubectl get %s %s -o jsonpath='{.status.typeChecking}'  # fix the expressions it names", strings.ToLower(pol.kind), pol.name),
			})
		}
	}
	for _, b := range p.bindings() {
		pol := pols[b.policyKind+"/"+b.policyName]
		if pol == nil {
			if f, ok := staticBindingFinding(b.kind, b.name, b.policyKind, b.policyName, v); ok {
				add(b.kind, b.name, f) // KD004: a static policy's name, which an API binding never binds
				continue
			}
			add(b.kind, b.name, Finding{ID: IDPolicyBindingMissing, Severity: SeverityWarning,
				What: fmt.Sprintf("%s %s binds %s %q, which does not exist.", b.kind, b.name, b.policyKind, b.policyName),
				Why:  "The API server ignores a binding without its policy: whatever the binding was meant to enforce is not enforced (and the policy, once created, takes effect at once).",
				Fix:  fmt.Sprintf("Create %s %s, or delete the binding: kubectl delete %s %s", b.policyKind, b.policyName, strings.ToLower(b.kind), b.name),
			})
			continue
		}
		if f, ok := bindingParamFinding(p, pol, b); ok {
			add(b.kind, b.name, f)
		}
	}
	out := make([]PolicyReport, 0, len(order))
	for _, k := range order {
		out = append(out, *byKey[k])
	}
	return out
}

// bindingParamFinding is KD902 for a binding whose params cannot be found.
func bindingParamFinding(p *PolicySet, pol *policyRef, b bindingRef) (Finding, bool) {
	if pol.paramKind == nil {
		return Finding{}, false
	}
	failing := fmt.Sprintf("with failurePolicy %s the API server rejects every request the binding matches", pol.failurePolicy)
	if pol.failurePolicy == admissionregistrationv1.Ignore {
		failing = "with failurePolicy Ignore the policy is silently not applied to the requests the binding matches"
	}
	sev := SeverityError
	if pol.failurePolicy == admissionregistrationv1.Ignore {
		sev = SeverityWarning
	}
	if b.paramRef == nil {
		return Finding{ID: IDPolicyParamMissing, Severity: sev,
			What: fmt.Sprintf("%s %s has no paramRef, but %s %s has paramKind %s %s.", b.kind, b.name, pol.kind, pol.name, pol.paramKind.APIVersion, pol.paramKind.Kind),
			Why:  "The API server treats it as a configuration error; " + failing + ".",
			Fix:  fmt.Sprintf("Set spec.paramRef (name or selector, and parameterNotFoundAction): kubectl edit %s %s", strings.ToLower(b.kind), b.name),
		}, true
	}
	info, known := p.ParamKinds[paramKindKey(pol.paramKind)]
	if known && !info.Served {
		return Finding{ID: IDPolicyParamMissing, Severity: sev,
			What: fmt.Sprintf("%s %s's params are of kind %s %s, which the API server does not serve (its CustomResourceDefinition is missing?).", b.kind, b.name, pol.paramKind.APIVersion, pol.paramKind.Kind),
			Why:  "The API server cannot read the params (\"failed to configure policy: failed to find resource referenced by paramKind\"), a configuration error; " + failing + ".",
			Fix:  fmt.Sprintf("Install the CustomResourceDefinition for %s, or delete the binding: kubectl delete %s %s", pol.paramKind.Kind, strings.ToLower(b.kind), b.name),
		}, true
	}
	if b.paramRef.Name == "" {
		return Finding{}, false
	}
	exists, checked := p.Params[paramKey(pol.paramKind, b.paramRef.Namespace, b.paramRef.Name)]
	if !checked || exists {
		return Finding{}, false
	}
	where := b.paramRef.Name
	if b.paramRef.Namespace != "" {
		where = b.paramRef.Namespace + "/" + b.paramRef.Name
	}
	deny := b.paramRef.ParameterNotFoundAction != nil && *b.paramRef.ParameterNotFoundAction == admissionregistrationv1.DenyAction
	f := Finding{ID: IDPolicyParamMissing, Severity: SeverityWarning,
		What: fmt.Sprintf("%s %s names param %s %s, which does not exist.", b.kind, b.name, pol.paramKind.Kind, where),
		Why:  "parameterNotFoundAction is Allow: the policy is silently not applied to the requests the binding matches.",
		Fix:  fmt.Sprintf("Create %s %s, or point spec.paramRef at an existing one: kubectl edit %s %s", pol.paramKind.Kind, where, strings.ToLower(b.kind), b.name),
	}
	if deny {
		f.Severity = SeverityError
		f.Why = "parameterNotFoundAction is Deny: the API server answers every request the binding matches with \"no params found for policy binding with `Deny` parameterNotFoundAction\" (policy_dispatcher.go:400) and " + failing + "."
	}
	return f, true
}

func policyFailurePolicyFix(pol *policyRef) string {
	return fmt.Sprintf("kubectl patch %s %s --type=merge -p '{\"spec\":{\"failurePolicy\":\"Ignore\"}}'  # or exclude kube-system, the CRD's controller namespace and leases in spec.matchConstraints", strings.ToLower(pol.kind), pol.name)
}
