// Package doctor diagnoses every admission webhook in a cluster from the API
// server's point of view: where the API server would send a call (Service,
// port, EndpointSlices), which pods answer it, whether their certificates
// pass the checks the API server makes, whether a webhook blocks its own
// restart, and, on request, what the API server itself gets when it calls the
// webhook (a server-side dry-run). It works on any webhook, not only kadmit's.
//
// Each problem is a Finding with a stable check ID (KDnnn, the hundreds digit
// naming the check family, see Checks), a severity, and a fix that is an
// exact kubectl command or manifest change.
package doctor

import (
	"fmt"
	"sort"
)

// Severity of a finding. Error means admission is broken now or the webhook
// cannot recover by itself; warning is a risk; info explains what doctor saw
// or could not see.
type Severity string

const (
	SeverityError   Severity = "error"
	SeverityWarning Severity = "warning"
	SeverityInfo    Severity = "info"
)

func (s Severity) rank() int {
	switch s {
	case SeverityError:
		return 0
	case SeverityWarning:
		return 1
	default:
		return 2
	}
}

// Check IDs. The hundreds digit is the check family: 0 doctor's own view
// (what it could not read, which finding explains an error message), 1 Service and port,
// 2 endpoints, 3 selector collision, 4 certificate, 5 self-interception and
// bootstrap deadlocks, 6 settings, 7 live probe, 8 orphans, 9 in-cluster
// admission policies (ValidatingAdmissionPolicy, MutatingAdmissionPolicy). IDs never change
// meaning; new conditions get new IDs.
const (
	IDAccessGap             = "KD001"
	IDFromError             = "KD002"
	IDNotChecked            = "KD003"
	IDStaticAdmission       = "KD004"
	IDServiceMissing        = "KD101"
	IDServicePortMissing    = "KD102"
	IDTargetPortMismatch    = "KD103"
	IDURLClusterDNS         = "KD104"
	IDURLLocalhost          = "KD105"
	IDServiceType           = "KD106"
	IDNetworkPolicyBlocks   = "KD107"
	IDNoReadyEndpoints      = "KD201"
	IDEndpointRefused       = "KD202"
	IDNoDrainOnTermination  = "KD203"
	IDSelectorCollision     = "KD301"
	IDCABundleMissing       = "KD401"
	IDCABundleUnparsable    = "KD402"
	IDCABundleExpired       = "KD403"
	IDUnknownAuthority      = "KD404"
	IDSANMismatch           = "KD405"
	IDServingCertExpiry     = "KD406"
	IDWeakKey               = "KD407"
	IDSHA1Signature         = "KD408"
	IDHandshakeFailed       = "KD409"
	IDEndpointUnreachable   = "KD410"
	IDSelfInterception      = "KD501"
	IDInterceptsKubeSystem  = "KD502"
	IDInterceptsNodes       = "KD503"
	IDInterceptsNodeLeases  = "KD504"
	IDInterceptsOtherHook   = "KD505"
	IDDependencyDeadlock    = "KD506"
	IDTimeoutTooLong        = "KD601"
	IDSideEffectsDryRun     = "KD602"
	IDReviewVersions        = "KD603"
	IDSingleReplica         = "KD604"
	IDNoPodDisruptionBudget = "KD605"
	IDWildcardResources     = "KD606"
	IDMatchConditionError   = "KD607"
	IDTimeoutBudget         = "KD608"
	IDFieldManagerFight     = "KD609"
	IDVirtualResourceRule   = "KD610"
	IDProbeAdmitted         = "KD700"
	IDProbeDenied           = "KD701"
	IDProbeRefused          = "KD702"
	IDProbeUnknownAuthority = "KD703"
	IDProbeSANMismatch      = "KD704"
	IDProbeTimeout          = "KD705"
	IDProbeBadResponse      = "KD706"
	IDProbeSkipped          = "KD707"
	IDProbeNoEndpoints      = "KD708"
	IDProbeCertExpired      = "KD709"
	IDProbeInconclusive     = "KD710"
	IDOrphan                = "KD801"
	IDPolicyBindingMissing  = "KD901"
	IDPolicyParamMissing    = "KD902"
	IDPolicyParamKindFail   = "KD903"
	IDPolicyTypeCheck       = "KD904"
)

// Finding is one problem (or observation) about one webhook.
type Finding struct {
	// ID is the stable check ID, e.g. "KD301".
	ID       string   `json:"id"`
	Severity Severity `json:"severity"`
	// What is wrong, in one or two sentences with the concrete names.
	What string `json:"what"`
	// Why it breaks (or would break) admission.
	Why string `json:"why"`
	// Fix is an exact kubectl command or manifest change; may be empty for
	// info findings.
	Fix string `json:"fix,omitempty"`
	// Endpoint is the "ip:port" a per-endpoint finding is about.
	Endpoint string `json:"endpoint,omitempty"`
	// Lead marks the finding that explains the error message given to
	// --from-error; it is listed first.
	Lead bool `json:"lead,omitempty"`
}

// WebhookReport holds the findings of one webhook of one configuration.
type WebhookReport struct {
	// Webhook is the webhook's name, e.g. "vleaderworkerset.kb.io".
	Webhook string `json:"webhook"`
	// Configuration is the name of the MutatingWebhookConfiguration or
	// ValidatingWebhookConfiguration holding it; Kind says which.
	Configuration string `json:"configuration"`
	Kind          string `json:"kind"`
	FailurePolicy string `json:"failurePolicy"`
	// Target is where the API server sends calls: "service ns/name:port/path"
	// or the URL.
	Target   string    `json:"target"`
	Findings []Finding `json:"findings"`
}

// Status is the worst severity among the findings, or "ok".
func (w WebhookReport) Status() string {
	worst := "ok"
	for _, f := range w.Findings {
		switch {
		case f.Severity == SeverityError:
			return string(SeverityError)
		case f.Severity == SeverityWarning:
			worst = string(SeverityWarning)
		}
	}
	return worst
}

// Count returns how many findings have severity s.
func (w WebhookReport) Count(s Severity) int {
	n := 0
	for _, f := range w.Findings {
		if f.Severity == s {
			n++
		}
	}
	return n
}

// Has reports whether a finding with id is present.
func (w WebhookReport) Has(id string) bool { return len(w.ByID(id)) > 0 }

// ByID returns the findings with id, in report order.
func (w WebhookReport) ByID(id string) []Finding {
	var out []Finding
	for _, f := range w.Findings {
		if f.ID == id {
			out = append(out, f)
		}
	}
	return out
}

// Report is doctor's whole answer.
type Report struct {
	Webhooks []WebhookReport `json:"webhooks"`
	// Policies holds the findings of in-cluster admission policies and
	// their bindings (KD9xx).
	Policies []PolicyReport `json:"policies,omitempty"`
	// Gaps are every read doctor was refused, with what it could not tell;
	// the affected webhooks also carry them as KD001 findings.
	Gaps []AccessGap `json:"accessGaps,omitempty"`
	// FromError is the match for --from-error, nil otherwise.
	FromError *ErrorMatch `json:"fromError,omitempty"`
	// Errors, Warnings and Infos count findings over all webhooks.
	Errors   int `json:"errors"`
	Warnings int `json:"warnings"`
	Infos    int `json:"infos"`
}

// Webhook returns the report of the webhook named name in configuration
// config (either kind), or nil.
func (r *Report) Webhook(config, name string) *WebhookReport {
	for i := range r.Webhooks {
		if r.Webhooks[i].Configuration == config && r.Webhooks[i].Webhook == name {
			return &r.Webhooks[i]
		}
	}
	return nil
}

// finish sorts findings (errors first, then by ID, keeping the emit order
// within an ID) and fills the counters.
func (r *Report) finish() {
	r.Errors, r.Warnings, r.Infos = 0, 0, 0
	count := func(fs []Finding) []Finding {
		sortFindings(fs)
		for _, f := range fs {
			switch f.Severity {
			case SeverityError:
				r.Errors++
			case SeverityWarning:
				r.Warnings++
			default:
				r.Infos++
			}
		}
		if fs == nil {
			return []Finding{}
		}
		return fs
	}
	for i := range r.Webhooks {
		r.Webhooks[i].Findings = count(r.Webhooks[i].Findings)
	}
	for i := range r.Policies {
		r.Policies[i].Findings = count(r.Policies[i].Findings)
	}
}

// sortFindings orders errors first, then by ID, keeping the emit order
// within an ID. KD002 (what --from-error's message is) comes first, then
// the finding marked Lead (the one that explains it).
func sortFindings(fs []Finding) {
	sort.SliceStable(fs, func(a, b int) bool {
		if (fs[a].ID == IDFromError) != (fs[b].ID == IDFromError) {
			return fs[a].ID == IDFromError
		}
		if fs[a].Lead != fs[b].Lead {
			return fs[a].Lead
		}
		if fs[a].Severity.rank() != fs[b].Severity.rank() {
			return fs[a].Severity.rank() < fs[b].Severity.rank()
		}
		return fs[a].ID < fs[b].ID
	})
}

// Checks lists every check ID with its title, for documentation and the
// --list-checks output.
var Checks = []struct{ ID, Title string }{
	{IDAccessGap, "doctor could not read an object (forbidden or not served): what it cannot tell"},
	{IDFromError, "the API server's error message: which webhook, and which finding explains it"},
	{IDNotChecked, "doctor's own bound stopped a check: the run's --timeout, or --max-handshakes endpoints already dialed"},
	{IDStaticAdmission, "a webhook or policy named *.static.k8s.io comes from the API server's manifest-based admission configuration, invisible to the API"},
	{IDServiceMissing, "clientConfig.service names a Service that does not exist"},
	{IDServicePortMissing, "the Service does not expose clientConfig.service.port"},
	{IDTargetPortMismatch, "the Service's targetPort does not match the pods or the EndpointSlices"},
	{IDURLClusterDNS, "clientConfig.url points at in-cluster DNS the API server cannot resolve"},
	{IDURLLocalhost, "clientConfig.url points at localhost"},
	{IDServiceType, "the Service's type cannot be called (ExternalName)"},
	{IDNetworkPolicyBlocks, "a NetworkPolicy selecting the webhook's pods does not admit the API server on the target port"},
	{IDNoReadyEndpoints, "the Service has no ready EndpointSlice endpoint"},
	{IDEndpointRefused, "an endpoint refuses TCP connections (connection refused)"},
	{IDNoDrainOnTermination, "webhook pods stop serving before the API server stops calling them (no preStop delay, or a grace period shorter than it)"},
	{IDSelectorCollision, "the Service routes to pods of more than one workload"},
	{IDCABundleMissing, "caBundle is empty"},
	{IDCABundleUnparsable, "caBundle does not parse"},
	{IDCABundleExpired, "caBundle certificates are expired"},
	{IDUnknownAuthority, "serving certificate not signed by the caBundle (unknown authority)"},
	{IDSANMismatch, "serving certificate not valid for <svc>.<ns>.svc (SAN mismatch)"},
	{IDServingCertExpiry, "serving certificate expired or about to expire"},
	{IDWeakKey, "serving certificate has a weak key"},
	{IDSHA1Signature, "certificate signed with SHA-1"},
	{IDHandshakeFailed, "TLS handshake failed"},
	{IDEndpointUnreachable, "endpoint not reachable from where doctor runs"},
	{IDSelfInterception, "Fail webhook intercepts the pods that serve it (bootstrap deadlock)"},
	{IDInterceptsKubeSystem, "Fail webhook intercepts kube-system"},
	{IDInterceptsNodes, "Fail webhook intercepts nodes"},
	{IDInterceptsNodeLeases, "Fail webhook intercepts node leases in kube-node-lease"},
	{IDInterceptsOtherHook, "Fail webhook intercepts another webhook's pods (dependency or cycle)"},
	{IDDependencyDeadlock, "Fail webhook intercepts the pods its own recovery depends on: its certificate issuer, the CNI, cluster DNS"},
	{IDTimeoutTooLong, "timeoutSeconds above 10"},
	{IDSideEffectsDryRun, "sideEffects make dry-run requests fail"},
	{IDReviewVersions, "admissionReviewVersions lacks v1"},
	{IDSingleReplica, "Fail webhook backed by a single replica"},
	{IDNoPodDisruptionBudget, "Fail webhook without a PodDisruptionBudget"},
	{IDWildcardResources, "rules with * resources"},
	{IDMatchConditionError, "matchConditions that do not compile"},
	{IDTimeoutBudget, "the webhooks of one resource and operation can take longer together than the client waits"},
	{IDFieldManagerFight, "caBundle or failurePolicy written alternately by two field managers"},
	{IDVirtualResourceRule, "rules for virtual resources (TokenReview, SubjectAccessReview, ...) that this API server version never sends to webhooks"},
	{IDProbeAdmitted, "probe: admitted"},
	{IDProbeDenied, "probe: denied by the webhook's policy"},
	{IDProbeRefused, "probe: connection refused"},
	{IDProbeUnknownAuthority, "probe: x509 unknown authority"},
	{IDProbeSANMismatch, "probe: x509 SAN mismatch"},
	{IDProbeTimeout, "probe: timeout"},
	{IDProbeBadResponse, "probe: bad response"},
	{IDProbeSkipped, "probe: not possible for this webhook"},
	{IDProbeNoEndpoints, "probe: no endpoints available"},
	{IDProbeCertExpired, "probe: x509 certificate expired"},
	{IDProbeInconclusive, "probe: another webhook or the API server answered first"},
	{IDOrphan, "configuration's Service namespace no longer exists"},
	{IDPolicyBindingMissing, "admission policy binding names a policy that does not exist"},
	{IDPolicyParamMissing, "admission policy binding's params cannot be found (kind not served, param missing, no paramRef)"},
	{IDPolicyParamKindFail, "admission policy with failurePolicy Fail and a custom-resource paramKind (restart deadlock)"},
	{IDPolicyTypeCheck, "admission policy whose type checking reports problems"},
}

func (f Finding) String() string {
	return fmt.Sprintf("%s %s: %s", f.ID, f.Severity, f.What)
}
