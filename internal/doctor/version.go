package doctor

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	utilversion "k8s.io/apimachinery/pkg/util/version"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
)

// readServerVersion reads the API server's /version through discovery
// (every authenticated user may: the default system:public-info-viewer
// binding). nil when the read fails: the version-aware checks then say
// they could not tell, rather than fail the run.
func readServerVersion(ctx context.Context, cs kubernetes.Interface) *version.Info {
	v, err := discovery.ToServerVersionInterfaceWithContext(cs.Discovery()).ServerVersionWithContext(ctx)
	if err != nil {
		return nil
	}
	return v
}

// serverMinor is the minor version of a Kubernetes 1.x API server: from
// gitVersion ("v1.37.1", "v1.36.3-gke.100", "v1.35.0+k3s1"), else from the
// major and minor fields ("1", "37+"). ok is false when v is nil or names
// no 1.x version (a development build reports v0.0.0).
func serverMinor(v *version.Info) (minor int, ok bool) {
	if v == nil {
		return 0, false
	}
	if pv, err := utilversion.ParseGeneric(v.GitVersion); err == nil && pv.Major() == 1 {
		return int(pv.Minor()), true
	}
	major, err1 := strconv.Atoi(strings.TrimSuffix(v.Major, "+"))
	m, err2 := strconv.Atoi(strings.TrimSuffix(v.Minor, "+"))
	if err1 != nil || err2 != nil || major != 1 {
		return 0, false
	}
	return m, true
}

// describeVersion names v for messages.
func describeVersion(v *version.Info) string {
	if v == nil {
		return "unknown"
	}
	if v.GitVersion != "" {
		return boundText(v.GitVersion, 64)
	}
	return boundText(v.Major+"."+v.Minor, 64)
}

// boundText cuts s to n bytes at a rune boundary (a server's version
// string and similar are set by whoever runs the server).
func boundText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n] + "…"
}

// gateState is a feature gate's default on a server version.
type gateState int

const (
	gateUnknown      gateState = iota // the version could not be read
	gateAbsent                        // the version predates the gate: the old behaviour holds
	gateOffByDefault                  // alpha: off unless the API server enables it
	gateOnByDefault                   // beta or later: on unless the API server disables it
)

// excludeVirtualGate is ExcludeAdmissionWebhookVirtualResources on v:
// beta and on by default from 1.37 (k8s.io/apiserver v0.37.1
// pkg/features/kube_features.go:400-402); absent from v0.35.4 and v0.36.3
// (neither kube_features.go declares it), so 1.35 and 1.36 call webhooks
// for the virtual resources.
func excludeVirtualGate(v *version.Info) gateState {
	m, ok := serverMinor(v)
	switch {
	case !ok:
		return gateUnknown
	case m >= 37:
		return gateOnByDefault
	default:
		return gateAbsent
	}
}

// staticAdmissionGate is ManifestBasedAdmissionControlConfig (KEP-5793) on
// v: alpha, off by default, in 1.36 (k8s.io/apiserver v0.36.3
// pkg/features/kube_features.go:439-441); beta, on by default, from 1.37
// (v0.37.1 kube_features.go:415-418); absent before.
func staticAdmissionGate(v *version.Info) gateState {
	m, ok := serverMinor(v)
	switch {
	case !ok:
		return gateUnknown
	case m >= 37:
		return gateOnByDefault
	case m == 36:
		return gateOffByDefault
	default:
		return gateAbsent
	}
}

// virtualResources are the authentication and authorization reviews
// ExcludeAdmissionWebhookVirtualResources takes away from admission
// webhooks: exactly the excluded list of kubernetes v1.37.1
// pkg/kubeapiserver/admission/exclusion/resources.go (the same in v1.35.4
// and v1.36.3, where only ValidatingAdmissionPolicy and
// MutatingAdmissionPolicy used it), handed to the webhook plugins by
// pkg/controlplane/apiserver/admission/initializer.go and applied in
// k8s.io/apiserver v0.37.1 pkg/admission/plugin/webhook/generic/webhook.go
// (isExcludedFromAllHooks) to static and API webhooks alike, whatever the
// subresource.
var virtualResources = []struct{ group, resource, kind string }{
	{"authentication.k8s.io", "selfsubjectreviews", "SelfSubjectReview"},
	{"authentication.k8s.io", "tokenreviews", "TokenReview"},
	{"authorization.k8s.io", "localsubjectaccessreviews", "LocalSubjectAccessReview"},
	{"authorization.k8s.io", "selfsubjectaccessreviews", "SelfSubjectAccessReview"},
	{"authorization.k8s.io", "selfsubjectrulesreviews", "SelfSubjectRulesReview"},
	{"authorization.k8s.io", "subjectaccessreviews", "SubjectAccessReview"},
}

func virtualGroupOf(resource string) (string, bool) {
	for _, v := range virtualResources {
		if v.resource == resource {
			return v.group, true
		}
	}
	return "", false
}

// virtualRules reads w's rules for virtual resources named by name (not
// through "*"): named lists them as "resource (group)"; only is true when
// every resource every rule names is one of them in its own group, so the
// webhook is never called at all once they are excluded; kept is the
// rules without them (nil when only).
func virtualRules(rules []admissionregistrationv1.RuleWithOperations) (named []string, only bool, kept []admissionregistrationv1.RuleWithOperations) {
	seen := map[string]bool{}
	only = len(rules) > 0
	for _, r := range rules {
		var rest []string
		for _, res := range r.Resources {
			base, _, _ := strings.Cut(res, "/")
			g, virtual := virtualGroupOf(base)
			if !virtual {
				rest = append(rest, res)
				only = false
				continue
			}
			exact := len(r.APIGroups) > 0
			for _, rg := range r.APIGroups {
				if rg == g || rg == "*" {
					if k := base + " (" + g + ")"; !seen[k] {
						seen[k] = true
						named = append(named, k)
					}
				}
				if rg != g {
					exact = false // another group's resource of that name is still matched
				}
			}
			if !exact {
				rest = append(rest, res)
				only = false
			}
		}
		if len(rest) > 0 {
			kr := r
			kr.Resources = rest
			kept = append(kept, kr)
		}
	}
	if len(named) == 0 {
		return nil, false, nil
	}
	if only {
		kept = nil
	}
	return named, only, kept
}

// checkVersionRules runs KD610: rules naming the virtual authentication
// and authorization resources, which API servers from 1.37 no longer send
// to webhooks.
func (r *run) checkVersionRules(w *Webhook) []Finding {
	named, only, kept := virtualRules(w.Rules)
	if len(named) == 0 {
		return nil
	}
	v := r.snap.ServerVersion
	list := strings.Join(named, ", ")
	switch excludeVirtualGate(v) {
	case gateAbsent:
		return nil // 1.35, 1.36: these requests reach the webhook
	case gateUnknown:
		return []Finding{{ID: IDVirtualResourceRule, Severity: SeverityInfo,
			What: fmt.Sprintf("The rules name %s. Whether the API server calls the webhook for these depends on its version, which doctor could not read.", list),
			Why:  "From Kubernetes 1.37 (ExcludeAdmissionWebhookVirtualResources, beta and on by default) the API server no longer calls admission webhooks for TokenReview, SubjectAccessReview and the other authentication and authorization reviews; 1.35 and 1.36 do.",
			Fix:  "kubectl version  # a server of 1.37 or later never calls this webhook for these; run doctor with a user allowed to read /version",
		}}
	}
	f := Finding{ID: IDVirtualResourceRule, Severity: SeverityInfo,
		Why: fmt.Sprintf("API server %s has ExcludeAdmissionWebhookVirtualResources on by default (beta from 1.37, k8s.io/apiserver v0.37.1 pkg/features/kube_features.go): admission webhooks are no longer called for TokenReview, SubjectAccessReview, LocalSubjectAccessReview, SelfSubjectAccessReview, SelfSubjectRulesReview and SelfSubjectReview (kubernetes pkg/kubeapiserver/admission/exclusion/resources.go), as ValidatingAdmissionPolicy already excluded them, so that admission cannot lock the cluster out of its own authentication and authorization. Whatever the webhook did for these requests (audit, deny) no longer happens, unless the API server runs with --feature-gates=ExcludeAdmissionWebhookVirtualResources=false.", describeVersion(v)),
	}
	if only {
		f.What = fmt.Sprintf("The rules select only %s, which API server %s never sends to admission webhooks: the webhook is never called.", list, describeVersion(v))
		f.Fix = jsonPatchCommand(w, []map[string]any{{"op": "remove", "path": fmt.Sprintf("/webhooks/%d", w.Index)}}) +
			"  # after moving what it enforced to the authorizer or the audit policy; it no longer runs either way"
		return []Finding{f}
	}
	f.What = fmt.Sprintf("The rules name %s, which API server %s never sends to admission webhooks: the webhook is never called for these.", list, describeVersion(v))
	if len(kept) == len(w.Rules) && rulesEqual(kept, w.Rules) {
		f.Fix = "" // named only through apiGroups "*": the rule still selects other groups' resources of that name
	} else {
		f.Fix = jsonPatchCommand(w, []map[string]any{{"op": "replace", "path": fmt.Sprintf("/webhooks/%d/rules", w.Index), "value": kept}}) + "  # the same rules without them"
	}
	return []Finding{f}
}

func rulesEqual(a, b []admissionregistrationv1.RuleWithOperations) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if strings.Join(a[i].Resources, ",") != strings.Join(b[i].Resources, ",") {
			return false
		}
	}
	return true
}

// everyResourceExamples is what KD606 lists as examples of "every
// resource": the authentication and authorization reviews only where the
// server still sends them to webhooks.
func (r *run) everyResourceExamples() string {
	switch excludeVirtualGate(r.snap.ServerVersion) {
	case gateOnByDefault:
		return "events, leases, secrets, ...; not TokenReviews or SubjectAccessReviews, which API server " + describeVersion(r.snap.ServerVersion) + " no longer sends to webhooks"
	case gateAbsent:
		return "events, leases, tokenreviews, subjectaccessreviews, ..."
	default:
		return "events, leases, secrets, ...; before Kubernetes 1.37 also tokenreviews and subjectaccessreviews (doctor could not read the server's version)"
	}
}

// StaticSuffix ends the name of every object of manifest-based admission
// configuration (KEP-5793; k8s.io/apiserver v0.37.1
// pkg/admission/plugin/manifest/validation.go StaticConfigSuffix: the
// loader refuses static objects without it, and the API refuses to create
// objects with it while ManifestBasedAdmissionControlConfig is on,
// kubernetes v1.37.1 pkg/apis/admissionregistration/validation/static_suffix.go).
// The webhooks inside a static configuration may have any name.
const StaticSuffix = ".static.k8s.io"

// isStaticName reports whether name has StaticSuffix.
func isStaticName(name string) bool { return strings.HasSuffix(name, StaticSuffix) }

// staticWhere says where static admission configuration lives and how it
// is reloaded (KEP-5793 and k8s.io/apiserver v0.37.1).
const staticWhere = "Manifest-based (static) admission configuration is read by each kube-apiserver from the directory named by staticManifestsDir in the AdmissionConfiguration file of its --admission-control-config-file, one directory per plugin (ValidatingAdmissionWebhook, MutatingAdmissionWebhook, ValidatingAdmissionPolicy, MutatingAdmissionPolicy); it is evaluated before the API's, cannot be listed, changed or deleted through the API, and each API server has its own copy. Static webhooks call clientConfig.url only (no Service). The directory is re-read on change (fsnotify, else every minute, pkg/admission/plugin/webhook/manifest/source/source.go); an invalid new version is refused and the previous one kept (apiserver_manifest_admission_config_controller_automatic_reloads_total{status=\"failure\"})."

// staticGateNote qualifies a static finding by the server version, ""
// when the feature is on by default; ok is false when the version
// predates the feature (the name is then just a name).
func staticGateNote(v *version.Info) (note string, ok bool) {
	switch staticAdmissionGate(v) {
	case gateAbsent:
		return "", false
	case gateOffByDefault:
		return fmt.Sprintf(" API server %s has it only if started with --feature-gates=ManifestBasedAdmissionControlConfig=true (alpha in 1.36); otherwise the object was deleted.", describeVersion(v)), true
	case gateUnknown:
		return " Doctor could not read the API server's version: from 1.37 (beta, on by default) and with the alpha gate in 1.36 this is where it lives; before 1.36 the object was deleted.", true
	}
	return "", true
}

// staticFix is how to find and change a static object by name.
func staticFix(name string) string {
	return fmt.Sprintf("On each control-plane node: grep admission-control-config-file /etc/kubernetes/manifests/kube-apiserver.yaml; grep staticManifestsDir <that file>; grep -rl %s <each staticManifestsDir>  # fix or remove the object there, atomically (write a new file, rename it over the old); every API server has its own copy",
		shellQuote(name))
}

// staticBindingFinding is KD004 for an API binding naming a policy with
// the static suffix, which it can never bind; ok is false on servers
// before 1.36 (then the policy is simply missing: KD901).
func staticBindingFinding(kind, name, policyKind, policyName string, v *version.Info) (Finding, bool) {
	note, ok := staticGateNote(v)
	if !ok || !isStaticName(policyName) {
		return Finding{}, false
	}
	return Finding{ID: IDStaticAdmission, Severity: SeverityWarning,
		What: fmt.Sprintf("%s %s binds %s %q, a name reserved for manifest-based admission configuration (KEP-5793): a binding from the API never binds a static policy, so this one enforces nothing.%s", kind, name, policyKind, policyName, note),
		Why:  "The API server pairs bindings with policies within one source: API bindings with API policies (k8s.io/apiserver v0.37.1 pkg/admission/plugin/policy/generic/policy_source.go, by spec.policyName), static bindings with static policies of the same staticManifestsDir (policy/manifest/loader/loader.go); composite_policy_source.go only lists the two side by side. A policy of that name cannot be created through the API either. " + staticWhere,
		Fix:  fmt.Sprintf("Put a %s named <name>%s next to the policy in that plugin's staticManifestsDir, then: kubectl delete %s %s", kind, StaticSuffix, strings.ToLower(kind), name),
	}, true
}
