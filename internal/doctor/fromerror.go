package doctor

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"k8s.io/apimachinery/pkg/version"
)

// MaxErrorMessage bounds what --from-error accepts: the API server's
// webhook errors are a few hundred bytes; a pasted event or kubectl output
// with several fits easily.
const MaxErrorMessage = 64 << 10

// ErrNoWebhookInMessage is returned when a message names no webhook or
// admission policy in any format the API server uses.
var ErrNoWebhookInMessage = errors.New("the message names no admission webhook or policy in a format the API server uses")

// ErrorMatch is what ParseError read from an API server message, and, after
// Diagnose, which webhook and finding explain it.
type ErrorMatch struct {
	// Webhook is the webhook name quoted in the message ("" for a policy).
	Webhook string `json:"webhook,omitempty"`
	// Policy and Binding are the admission policy and binding named in a
	// policy denial ("" for a webhook).
	Policy  string `json:"policy,omitempty"`
	Binding string `json:"binding,omitempty"`
	// PolicyKind is ValidatingAdmissionPolicy or MutatingAdmissionPolicy
	// when the message names the kind ("" for "policy '...'", the generic
	// dispatcher's format).
	PolicyKind string `json:"policyKind,omitempty"`
	// Format names the API server's message format:
	// "call failed" (failed calling webhook, k8s.io/apiserver
	// pkg/util/webhook/error.go:36), "denied" (webhook/errors/statuserror.go:30),
	// "dry run unsupported" (statuserror.go:54), "policy denied"
	// (policy/generic/policy_dispatcher.go:510,
	// policy/validating/dispatcher.go:305).
	Format string `json:"format"`
	// URL is the URL the API server posted to, when the message has it.
	URL string `json:"url,omitempty"`
	// Service is "namespace/name" parsed from URL's host <svc>.<ns>.svc.
	Service string `json:"service,omitempty"`
	// Cause is the class of the error ("connection refused", "x509 SAN
	// mismatch", ...) and Detail the text after the URL.
	Cause  string `json:"cause"`
	Detail string `json:"detail,omitempty"`
	// Explaining lists, best first, the check IDs whose finding explains
	// this cause.
	Explaining []string `json:"explaining"`
	// Matched lists the "<configuration>/<webhook>" the message matches.
	Matched []string `json:"matched,omitempty"`
	// Explained is the ID of the finding that explains the message, once
	// Diagnose found one; "" when none did.
	Explained string `json:"explained,omitempty"`
}

var (
	// Format strings of k8s.io/apiserver v0.37.1. Webhook names are
	// quoted with %q; the message may have been re-escaped once (copied
	// from JSON or an event), so \" is accepted too.
	reCallFailed = regexp.MustCompile(`failed calling webhook \\?"([^"\\]{1,253})\\?"(?:: (.*)|; no further details available)`)
	reDenied     = regexp.MustCompile(`admission webhook \\?"([^"\\]{1,253})\\?" denied the request(?:: (.*)| without explanation)`)
	reDryRun     = regexp.MustCompile(`admission webhook \\?"([^"\\]{1,253})\\?" does not support dry run`)
	rePolicy     = regexp.MustCompile(`(?:ValidatingAdmissionPolicy|MutatingAdmissionPolicy|policy) '([^']{1,253})'(?: with binding '([^']{1,253})')? denied request: (.*)`)
	rePolicyQ    = regexp.MustCompile(`policy \\?"([^"\\]{1,253})\\?" denied request: (.*)`)
	rePost       = regexp.MustCompile(`^failed to call webhook: (?:Post|POST) \\?"([^"\\]+)\\?": (.*)$`)
	reSvcHost    = regexp.MustCompile(`^([a-z0-9]([-a-z0-9]*[a-z0-9])?)\.([a-z0-9]([-a-z0-9]*[a-z0-9])?)\.svc(?:\.[a-z0-9.-]+)?$`)
)

// causes maps the tail of a call error to its class and the checks that
// explain it, best first. Order matters: the first pattern found wins.
var causes = []struct {
	substr []string
	class  string
	ids    []string
}{
	{[]string{"no endpoints available for service"}, "no endpoints", []string{IDNoReadyEndpoints, IDProbeNoEndpoints, IDTargetPortMismatch, IDSelfInterception}},
	{[]string{"connection refused"}, "connection refused", []string{IDEndpointRefused, IDNoReadyEndpoints, IDProbeRefused, IDTargetPortMismatch, IDSelfInterception}},
	// EHOSTUNREACH dialling a ClusterIP: kube-proxy's rules still send the
	// call to a pod that is gone (its rules lag the EndpointSlices, as
	// under load right after the last pod went), or something between
	// rejects it with ICMP host-unreachable (a NetworkPolicy or firewall
	// that rejects instead of dropping). Seen on the real cluster for
	// seed 004's self-interception instead of "connection refused".
	{[]string{"no route to host", "host is unreachable"}, "no route to host", []string{IDNoReadyEndpoints, IDSelfInterception, IDNetworkPolicyBlocks, IDEndpointRefused, IDProbeRefused}},
	{[]string{"not found"}, "service not found", []string{IDOrphan, IDServiceMissing}},
	{[]string{"no service port"}, "no service port", []string{IDServicePortMissing}},
	{[]string{"unsupported service type"}, "unsupported service type", []string{IDServiceType}},
	{[]string{"no such host", "server misbehaving"}, "DNS lookup failed", []string{IDURLClusterDNS}},
	{[]string{"certificate signed by unknown authority", "x509: certificate signed by unknown"}, "x509 unknown authority", []string{IDUnknownAuthority, IDCABundleMissing, IDCABundleUnparsable, IDProbeUnknownAuthority}},
	{[]string{"x509: certificate is valid for", "x509: certificate is not valid for any names"}, "x509 SAN mismatch", []string{IDSelectorCollision, IDSANMismatch, IDProbeSANMismatch}},
	{[]string{"legacy Common Name field"}, "x509 legacy Common Name", []string{IDSANMismatch, IDProbeSANMismatch}},
	{[]string{"certificate has expired or is not yet valid"}, "x509 expired", []string{IDServingCertExpiry, IDCABundleExpired, IDProbeCertExpired}},
	{[]string{"insecure algorithm", "SHA1"}, "x509 SHA-1 signature", []string{IDSHA1Signature}},
	{[]string{"context deadline exceeded", "Client.Timeout exceeded", "i/o timeout", "request canceled", "Timeout: request did not complete"}, "timeout", []string{IDProbeTimeout, IDTimeoutTooLong, IDNoReadyEndpoints}},
	{[]string{"server gave HTTP response to HTTPS client", "first record does not look like a TLS handshake", "tls:", "remote error"}, "TLS handshake failed", []string{IDHandshakeFailed, IDProbeBadResponse}},
	{[]string{"received invalid webhook response", "received undecodable patch", "unsupported patch type", "the server could not find the requested resource", "expected response.uid", "Webhook SideEffects is nil"}, "bad response", []string{IDProbeBadResponse, IDReviewVersions, IDSideEffectsDryRun}},
}

// ParseError reads an API server error message about an admission webhook
// or policy, in any of the formats listed on ErrorMatch.Format, with or
// without the prefixes kubectl and events add ("Error from server
// (InternalError): ...", "Internal error occurred: ", "Error creating: ").
// Only the first webhook or policy named is used (the API server returns
// the first failing webhook's error).
//
// Errors: the message is longer than MaxErrorMessage, or names no webhook
// or policy (ErrNoWebhookInMessage).
func ParseError(msg string) (*ErrorMatch, error) {
	if len(msg) > MaxErrorMessage {
		return nil, fmt.Errorf("error message of %d bytes: longer than %d bytes, not an API server message (pass only the error)", len(msg), MaxErrorMessage)
	}
	msg = strings.TrimSpace(msg)
	type hit struct {
		at int
		m  *ErrorMatch
	}
	var best *hit
	consider := func(at int, m *ErrorMatch) {
		if at >= 0 && (best == nil || at < best.at) {
			best = &hit{at, m}
		}
	}
	if loc := reCallFailed.FindStringSubmatchIndex(msg); loc != nil {
		name := msg[loc[2]:loc[3]]
		tail := ""
		if loc[4] >= 0 {
			tail = msg[loc[4]:loc[5]]
		}
		consider(loc[0], callFailed(name, tail))
	}
	if loc := reDenied.FindStringSubmatchIndex(msg); loc != nil {
		m := &ErrorMatch{Webhook: msg[loc[2]:loc[3]], Format: "denied", Cause: "denied by the webhook", Explaining: []string{IDProbeDenied}}
		if loc[4] >= 0 {
			m.Detail = msg[loc[4]:loc[5]]
		}
		consider(loc[0], m)
	}
	if loc := reDryRun.FindStringSubmatchIndex(msg); loc != nil {
		consider(loc[0], &ErrorMatch{Webhook: msg[loc[2]:loc[3]], Format: "dry run unsupported", Cause: "sideEffects forbid dry run", Explaining: []string{IDSideEffectsDryRun}})
	}
	if loc := rePolicy.FindStringSubmatchIndex(msg); loc != nil {
		m := &ErrorMatch{Policy: msg[loc[2]:loc[3]], Format: "policy denied", Detail: msg[loc[6]:loc[7]]}
		if loc[4] >= 0 {
			m.Binding = msg[loc[4]:loc[5]]
		}
		for _, k := range []string{"ValidatingAdmissionPolicy", "MutatingAdmissionPolicy"} {
			if strings.HasPrefix(msg[loc[0]:], k) {
				m.PolicyKind = k
			}
		}
		policyCause(m)
		consider(loc[0], m)
	}
	if loc := rePolicyQ.FindStringSubmatchIndex(msg); loc != nil {
		m := &ErrorMatch{Policy: msg[loc[2]:loc[3]], Format: "policy denied", Detail: msg[loc[4]:loc[5]]}
		policyCause(m)
		consider(loc[0], m)
	}
	if best == nil {
		return nil, ErrNoWebhookInMessage
	}
	return best.m, nil
}

// callFailed classifies the text after `failed calling webhook "NAME": `.
func callFailed(name, tail string) *ErrorMatch {
	m := &ErrorMatch{Webhook: name, Format: "call failed", Detail: tail}
	if p := rePost.FindStringSubmatch(tail); p != nil {
		m.URL, m.Detail = p[1], p[2]
		if host := hostOf(m.URL); host != "" {
			if h := reSvcHost.FindStringSubmatch(host); h != nil {
				m.Service = h[3] + "/" + h[1]
			}
		}
	}
	if tail == "" {
		m.Cause, m.Explaining = "no details", []string{IDProbeBadResponse}
		return m
	}
	for _, c := range causes {
		for _, s := range c.substr {
			if strings.Contains(m.Detail, s) {
				m.Cause, m.Explaining = c.class, c.ids
				return m
			}
		}
	}
	m.Cause, m.Explaining = "other call error", []string{IDHandshakeFailed, IDProbeBadResponse}
	return m
}

// policyCause classifies a policy denial: a configuration error names
// KD901-KD903; anything else is the policy's own decision.
func policyCause(m *ErrorMatch) {
	switch {
	// policy_dispatcher.go:292,319,401 and the policy source's "failed to
	// find resource referenced by paramKind" (CRD not served).
	case strings.Contains(m.Detail, "no params found"), strings.Contains(m.Detail, "paramKind"), strings.Contains(m.Detail, "failed to configure binding"):
		m.Cause, m.Explaining = "params not found", []string{IDPolicyParamMissing, IDPolicyParamKindFail}
	case strings.Contains(m.Detail, "failed to configure policy"):
		m.Cause, m.Explaining = "policy configuration error", []string{IDPolicyTypeCheck, IDPolicyParamKindFail}
	default:
		m.Cause, m.Explaining = "denied by the policy", nil
	}
}

func hostOf(u string) string {
	s := u
	if i := strings.Index(s, "://"); i >= 0 {
		s = s[i+3:]
	}
	if i := strings.IndexAny(s, "/?"); i >= 0 {
		s = s[:i]
	}
	if i := strings.LastIndex(s, ":"); i >= 0 && !strings.Contains(s[i:], "]") {
		s = s[:i]
	}
	return strings.ToLower(s)
}

// selectFor returns the "<configuration>/<webhook>" keys of the snapshot's
// webhooks the message names: by name, narrowed by the URL's Service (or
// URL) when several configurations have a webhook of that name.
func (m *ErrorMatch) selectFor(s *Snapshot) []string {
	var byName, byTarget []string
	for _, w := range s.Webhooks {
		if w.Name != m.Webhook {
			continue
		}
		key := w.Configuration + "/" + w.Name
		byName = append(byName, key)
		switch {
		case m.Service != "" && w.ServiceKey() == m.Service:
			byTarget = append(byTarget, key)
		case m.URL != "" && w.ClientConfig.URL != nil && strings.HasPrefix(m.URL, *w.ClientConfig.URL):
			byTarget = append(byTarget, key)
		}
	}
	if len(byName) > 1 && len(byTarget) > 0 {
		return byTarget
	}
	return byName
}

// explain marks, in each matched webhook's report, the finding that
// explains m (the first of m.Explaining present) as Lead, and puts a KD002
// finding first saying which finding matches and why. v is the API
// server's version: a policy the snapshot lacks whose name has
// StaticSuffix gets KD004 (staticPolicy).
func (m *ErrorMatch) explain(rep *Report, v *version.Info) {
	where := func(fs []Finding) int {
		for _, id := range m.Explaining {
			for i := range fs {
				// Info findings explain nothing, except a probe that saw
				// the same denial.
				if fs[i].ID == id && (fs[i].Severity != SeverityInfo || id == IDProbeDenied) {
					return i
				}
			}
		}
		return -1
	}
	lead := func(fs []Finding, subject string) []Finding {
		i := where(fs)
		f := Finding{ID: IDFromError, Severity: SeverityInfo, Lead: true}
		if j := selfInterception(fs, i); j >= 0 {
			// No pod answers (KD201) because the webhook rejects the
			// creation of its own pods (KD501): fixing the pods alone
			// cannot work, so the cause that prevents recovery leads.
			fs[j].Lead = true
			if m.Explained == "" {
				m.Explained = fs[j].ID
			}
			f.What = fmt.Sprintf("The message is the API server's %q error for %s (cause: %s); %s explains it, through %s.", m.Format, subject, m.Cause, fs[j].ID, fs[i].ID)
			f.Why = fmt.Sprintf("%s is what produces %q: %s It does not recover because of %s: %s", fs[i].ID, m.Cause, fs[i].What, fs[j].ID, fs[j].What)
		} else if i >= 0 {
			fs[i].Lead = true
			if m.Explained == "" {
				m.Explained = fs[i].ID
			}
			f.What = fmt.Sprintf("The message is the API server's %q error for %s (cause: %s); %s explains it.", m.Format, subject, m.Cause, fs[i].ID)
			f.Why = fmt.Sprintf("%s is what produces %q: %s", fs[i].ID, m.Cause, fs[i].What)
		} else {
			f.What = fmt.Sprintf("The message is the API server's %q error for %s (cause: %s), but no current finding explains it.", m.Format, subject, m.Cause)
			f.Why = fmt.Sprintf("The checks that explain %q are %s; none fires now. The cause may be gone (pods restarted, certificate reloaded), intermittent, or not visible from here (KD410): let the API server call the webhook.", m.Cause, strings.Join(m.Explaining, ", "))
			f.Fix = "kadmit doctor --probe --probe-count 10 --from-error '<the same message>'"
			if m.Format == "policy denied" && len(m.Explaining) == 0 {
				f.What = fmt.Sprintf("The message is %s's own denial (%s): nothing is broken in the policy's configuration.", subject, m.Detail)
				f.Why, f.Fix = "The policy's validations decided against the request.", ""
			}
			if m.Format == "denied" {
				f.Why = "The webhook answered and its policy denied the request: nothing is broken in the call path. The denial reason is the webhook's: " + m.Detail
				f.Fix = ""
			}
		}
		return append([]Finding{f}, fs...)
	}
	if m.Policy != "" {
		// Keep the policy and its bindings (only the named one, when the
		// message names one); lead in each.
		var kept []PolicyReport
		for _, p := range rep.Policies {
			binding := p.Policy != ""
			switch {
			case !binding && p.Name == m.Policy,
				binding && p.Policy == m.Policy && (m.Binding == "" || p.Name == m.Binding):
				p.Findings = lead(p.Findings, p.Kind+" "+p.Name)
				kept = append(kept, p)
			}
		}
		if len(kept) == 0 {
			if p, ok := m.staticPolicy(v); ok {
				kept = append(kept, p)
			}
		}
		rep.Policies = kept
		return
	}
	for i := range rep.Webhooks {
		w := &rep.Webhooks[i]
		w.Findings = lead(w.Findings, "webhook "+w.Webhook+" of "+w.Configuration)
	}
}

// selfInterception returns the index in fs of a KD501 (the webhook
// intercepts the creation of its own pods) when the finding at explained
// is one that says no pod answers (KD201, KD708), else -1. Then no webhook
// pod can be created while none answers: KD501 is the cause that keeps
// the error from clearing, and leads.
func selfInterception(fs []Finding, explained int) int {
	if explained < 0 || (fs[explained].ID != IDNoReadyEndpoints && fs[explained].ID != IDProbeNoEndpoints) {
		return -1
	}
	for j := range fs {
		if fs[j].ID == IDSelfInterception && fs[j].Severity != SeverityInfo {
			return j
		}
	}
	return -1
}

// staticSubject is the KD002 finding leading a static webhook's or
// policy's report: what the message is, and that KD004 says where the
// object lives.
func (m *ErrorMatch) staticSubject(subject string) Finding {
	f := Finding{ID: IDFromError, Severity: SeverityInfo, Lead: true,
		What: fmt.Sprintf("The message is the API server's %q error for %s (cause: %s); %s says where it lives.", m.Format, subject, m.Cause, IDStaticAdmission),
		Why:  "Doctor reads what the API serves; a static object is not among it, so none of the other checks can be made for it."}
	if m.Format == "policy denied" && len(m.Explaining) == 0 {
		f.Why = "The policy's validations decided against the request (" + m.Detail + "); " + f.Why
	}
	return f
}

// staticReport is the report for a message naming a webhook that no
// configuration the API serves holds, when its name has StaticSuffix
// (KEP-5793's convention; the webhooks inside a static configuration may
// be named anything, only the configuration must carry the suffix) and
// the server may have static admission configuration (1.36 with its
// alpha gate, 1.37 and later, or unknown). nil otherwise: the webhook was
// deleted.
func (m *ErrorMatch) staticReport(snap *Snapshot) *Report {
	note, ok := staticGateNote(snap.ServerVersion)
	if m.Webhook == "" || !isStaticName(m.Webhook) || !ok {
		return nil
	}
	sev := SeverityWarning // the message shows its calls failing
	if m.Format == "denied" {
		sev = SeverityInfo // it answered; its policy denied
	}
	f := Finding{ID: IDStaticAdmission, Severity: sev, Lead: true,
		What: fmt.Sprintf("Webhook %q is in no MutatingWebhookConfiguration or ValidatingWebhookConfiguration the API serves, and its name ends in %q: it belongs to the API server's manifest-based admission configuration (KEP-5793), which the API does not show.%s", m.Webhook, StaticSuffix, note),
		Why:  staticWhere + " Doctor can check none of it.",
		Fix:  staticFix(m.Webhook),
	}
	if m.URL != "" {
		f.Fix += "; its clientConfig.url " + m.URL + " must answer from every API server's host"
	}
	m.Explained = IDStaticAdmission
	rep := &Report{Gaps: snap.AllGaps(), FromError: m, Webhooks: []WebhookReport{{
		Webhook: m.Webhook, Configuration: "manifest-based (static)", Target: m.URL,
		Findings: []Finding{m.staticSubject("static webhook " + m.Webhook), f},
	}}}
	rep.finish()
	return rep
}

// notFoundHint completes the error for a message naming a webhook no
// configuration the API serves holds (and whose name does not say it is
// static): on servers that may have static admission configuration, the
// webhook may be one of a static configuration, whose webhooks may be
// named anything.
func notFoundHint(v *version.Info) string {
	if staticAdmissionGate(v) == gateAbsent {
		return ""
	}
	return ", or a webhook of the API server's manifest-based (static) admission configuration, which the API does not show: look for it in the staticManifestsDir of kube-apiserver's --admission-control-config-file (" + IDStaticAdmission + ")"
}

// staticPolicy is the report of a policy the message names that the API
// does not serve, when its name has StaticSuffix and the server may have
// static admission configuration (static policies must carry the suffix,
// k8s.io/apiserver v0.37.1 pkg/admission/plugin/policy/manifest/loader).
func (m *ErrorMatch) staticPolicy(v *version.Info) (PolicyReport, bool) {
	note, ok := staticGateNote(v)
	if !isStaticName(m.Policy) || !ok {
		return PolicyReport{}, false
	}
	kind := m.PolicyKind
	if kind == "" {
		kind = "ValidatingAdmissionPolicy" // "denied request" is a validation's decision
	}
	binding := ""
	if m.Binding != "" {
		binding = fmt.Sprintf(" (with its binding %q, static too: static bindings bind only static policies)", m.Binding)
	}
	f := Finding{ID: IDStaticAdmission, Severity: SeverityInfo, Lead: true,
		What: fmt.Sprintf("%s %q%s is not served by the API, and its name ends in %q: it belongs to the API server's manifest-based admission configuration (KEP-5793), which the API does not show.%s", kind, m.Policy, binding, StaticSuffix, note),
		Why:  staticWhere + " Doctor can check none of it.",
		Fix:  staticFix(m.Policy),
	}
	if len(m.Explaining) > 0 {
		f.Severity = SeverityWarning // a configuration error, not the policy's own decision
	}
	m.Explained = IDStaticAdmission
	return PolicyReport{Kind: kind, Name: m.Policy, Findings: []Finding{m.staticSubject(kind + " " + m.Policy), f}}, true
}
