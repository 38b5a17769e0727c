package doctor

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// clusterScoped are well-known cluster-scoped resources; a rule naming only
// these cannot intercept anything in a namespace.
var clusterScoped = map[string]bool{
	"nodes": true, "namespaces": true, "persistentvolumes": true, "clusterroles": true, "clusterrolebindings": true,
	"customresourcedefinitions": true, "storageclasses": true, "priorityclasses": true, "certificatesigningrequests": true,
	"validatingwebhookconfigurations": true, "mutatingwebhookconfigurations": true, "validatingadmissionpolicies": true,
	"validatingadmissionpolicybindings": true, "csinodes": true, "csidrivers": true, "runtimeclasses": true,
	"ingressclasses": true, "volumeattachments": true, "apiservices": true, "tokenreviews": true, "subjectaccessreviews": true,
	"selfsubjectaccessreviews": true, "selfsubjectrulesreviews": true, "flowschemas": true, "prioritylevelconfigurations": true,
}

// mayInterceptNamespaced reports whether some rule can select a namespaced
// resource.
func mayInterceptNamespaced(rules []admissionregistrationv1.RuleWithOperations) bool {
	for _, r := range rules {
		if r.Scope != nil && *r.Scope == admissionregistrationv1.ClusterScope {
			continue
		}
		for _, res := range r.Resources {
			base, _, _ := strings.Cut(res, "/")
			if !clusterScoped[base] {
				return true
			}
		}
	}
	return false
}

// verdict is whether the API server calls w for one object's request, and
// how sure doctor is.
type verdict struct {
	obj Object
	// note tells how matchConditions decided (empty without conditions).
	note string
	// unsure lists why the verdict is not exact; non-empty means no error
	// severity may rest on it.
	unsure []string
}

// decide runs the API server's order for obj: rules, namespaceSelector,
// objectSelector (Intercepts), then matchConditions on the representative
// request (EvalConditions). It returns true when the request would reach
// the webhook, or be rejected because its conditions fail to evaluate.
func (r *run) decide(ctx context.Context, w *Webhook, obj Object) (verdict, bool) {
	v := verdict{obj: obj}
	if ok, err := w.Intercepts(obj); err != nil || !ok {
		return v, false
	}
	if obj.NamespaceLabelsUnknown && selectorBeyondName(w.NamespaceSelector) {
		v.unsure = append(v.unsure, fmt.Sprintf("namespace %s could not be read, and its labels (which namespaceSelector %s looks at) may exclude it", obj.Namespace, selectorString(w.NamespaceSelector)))
	}
	if len(w.MatchConditions) == 0 {
		return v, true
	}
	cr := w.EvalConditions(ctx, obj)
	if cr.Unknown != "" {
		v.unsure = append(v.unsure, cr.Unknown)
	}
	switch {
	case cr.Excluded != "" && cr.Unknown == "":
		return v, false
	case cr.Err != nil:
		v.note = fmt.Sprintf(" Its matchConditions fail to evaluate for this request (%v): with failurePolicy Fail the API server rejects it without calling the webhook.", cr.Err)
	case cr.Matches:
		v.note = fmt.Sprintf(" Its %d matchCondition(s), evaluated with the API server's CEL library on this request (%s by %s), all return true.", len(w.MatchConditions), obj.Request, obj.User.Name)
	default:
		v.note = " Its matchConditions could not be decided exactly for this request."
	}
	return v, true
}

// selectorBeyondName reports whether sel looks at a namespace label other
// than kubernetes.io/metadata.name (which the API server always sets, so
// that one is known without reading the namespace).
func selectorBeyondName(sel *metav1.LabelSelector) bool {
	if sel == nil {
		return false
	}
	for k := range sel.MatchLabels {
		if k != metadataNameLabel {
			return true
		}
	}
	for _, e := range sel.MatchExpressions {
		if e.Key != metadataNameLabel {
			return true
		}
	}
	return false
}

// severityFor is sev, or warning when the verdict is not exact.
func severityFor(sev Severity, v verdict) Severity {
	if sev == SeverityError && len(v.unsure) > 0 {
		return SeverityWarning
	}
	return sev
}

// describeVerdict is what to append to a finding's What.
func describeVerdict(what string, v verdict) string {
	what += v.note
	if len(v.unsure) > 0 {
		what = cannotTell(what, v.unsure)
	}
	return what
}

// checkInterception runs check 5 for a Fail webhook.
func (r *run) checkInterception(ctx context.Context, w *Webhook) []Finding {
	if !w.Fail() {
		return nil
	}
	var out []Finding
	own := r.backends[w.ServiceKey()]
	if own != nil && own.NamespaceExists {
		if v, ok := r.firstIntercepted(ctx, w, own); ok {
			obj := v.obj
			fix, labelled := NamespaceExclusion(w.NamespaceSelector, own.Namespace, own.NamespaceLabels, backendLabelHints(own))
			if !labelled {
				fix = excludeNamespacePatch(w, own.Namespace)
			}
			fix += fmt.Sprintf("   # until then, to unblock a stuck install: kubectl delete %s %s (and re-apply it once the pods run)", w.resourceKind(), w.Configuration)
			out = append(out, Finding{ID: IDSelfInterception, Severity: severityFor(SeverityError, v),
				What: describeVerdict(fmt.Sprintf("The webhook intercepts %s (%s), which serves it: namespace %s matches its namespaceSelector %s.",
					obj.Describe, obj.Request, own.Namespace, selectorString(w.NamespaceSelector)), v),
				Why: fmt.Sprintf("failurePolicy is Fail: while no pod of Service %s/%s answers (first install, restart, node drain), the API server cannot call the webhook and rejects the creation of the very pods that would answer it (\"failed calling webhook ... connection refused\" in the ReplicaSet's events): a bootstrap deadlock.", own.Namespace, own.Name),
				Fix: fix,
			})
		}
	}

	if mayInterceptNamespaced(w.Rules) {
		if v, fix, ok := r.interceptsNamespace(ctx, w, "kube-system", replicaSetController); ok {
			out = append(out, Finding{ID: IDInterceptsKubeSystem, Severity: SeverityWarning,
				What: describeVerdict(fmt.Sprintf("The webhook intercepts objects in kube-system (namespaceSelector %s matches it).", selectorString(w.NamespaceSelector)), v),
				Why:  "While the webhook is down, control-plane add-ons in kube-system (CoreDNS, kube-proxy, CNI) cannot be created or updated, and the webhook's own pods may need them to start.",
				Fix:  fix,
			})
		}
	}
	for _, op := range []string{"UPDATE", "CREATE"} {
		node := Object{Request: Request{Version: "v1", Resource: "nodes", Operation: opType(op)}, Kind: "Node", Name: "node-1", User: kubelet, Describe: "Node node-1"}
		status := node
		status.Subresource = "status"
		v, ok := r.decide(ctx, w, node)
		if !ok {
			v, ok = r.decide(ctx, w, status)
		}
		if ok {
			out = append(out, Finding{ID: IDInterceptsNodes, Severity: SeverityWarning,
				What: describeVerdict(fmt.Sprintf("The webhook intercepts %s of nodes (%s) with failurePolicy Fail.", op, v.obj.Request), v),
				Why:  "While the webhook is down, kubelets cannot register or update their Node objects: nodes go NotReady and their pods get evicted.",
				Fix:  jsonPatchCommand(w, []map[string]any{{"op": "replace", "path": fmt.Sprintf("/webhooks/%d/failurePolicy", w.Index), "value": "Ignore"}}),
			})
			break
		}
	}
	lease := Object{Request: Request{Group: "coordination.k8s.io", Version: "v1", Resource: "leases", Operation: "UPDATE", Namespaced: true}, Kind: "Lease",
		Namespace: "kube-node-lease", NamespaceLabels: namespaceLabels("kube-node-lease", r.namespaces["kube-node-lease"]), NamespaceLabelsUnknown: !r.snap.NamespacesKnown,
		Name: "node-1", User: kubelet, Describe: "Lease kube-node-lease/node-1"}
	if v, ok := r.decide(ctx, w, lease); ok {
		fix, labelled := NamespaceExclusion(w.NamespaceSelector, "kube-node-lease", r.namespaces["kube-node-lease"], nil)
		if !labelled {
			fix = excludeNamespacePatch(w, "kube-node-lease")
		}
		out = append(out, Finding{ID: IDInterceptsNodeLeases, Severity: SeverityWarning,
			What: describeVerdict(fmt.Sprintf("The webhook intercepts Lease updates in kube-node-lease (namespaceSelector %s).", selectorString(w.NamespaceSelector)), v),
			Why:  "Node heartbeats are Lease updates in kube-node-lease: while the webhook is down (or slow) every node looks dead to the control plane.",
			Fix:  fix,
		})
	}

	// Other webhooks' backends: w blocks their restart while w is down; if
	// one of them blocks w's restart too, neither can recover.
	//
	// Most webhooks' rules match none of the requests backends' objects
	// make (pod and ReplicaSet creates, Deployment updates): the rules are
	// matched once per request here, not once per backend and object, and
	// only the backends left are sorted (2,000 webhooks over 2,000 backends
	// were 12 million rule matches per run in test/e2e/scale). The
	// webhooks by Service are indexed once, when a backend is first
	// intercepted.
	ruleMatch := map[Request]bool{}
	mayIntercept := func(b *Backend) bool {
		for _, o := range r.objectsOf(b) {
			ok, seen := ruleMatch[o.Request]
			if !seen {
				ok = RuleMatches(w.Rules, o.Request)
				ruleMatch[o.Request] = ok
			}
			if ok {
				return true
			}
		}
		return false
	}
	var keys []string
	for k, b := range r.backends {
		if k != w.ServiceKey() && b.NamespaceExists && mayIntercept(b) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var byService map[string][]*Webhook
	for _, k := range keys {
		b := r.backends[k]
		v, ok := r.firstIntercepted(ctx, w, b)
		if !ok {
			continue
		}
		obj := v.obj
		if byService == nil {
			byService = r.webhooksByService()
		}
		others := byService[k]
		cycle := ""
		if own != nil {
			for _, o := range others {
				if !o.Fail() {
					continue
				}
				if back, ok := r.firstIntercepted(ctx, o, own); ok {
					cycle = fmt.Sprintf("%s (%s) in turn intercepts %s", o.Name, o.Configuration, back.obj.Describe)
					v.unsure = append(v.unsure, back.unsure...)
					break
				}
			}
		}
		var names []string
		for _, o := range others {
			names = append(names, o.Name)
		}
		fix, labelled := NamespaceExclusion(w.NamespaceSelector, b.Namespace, b.NamespaceLabels, nil)
		if !labelled {
			fix = excludeNamespacePatch(w, b.Namespace)
		}
		f := Finding{ID: IDInterceptsOtherHook, Severity: SeverityWarning,
			What: describeVerdict(fmt.Sprintf("The webhook intercepts %s (%s), which serves webhook(s) %s via Service %s.", obj.Describe, obj.Request, strings.Join(names, ", "), k), v),
			Why:  "While this webhook is down, those webhooks' pods cannot be recreated.",
			Fix:  fix,
		}
		if cycle != "" {
			f.Severity = severityFor(SeverityError, v)
			f.What += " " + cycle + ": a cycle."
			f.Why = "Each webhook's pods need the other webhook to be admitted: once both are down (cluster restart, outage) neither can ever start again."
		}
		out = append(out, f)
	}
	return out
}

// webhooksByService lists, by Service key, the webhooks calling that
// Service, each name once, sorted by name.
func (r *run) webhooksByService() map[string][]*Webhook {
	out := map[string][]*Webhook{}
	seen := map[string]bool{}
	for _, w := range r.all {
		k := w.ServiceKey()
		if k == "" || seen[k+"\x00"+w.Name] {
			continue
		}
		seen[k+"\x00"+w.Name] = true
		out[k] = append(out[k], w)
	}
	for _, ws := range out {
		sort.Slice(ws, func(a, b int) bool { return ws[a].Name < ws[b].Name })
	}
	return out
}

// firstIntercepted returns the first of b's objects w intercepts.
func (r *run) firstIntercepted(ctx context.Context, w *Webhook, b *Backend) (verdict, bool) {
	var unsure *verdict
	for _, o := range r.objectsOf(b) {
		if v, ok := r.decide(ctx, w, o); ok {
			if len(v.unsure) == 0 {
				return v, true
			}
			if unsure == nil {
				unsure = &v
			}
		}
	}
	if unsure != nil {
		return *unsure, true
	}
	return verdict{}, false
}

// interceptsNamespace reports whether w intercepts a request in ns made by
// user (its namespace labels if read, else the labels the API server always
// sets): the representative request is a pod CREATE when w's rules match
// one, else the first namespaced probe target they match; objects are
// taken as unlabelled (a stand-in for arbitrary add-ons, whose labels
// doctor cannot know). It returns the verdict and the fix.
func (r *run) interceptsNamespace(ctx context.Context, w *Webhook, ns string, user Requester) (verdict, string, bool) {
	base := Object{Namespace: ns, NamespaceLabels: namespaceLabels(ns, r.namespaces[ns]), NamespaceLabelsUnknown: !r.snap.NamespacesKnown, User: user}
	var obj *Object
	for _, t := range probeTargets {
		if !t.Namespaced {
			continue
		}
		for _, op := range []string{"CREATE", "UPDATE"} {
			o := base
			o.Request = Request{Group: t.Group, Version: t.Version, Resource: t.Resource, Operation: opType(op), Namespaced: true}
			o.Kind = kindOf(t.Resource)
			o.Describe = t.Resource + " in " + ns
			if op == "UPDATE" {
				o.Name = "example"
			}
			if RuleMatches(w.Rules, o.Request) {
				obj = &o
				break
			}
		}
		if obj != nil {
			break
		}
	}
	var v verdict
	var ok bool
	if obj != nil {
		v, ok = r.decide(ctx, w, *obj)
	} else {
		// Rules on resources doctor has no representative request for:
		// decide on the selectors alone.
		nsOK, err := SelectorMatches(w.NamespaceSelector, base.NamespaceLabels)
		ok = err == nil && nsOK && selectorMatchesEmpty(w.ObjectSelector)
		v = verdict{obj: base}
		if ok && len(w.MatchConditions) > 0 {
			v.unsure = append(v.unsure, "its matchConditions were not evaluated: doctor builds representative requests only for built-in resources")
		}
	}
	if !ok {
		return verdict{}, "", false
	}
	fix, labelled := NamespaceExclusion(w.NamespaceSelector, ns, r.namespaces[ns], nil)
	if !labelled {
		fix = excludeNamespacePatch(w, ns)
	}
	return v, fix, true
}

// kindOf is the Kind of a built-in resource doctor probes.
func kindOf(resource string) string {
	switch resource {
	case "pods":
		return "Pod"
	case "configmaps":
		return "ConfigMap"
	case "secrets":
		return "Secret"
	case "serviceaccounts":
		return "ServiceAccount"
	case "services":
		return "Service"
	case "deployments":
		return "Deployment"
	case "replicasets":
		return "ReplicaSet"
	case "statefulsets":
		return "StatefulSet"
	case "daemonsets":
		return "DaemonSet"
	case "jobs":
		return "Job"
	case "leases":
		return "Lease"
	case "nodes":
		return "Node"
	}
	return ""
}

// selectorMatchesEmpty reports whether an objectSelector matches objects
// without labels: the stand-in for "arbitrary objects" such as node Leases
// or kube-system add-ons, whose labels doctor cannot know.
func selectorMatchesEmpty(sel *metav1.LabelSelector) bool {
	ok, err := SelectorMatches(sel, nil)
	return err == nil && ok
}

// selectorString renders a selector for messages; the empty selector, which
// metav1.FormatLabelSelector shows as "<none>", matches everything.
func selectorString(sel *metav1.LabelSelector) string {
	if sel == nil || (len(sel.MatchLabels) == 0 && len(sel.MatchExpressions) == 0) {
		return "{} (everything)"
	}
	return "\"" + metav1.FormatLabelSelector(sel) + "\""
}

// backendLabelHints are label values the backend's pods carry, offered as
// values for namespace labels whose requirement accepts any value.
func backendLabelHints(b *Backend) map[string]string {
	out := map[string]string{}
	for _, p := range b.Pods {
		for k, v := range p.Labels {
			if _, ok := out[k]; !ok {
				out[k] = v
			}
		}
	}
	for _, t := range b.Templates {
		for k, v := range t.Labels {
			if _, ok := out[k]; !ok {
				out[k] = v
			}
		}
	}
	return out
}

// checkSettings runs check 6. collision is what checkService found behind
// the webhook's Service (nil if none): KD605 then reasons about the
// webhook's own pods and the selector KD301's fix gives the Service.
func (r *run) checkSettings(w *Webhook, collision *Collision) []Finding {
	var out []Finding
	if w.TimeoutSeconds > 10 {
		out = append(out, Finding{ID: IDTimeoutTooLong, Severity: SeverityWarning,
			What: fmt.Sprintf("timeoutSeconds is %d.", w.TimeoutSeconds),
			Why:  fmt.Sprintf("While the webhook hangs, every matched request (%s) waits up to %ds, and the waits of several webhooks add up past clients' own timeouts.", describeRules(w.Rules), w.TimeoutSeconds),
			Fix:  jsonPatchCommand(w, []map[string]any{{"op": "replace", "path": fmt.Sprintf("/webhooks/%d/timeoutSeconds", w.Index), "value": 5}}),
		})
	}
	if w.SideEffects != admissionregistrationv1.SideEffectClassNone && w.SideEffects != admissionregistrationv1.SideEffectClassNoneOnDryRun {
		out = append(out, Finding{ID: IDSideEffectsDryRun, Severity: SeverityWarning,
			What: fmt.Sprintf("sideEffects is %q.", w.SideEffects),
			Why:  "The API server rejects every dry-run request the webhook matches (kubectl apply --dry-run=server, kubectl diff) without calling it.",
			Fix:  jsonPatchCommand(w, []map[string]any{{"op": "replace", "path": fmt.Sprintf("/webhooks/%d/sideEffects", w.Index), "value": "None"}}) + "  # if the webhook has no side effects; else NoneOnDryRun and honour request.dryRun",
		})
	}
	hasV1 := false
	for _, v := range w.AdmissionReviewVersions {
		if v == "v1" {
			hasV1 = true
		}
	}
	if !hasV1 {
		out = append(out, Finding{ID: IDReviewVersions, Severity: SeverityWarning,
			What: fmt.Sprintf("admissionReviewVersions is %v, without v1.", w.AdmissionReviewVersions),
			Why:  "admission.k8s.io/v1beta1 is deprecated; API servers that drop it can no longer call the webhook.",
			Fix:  jsonPatchCommand(w, []map[string]any{{"op": "replace", "path": fmt.Sprintf("/webhooks/%d/admissionReviewVersions", w.Index), "value": append([]string{"v1"}, w.AdmissionReviewVersions...)}}) + "  # once the webhook answers AdmissionReview v1",
		})
	}
	for _, rule := range w.Rules {
		star := false
		for _, res := range rule.Resources {
			if res == "*" || res == "*/*" {
				star = true
			}
		}
		if star {
			out = append(out, Finding{ID: IDWildcardResources, Severity: SeverityWarning,
				What: fmt.Sprintf("A rule selects resources %v in groups %v.", rule.Resources, rule.APIGroups),
				Why:  "Every request for every resource (" + r.everyResourceExamples() + ") goes through the webhook: each adds latency, and while it is down everything it matches is affected.",
				Fix:  fmt.Sprintf("List the resources the webhook needs instead of \"*\": kubectl edit %s %s", w.resourceKind(), w.Configuration),
			})
			break
		}
	}

	b := r.backends[w.ServiceKey()]
	if !w.Fail() || b == nil || b.Service == nil {
		return out
	}
	var svcPort string
	for _, p := range b.Service.Spec.Ports {
		if p.Port == w.ServicePort() {
			svcPort = p.Name
		}
	}
	eps, _ := b.endpointsFor(svcPort)
	readyAddrs := map[string]bool{}
	for _, e := range eps {
		if e.Ready {
			readyAddrs[e.Address] = true
		}
	}
	if len(readyAddrs) == 1 {
		fix := fmt.Sprintf("Run at least 2 replicas of the webhook's workload behind Service %s/%s", b.Namespace, b.Name)
		for _, p := range b.Pods {
			if ref := b.Workload[p.Name]; ref.Kind == "Deployment" || ref.Kind == "StatefulSet" {
				fix = fmt.Sprintf("kubectl -n %s scale %s %s --replicas=2", b.Namespace, strings.ToLower(ref.Kind), ref.Name)
				break
			}
		}
		out = append(out, Finding{ID: IDSingleReplica, Severity: SeverityWarning,
			What: fmt.Sprintf("Service %s/%s has a single ready endpoint.", b.Namespace, b.Name),
			Why:  "failurePolicy is Fail: any restart, eviction or node drain of that one pod is an outage for " + describeRules(w.Rules) + ".",
			Fix:  fix,
		})
	}
	var own, foreign []map[string]string
	for _, p := range b.Pods {
		own = append(own, p.Labels)
	}
	for _, t := range b.Templates {
		own = append(own, t.Labels)
	}
	if collision != nil && collision.Intended {
		// Only the webhook's own pods need the budget; one that also
		// selects the other workload's pods can be met by those alone.
		own, foreign = groupLabels(collision.Groups[:1]), groupLabels(collision.Groups[1:])
	}
	if len(own) > 0 && !b.PDBsUnknown && !coveredByPDB(b, own, foreign) && len(b.Service.Spec.Selector) > 0 {
		f := Finding{ID: IDNoPodDisruptionBudget, Severity: SeverityWarning,
			What: fmt.Sprintf("No PodDisruptionBudget in %s covers the pods of Service %s.", b.Namespace, b.Name),
			Why:  "failurePolicy is Fail: a node drain may evict every webhook pod at once, an outage for " + describeRules(w.Rules) + ".",
		}
		f.Why, f.Fix = pdbFix(b, collision, f.Why)
		out = append(out, f)
	}
	return out
}

// pdbFix returns KD605's why and fix. The budget's selector is the
// Service's, except when the Service also selects another workload's pods
// (KD301): a budget on that selector can be met by the other pods alone
// while a drain evicts every webhook pod, so it uses the selector KD301's
// fix gives the Service (Collision.NarrowedSelector), or, when there is no
// such label yet, says to fix KD301 first.
func pdbFix(b *Backend, c *Collision, why string) (string, string) {
	create := func(sel map[string]string) string {
		return fmt.Sprintf("kubectl -n %s create poddisruptionbudget %s --selector=%s --min-available=1", b.Namespace, b.Name, labels.SelectorFromSet(sel))
	}
	if c == nil {
		return why, create(b.Service.Spec.Selector)
	}
	also := "also selects"
	if !c.Proven {
		also = "seems to also select"
	}
	why += fmt.Sprintf(" The Service's selector %q %s pods of another workload (%s): a budget on it could be met by those pods alone while every webhook pod is evicted.",
		labels.SelectorFromSet(b.Service.Spec.Selector), also, IDSelectorCollision)
	narrowed, ok := c.NarrowedSelector(b.Service.Spec.Selector)
	own := c.Groups[0].Workload
	switch {
	case ok && c.Intended:
		return why, create(narrowed) + fmt.Sprintf("  # the selector %s's fix gives the Service: only %s's pods, not %s's", IDSelectorCollision, own, c.Others())
	case ok:
		return why, fmt.Sprintf("Fix %s first; if %s is the webhook's workload: %s", IDSelectorCollision, own, create(narrowed))
	default:
		return why, fmt.Sprintf("Fix %s first (a label only the webhook's pods carry, added to the Service's selector), then create the budget on the Service's new selector: kubectl -n %s create poddisruptionbudget %s --selector=<the new selector> --min-available=1", IDSelectorCollision, b.Namespace, b.Name)
	}
}

// groupLabels lists the labels of the pods (and template stand-ins) of
// groups.
func groupLabels(groups []WorkloadGroup) []map[string]string {
	var out []map[string]string
	for _, g := range groups {
		for _, p := range g.pods {
			out = append(out, p.Labels)
		}
	}
	return out
}

// coveredByPDB reports whether a PodDisruptionBudget selects some pod of
// own and none of foreign (a budget that foreign pods can satisfy does not
// protect own).
func coveredByPDB(b *Backend, own, foreign []map[string]string) bool {
	matches := func(sel *metav1.LabelSelector, pods []map[string]string) bool {
		for _, l := range pods {
			if ok, err := SelectorMatches(sel, l); err == nil && ok {
				return true
			}
		}
		return false
	}
	for _, pdb := range b.PDBs {
		sel := pdb.Spec.Selector
		if sel == nil || len(sel.MatchLabels)+len(sel.MatchExpressions) == 0 {
			continue
		}
		if matches(sel, own) && !matches(sel, foreign) {
			return true
		}
	}
	return false
}

// probe runs check 7: ProbeCount dry-run creates, classified and grouped by
// outcome.
func (r *run) probe(ctx context.Context, w *Webhook) []Finding {
	plan, why := planProbe(w, r.namespaces)
	if plan == nil {
		return []Finding{{ID: IDProbeSkipped, Severity: SeverityInfo, What: "No live probe: " + why + "."}}
	}
	// The probe is made by whoever runs doctor, unknown here: evaluate the
	// conditions as an ordinary authenticated user would be seen.
	excluded := ""
	if len(w.MatchConditions) > 0 {
		cr := w.EvalConditions(ctx, Object{Request: plan.Request, Kind: kindOf(plan.Request.Resource), Namespace: plan.Namespace, Labels: plan.Labels, Name: "kadmit-doctor-probe", User: anyUser})
		excluded = cr.Excluded
	}
	type agg struct {
		o        Outcome
		n        int
		min, max time.Duration
	}
	var order []string
	byID := map[string]*agg{}
	for i := 0; i < r.o.ProbeCount; i++ {
		// The API server waits up to timeoutSeconds for the webhook; leave it
		// room to answer with its own timeout error.
		pctx, cancel := context.WithTimeout(ctx, time.Duration(w.TimeoutSeconds)*time.Second+10*time.Second)
		rtt, err := runProbe(pctx, r.cs, plan)
		cancel()
		if ctx.Err() != nil {
			break
		}
		if isRBACDenial(err) {
			// Authorization runs before admission: the webhook was never
			// involved, and more probes would be refused the same way.
			g := newGap("create", plan.Request.Resource, plan.Request.Group, plan.Namespace, err, "what the API server gets when it calls the webhook: no probe was made (a server-side dry-run create needs create permission, although nothing is stored)")
			return []Finding{g.finding()}
		}
		o := Classify(err, w.Name)
		r.mu.Lock()
		r.probeCalls = append(r.probeCalls, ProbeCall{Outcome: o, RTT: rtt})
		r.mu.Unlock()
		a := byID[o.ID]
		if a == nil {
			a = &agg{o: o, min: rtt, max: rtt}
			byID[o.ID] = a
			order = append(order, o.ID)
		}
		a.n++
		a.min, a.max = min(a.min, rtt), max(a.max, rtt)
	}
	where := plan.Namespace
	if where == "" {
		where = "cluster scope"
	}
	intermittent := len(order) > 1
	var out []Finding
	for _, id := range order {
		a := byID[id]
		f := Finding{ID: id,
			What: fmt.Sprintf("Probe (dry-run %s in %s): %s in %d of %d call(s), round trip %s.", plan.Request, where, a.o.Class, a.n, r.o.ProbeCount, rttRange(a.min, a.max)),
		}
		switch id {
		case IDProbeAdmitted:
			f.Severity = SeverityInfo
			f.Why = "The API server called the webhook (or skipped it on matchConditions) and admitted the object."
			if !w.Fail() {
				f.Why = "failurePolicy is Ignore, so a failed call is admitted too: this does not prove the webhook was reached."
			}
			if excluded != "" {
				f.Why = fmt.Sprintf("matchCondition %q excludes the probe's request, so the API server most likely did not call the webhook: this does not prove it is reached.", excluded)
			}
		case IDProbeDenied:
			f.Severity = SeverityInfo
			f.Why = "The webhook answered and its policy denied the minimal probe object, which proves the API server reaches it: " + a.o.Detail
		case IDProbeInconclusive:
			f.Severity = SeverityInfo
			f.Why = "Something else answered before this webhook was called: " + a.o.Detail
		default:
			f.Severity = SeverityError
			f.Why = "The API server answered: " + a.o.Detail
			if intermittent {
				f.What += " Intermittent: other calls got a different answer, so some endpoints behind the Service are broken (see " + IDSelectorCollision + ", " + IDSANMismatch + ")."
			}
			f.Fix = probeFix(w, id)
		}
		out = append(out, f)
	}
	return out
}

// isRBACDenial reports whether err is the authorizer's 403 (".. cannot
// create resource ..."), not an admission denial, which is a 403 too.
func isRBACDenial(err error) bool {
	return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "cannot create resource")
}

func rttRange(lo, hi time.Duration) string {
	lo, hi = lo.Round(time.Millisecond), hi.Round(time.Millisecond)
	if lo == hi {
		return lo.String()
	}
	return lo.String() + "-" + hi.String()
}

func probeFix(w *Webhook, id string) string {
	switch id {
	case IDProbeRefused, IDProbeNoEndpoints:
		return fmt.Sprintf("See %s/%s: make the webhook's pods ready only once they listen. %s", IDNoReadyEndpoints, IDEndpointRefused, ifService(w, "kubectl -n %s get endpointslices -l kubernetes.io/service-name=%s"))
	case IDProbeUnknownAuthority:
		return servingFix(w, IDUnknownAuthority)
	case IDProbeSANMismatch:
		return servingFix(w, IDSANMismatch)
	case IDProbeCertExpired:
		return servingFix(w, IDServingCertExpiry)
	case IDProbeTimeout:
		return fmt.Sprintf("The webhook did not answer within timeoutSeconds (%ds): check its latency and logs; keep answers in milliseconds.", w.TimeoutSeconds)
	default:
		return "Check the webhook's logs for the request; the answer must be an AdmissionReview of the version sent, with response.uid equal to request.uid."
	}
}

func ifService(w *Webhook, format string) string {
	if s := w.ClientConfig.Service; s != nil {
		return fmt.Sprintf(format, s.Namespace, s.Name)
	}
	return ""
}
