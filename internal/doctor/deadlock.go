package doctor

import (
	"context"
	"fmt"
	"path"
	"slices"
	"sort"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
)

// DependenciesFrom finds, among the cluster's DaemonSets and Deployments
// (every namespace), the workloads whose pods other pods need in order to
// start again (KD506), from what an informer holds of them: namespace,
// name, pod template labels, hostNetwork and volumes. services are only
// looked at for the cluster DNS Services (kube-system/kube-dns,
// openshift-dns/dns-default); every other Service is ignored, and nil is
// fine.
//
//   - DependencyCNI: a DaemonSet whose pod template has hostNetwork and a
//     hostPath volume on a CNI configuration or binary directory (cniDirs:
//     /etc/cni/net.d, /opt/cni/bin and the OpenShift/MicroShift
//     equivalents, or a directory above or below one of them), in any
//     namespace: calico-node in calico-system, kube-flannel-ds in
//     kube-flannel, cilium in kube-system, ovnkube-master in
//     openshift-ovn-kubernetes ...
//   - DependencyDNS: the Deployments and DaemonSets in the namespace of a
//     cluster DNS Service whose pod template its selector matches; without
//     that Service among services, those whose template carries the label
//     the Service selects by default (k8s-app=kube-dns in kube-system,
//     CoreDNS as kubeadm, k3s, EKS, AKS and GKE install it;
//     dns.operator.openshift.io/daemonset-dns=default in openshift-dns).
//   - DependencyCertIssuer: cert-manager's controller, cainjector and
//     webhook Deployments, by the labels cert-manager's Helm chart (and the
//     static manifests rendered from it) puts on their pod templates
//     (certManagerComponent), and OpenShift's service-ca Deployment.
//
// nil entries are skipped. The result is sorted by role (CNI, DNS,
// certificate issuer), namespace, kind and name, holds each workload once
// and at most MaxDependencies (the first in that order: every webhook is
// decided against each, so a cluster full of look-alikes cannot make a
// run quadratic). Labels are the template's map, not a copy: callers must
// not modify them.
func DependenciesFrom(daemonSets []*appsv1.DaemonSet, deployments []*appsv1.Deployment, services []*corev1.Service) []Dependency {
	var out []Dependency
	seen := map[string]bool{}
	add := func(role, ns string, ref WorkloadRef, lbls map[string]string) {
		if k := ns + "/" + ref.String(); !seen[k] {
			seen[k] = true
			out = append(out, Dependency{Role: role, Namespace: ns, Workload: ref, Labels: lbls})
		}
	}
	for _, d := range daemonSets {
		if d != nil && isCNITemplate(&d.Spec.Template.Spec) {
			add(DependencyCNI, d.Namespace, WorkloadRef{Kind: "DaemonSet", Name: d.Name}, d.Spec.Template.Labels)
		}
	}
	for _, dns := range clusterDNS {
		sel := dns.selector(services)
		for _, d := range deployments {
			if d != nil && d.Namespace == dns.Namespace && sel.Matches(labels.Set(d.Spec.Template.Labels)) {
				add(DependencyDNS, d.Namespace, WorkloadRef{Kind: "Deployment", Name: d.Name}, d.Spec.Template.Labels)
			}
		}
		for _, d := range daemonSets {
			if d != nil && d.Namespace == dns.Namespace && sel.Matches(labels.Set(d.Spec.Template.Labels)) {
				add(DependencyDNS, d.Namespace, WorkloadRef{Kind: "DaemonSet", Name: d.Name}, d.Spec.Template.Labels)
			}
		}
	}
	// cert-manager's cainjector and webhook carry generic names
	// (app.kubernetes.io/name: webhook): they count only next to a
	// cert-manager controller of the same release in the same namespace.
	controllers := map[string]bool{}
	for _, d := range deployments {
		if d != nil && certManagerComponent(d.Spec.Template.Labels) == "controller" {
			controllers[d.Namespace+"/"+d.Spec.Template.Labels[labelInstance]] = true
		}
	}
	for _, d := range deployments {
		if d == nil {
			continue
		}
		l := d.Spec.Template.Labels
		if certManagerComponent(l) != "" && controllers[d.Namespace+"/"+l[labelInstance]] || isServiceCA(d.Namespace, l) {
			add(DependencyCertIssuer, d.Namespace, WorkloadRef{Kind: "Deployment", Name: d.Name}, l)
		}
	}
	sort.SliceStable(out, func(a, b int) bool {
		ka := []string{roleOrder(out[a].Role), out[a].Namespace, out[a].Workload.Kind, out[a].Workload.Name}
		kb := []string{roleOrder(out[b].Role), out[b].Namespace, out[b].Workload.Kind, out[b].Workload.Name}
		return slices.Compare(ka, kb) < 0
	})
	if len(out) > MaxDependencies {
		out = out[:MaxDependencies]
	}
	return out
}

// MaxDependencies bounds what DependenciesFrom returns: far more than the
// CNI, DNS and issuer workloads of any cluster.
const MaxDependencies = 64

// maxListed bounds the names one finding lists (workloads, policies,
// peers): the rest are counted.
const maxListed = 5

// joinListed joins at most maxListed of names, then says how many more.
func joinListed(names []string) string {
	if len(names) <= maxListed {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:maxListed], ", "), len(names)-maxListed)
}

func roleOrder(role string) string {
	switch role {
	case DependencyCNI:
		return "0"
	case DependencyDNS:
		return "1"
	default:
		return "2"
	}
}

// dnsService is where a distribution runs cluster DNS: the Service, and the
// label its selector uses when the Service itself is not at hand.
type dnsService struct {
	Namespace, Name string
	Default         map[string]string
}

// clusterDNS: kubeadm's kube-system/kube-dns in front of CoreDNS
// (k8s-app=kube-dns), and OpenShift's and MicroShift's
// openshift-dns/dns-default in front of the dns-default DaemonSet
// (openshift/cluster-dns-operator assets/dns/service.yaml).
var clusterDNS = []dnsService{
	{Namespace: "kube-system", Name: "kube-dns", Default: map[string]string{"k8s-app": "kube-dns"}},
	{Namespace: "openshift-dns", Name: "dns-default", Default: map[string]string{"dns.operator.openshift.io/daemonset-dns": "default"}},
}

// selector is the selector of the Service among services, or Default.
func (d dnsService) selector(services []*corev1.Service) labels.Selector {
	for _, s := range services {
		if s != nil && s.Namespace == d.Namespace && s.Name == d.Name && len(s.Spec.Selector) > 0 {
			return labels.SelectorFromSet(s.Spec.Selector)
		}
	}
	return labels.SelectorFromSet(d.Default)
}

// cniDirs are where CNI plugins keep their configuration and binaries: the
// CNI specification's and the kubelet's defaults (/etc/cni/net.d,
// /opt/cni/bin), OpenShift's Multus (/etc/kubernetes/cni/net.d,
// /var/lib/cni/bin, /run/multus/cni/net.d) and MicroShift's OVN-Kubernetes
// (/run/cni/bin, openshift/microshift
// assets/components/ovn/single-node/master/daemonset.yaml).
var cniDirs = []string{"/etc/cni/net.d", "/opt/cni/bin", "/etc/kubernetes/cni/net.d", "/var/lib/cni/bin", "/run/cni/bin", "/run/multus/cni/net.d"}

// isCNITemplate reports whether a pod template looks like a CNI agent:
// host network (a CNI agent cannot wait for the pod network it provides)
// plus a hostPath volume on a CNI directory, a directory inside one, or
// one holding one with at least two path elements (/etc/cni, not /etc or
// /: node agents mounting the whole host are not CNI agents for that).
func isCNITemplate(spec *corev1.PodSpec) bool {
	if !spec.HostNetwork {
		return false
	}
	for _, v := range spec.Volumes {
		if v.HostPath == nil || v.HostPath.Path == "" {
			continue
		}
		p := path.Clean(v.HostPath.Path)
		for _, d := range cniDirs {
			if p == d || strings.HasPrefix(p, d+"/") || (strings.HasPrefix(d, p+"/") && strings.Count(p, "/") >= 2) {
				return true
			}
		}
	}
	return false
}

// Labels of cert-manager's Helm chart (cert-manager/cert-manager
// deploy/charts/cert-manager/templates/deployment.yaml,
// cainjector-deployment.yaml and webhook-deployment.yaml; the names are
// fixed in _helpers.tpl, "webhook.name" and "cainjector.name", except the
// controller's, which is nameOverride or the chart's name).
const (
	labelName      = "app.kubernetes.io/name"
	labelInstance  = "app.kubernetes.io/instance"
	labelComponent = "app.kubernetes.io/component"
)

// certManagerComponent names the cert-manager component whose pod template
// carries lbls ("controller", "cainjector", "webhook"), or "".
func certManagerComponent(lbls map[string]string) string {
	switch name, comp := lbls[labelName], lbls[labelComponent]; {
	case name == "cert-manager" && comp == "controller":
		return "controller"
	case name == "cainjector" && comp == "cainjector":
		return "cainjector"
	case name == "webhook" && comp == "webhook":
		return "webhook"
	}
	return ""
}

// isServiceCA recognises OpenShift's service CA controller, which injects
// caBundles annotated service.beta.openshift.io/inject-cabundle
// (openshift/microshift assets/components/service-ca/deployment.yaml).
func isServiceCA(ns string, lbls map[string]string) bool {
	return ns == "openshift-service-ca" && lbls["app"] == "service-ca"
}

// Annotations naming who injects a configuration's caBundle.
const (
	annotationInjectCAFrom       = "cert-manager.io/inject-ca-from"
	annotationInjectCAFromSecret = "cert-manager.io/inject-ca-from-secret"
	annotationServiceCAInject    = "service.beta.openshift.io/inject-cabundle"
)

// Certificate issuers KD506 knows, as certIssuer names them.
const (
	issuerCertManager = "cert-manager"
	issuerServiceCA   = "OpenShift's service CA"
)

// certIssuer is the issuer the configuration's annotations name (and the
// annotation that names it), "" when none does.
func certIssuer(annotations map[string]string) (issuer, annotation string) {
	switch {
	case annotations[annotationInjectCAFrom] != "":
		return issuerCertManager, annotationInjectCAFrom + "=" + annotations[annotationInjectCAFrom]
	case annotations[annotationInjectCAFromSecret] != "":
		return issuerCertManager, annotationInjectCAFromSecret + "=" + annotations[annotationInjectCAFromSecret]
	case annotations[annotationServiceCAInject] == "true":
		return issuerServiceCA, annotationServiceCAInject + "=true"
	}
	return "", ""
}

// dependencyIssuer is the issuer a DependencyCertIssuer workload belongs to.
func dependencyIssuer(d Dependency) string {
	if isServiceCA(d.Namespace, d.Labels) {
		return issuerServiceCA
	}
	return issuerCertManager
}

// depHit is one dependency workload the webhook intercepts.
type depHit struct {
	dep Dependency
	v   verdict
}

// checkDependencies runs KD506 for a Fail webhook: the pods its own
// recovery depends on, beyond its own (KD501) and beyond the generic
// "intercepts kube-system" (KD502), that it intercepts. Each is decided
// by the one decision path (run.decide) on the pod CREATE that the
// DaemonSet or ReplicaSet controller makes to recreate them. One finding
// per role and namespace, with the exclusion of that namespace as fix.
//
// Which dependencies count: the CNI's DaemonSets unless every pod of the
// webhook runs on the host network (those need no CNI); cluster DNS;
// the certificate issuer the configuration's annotation names. URL
// webhooks depend on neither the pod network nor cluster DNS.
func (r *run) checkDependencies(ctx context.Context, w *Webhook) []Finding {
	if !w.Fail() || len(r.snap.Dependencies) == 0 {
		return nil
	}
	own := r.backends[w.ServiceKey()]
	issuer, annotation := certIssuer(w.Annotations)
	inCluster := w.ClientConfig.Service != nil
	var hits []depHit
	for _, d := range r.snap.Dependencies {
		switch d.Role {
		case DependencyCNI:
			if !inCluster || hostNetworkOnly(own) {
				continue
			}
		case DependencyDNS:
			if !inCluster {
				continue
			}
		case DependencyCertIssuer:
			if issuer == "" || dependencyIssuer(d) != issuer {
				continue
			}
		}
		if ownsDependency(own, d) {
			continue // KD501 reports the webhook's own pods
		}
		nsl, known := r.namespaces[d.Namespace]
		if r.snap.NamespacesKnown && !known {
			continue // the namespace is Terminating
		}
		obj := Object{Request: Request{Version: "v1", Resource: "pods", Operation: "CREATE", Namespaced: true}, Kind: "Pod",
			Namespace: d.Namespace, NamespaceLabels: namespaceLabels(d.Namespace, nsl), NamespaceLabelsUnknown: !r.snap.NamespacesKnown,
			Labels: d.Labels, User: podCreator(d.Workload), Describe: "new pods of " + d.Workload.String() + " in " + d.Namespace}
		v, ok := r.decide(ctx, w, obj)
		if !ok {
			continue
		}
		if len(w.MatchConditions) > 0 {
			// Doctor knows a dependency's pod labels, not its spec: a
			// condition that fails on the stand-in may pass on the pod.
			if cr := w.EvalConditions(ctx, obj); cr.Err != nil {
				v.unsure = append(v.unsure, fmt.Sprintf("its matchConditions fail to evaluate on doctor's stand-in for the pod, which carries only the pod template's labels (%v)", cr.Err))
			}
		}
		hits = append(hits, depHit{dep: d, v: v})
	}
	if len(hits) == 0 {
		return nil
	}
	// One finding per role and namespace, in the dependencies' order.
	type key struct{ role, ns string }
	var order []key
	byKey := map[key][]depHit{}
	for _, h := range hits {
		k := key{h.dep.Role, h.dep.Namespace}
		if byKey[k] == nil {
			order = append(order, k)
		}
		byKey[k] = append(byKey[k], h)
	}
	var nss []string
	for _, k := range order {
		nss = append(nss, k.ns)
	}
	fixes := r.exclusionFixes(w, nss)
	var out []Finding
	for _, k := range order {
		hs := byKey[k]
		var names []string
		var v verdict
		for i, h := range hs {
			names = append(names, h.dep.Workload.String())
			if i == 0 || (len(v.unsure) > 0 && len(h.v.unsure) == 0) {
				v = h.v // the surest verdict stands for the group
			}
		}
		role := roleName(k.role)
		if k.role == DependencyCertIssuer {
			role += " " + issuer
		}
		what := fmt.Sprintf("The webhook intercepts the creation of the pods of %s: %s in namespace %s (%s by %s); namespace %s matches its namespaceSelector %s",
			role, joinListed(names), k.ns, v.obj.Request, v.obj.User.Name, k.ns, selectorString(w.NamespaceSelector))
		if !selectorMatchesEmpty(w.ObjectSelector) {
			what += fmt.Sprintf(" and their labels its objectSelector %s", selectorString(w.ObjectSelector))
		}
		what += "."
		sev := SeverityError
		var why string
		switch k.role {
		case DependencyCNI:
			why = "failurePolicy is Fail and the webhook's pods run on the pod network, which this CNI provides: on a node where its pods are gone (a new or replaced node, a cluster restart, a CNI upgrade) no pod gets a network, the webhook's own pods included, and while no webhook pod answers the API server rejects the creation of the CNI pods that would provide it (kueue #4074 on MicroShift, topolvm #57 with Calico): neither can start."
		case DependencyDNS:
			// The API server calls the webhook by endpoint IP, and the
			// webhook reaches the API server by KUBERNETES_SERVICE_HOST:
			// admission itself needs no cluster DNS. Only what the webhook
			// does at start-up might.
			sev = SeverityWarning
			why = "failurePolicy is Fail: while the webhook is down, cluster DNS pods cannot be recreated, so every pod resolving Service names (controllers, probes, the webhook's own start-up if it calls anything by name) degrades with them. The API server reaches the webhook by endpoint IP, so this is a deadlock only for webhooks that need DNS to start: a warning."
		case DependencyCertIssuer:
			why = fmt.Sprintf("failurePolicy is Fail and the configuration's caBundle is injected by %s (annotation %s): its serving certificate is issued and its caBundle injected by these pods. If the certificate expires, or its Secret is lost (re-install, a namespace recreated), while the webhook is down, the webhook cannot get a certificate until %s runs, and %s's pods cannot be created until the webhook answers.", issuer, annotation, issuer, issuer)
		}
		out = append(out, Finding{ID: IDDependencyDeadlock, Severity: severityFor(sev, v), What: describeVerdict(what, v), Why: why, Fix: fixes[k.ns]})
	}
	return out
}

// exclusionFixes returns, for each namespace of nss, the fix that stops w
// matching it: the kubectl label command NamespaceExclusion finds, else
// one JSON patch adding a single "kubernetes.io/metadata.name NotIn
// [...]" requirement with every namespace that needs one (separate
// patches that each replace a namespaceSelector without matchExpressions
// would undo one another).
func (r *run) exclusionFixes(w *Webhook, nss []string) map[string]string {
	fixes := map[string]string{}
	var patchNS []string
	for _, n := range nss {
		if _, done := fixes[n]; done || slices.Contains(patchNS, n) {
			continue
		}
		if fix, ok := NamespaceExclusion(w.NamespaceSelector, n, r.namespaces[n], nil); ok {
			fixes[n] = fix
		} else {
			patchNS = append(patchNS, n)
		}
	}
	patch := ""
	switch len(patchNS) {
	case 0:
	case 1:
		patch = excludeNamespacePatch(w, patchNS[0])
	default:
		patch = excludeNamespacesPatch(w, patchNS) + "  # excludes " + strings.Join(slices.Sorted(slices.Values(patchNS)), ", ") + " at once"
	}
	for _, n := range patchNS {
		fixes[n] = patch
	}
	return fixes
}

// excludeNamespacesPatch is excludeNamespacePatch for several namespaces
// in one requirement.
func excludeNamespacesPatch(w *Webhook, nss []string) string {
	req := metav1.LabelSelectorRequirement{Key: metadataNameLabel, Operator: metav1.LabelSelectorOpNotIn, Values: slices.Sorted(slices.Values(nss))}
	var op map[string]any
	if len(w.NamespaceSelector.MatchExpressions) > 0 {
		op = map[string]any{"op": "add", "path": fmt.Sprintf("/webhooks/%d/namespaceSelector/matchExpressions/-", w.Index), "value": req}
	} else {
		sel := w.NamespaceSelector.DeepCopy()
		sel.MatchExpressions = []metav1.LabelSelectorRequirement{req}
		op = map[string]any{"op": "add", "path": fmt.Sprintf("/webhooks/%d/namespaceSelector", w.Index), "value": sel}
	}
	return jsonPatchCommand(w, []map[string]any{op})
}

func roleName(role string) string {
	switch role {
	case DependencyCNI:
		return "the CNI"
	case DependencyDNS:
		return "cluster DNS"
	default:
		return "the certificate issuer"
	}
}

// ownsDependency reports whether d's pods are the webhook's own: its
// Service, in d's namespace, selects d's pod template.
func ownsDependency(own *Backend, d Dependency) bool {
	if own == nil || own.Service == nil || own.Namespace != d.Namespace || len(own.Service.Spec.Selector) == 0 {
		return false
	}
	return labels.SelectorFromSet(own.Service.Spec.Selector).Matches(labels.Set(d.Labels))
}

// hostNetworkOnly reports whether every pod (live or modelled) behind the
// webhook's Service runs on the host network, and there is at least one.
func hostNetworkOnly(b *Backend) bool {
	if b == nil || len(b.Pods)+len(b.Templates) == 0 {
		return false
	}
	for _, p := range b.Pods {
		if !p.Spec.HostNetwork {
			return false
		}
	}
	for _, t := range b.Templates {
		if !t.Spec.HostNetwork {
			return false
		}
	}
	return true
}

// dependencyWorkloads lists the workloads LoadSnapshot reads for
// DependenciesFrom: pointers into the lists (nil lists are fine).
func dependencyWorkloads(ds *appsv1.DaemonSetList, deps *appsv1.DeploymentList) ([]*appsv1.DaemonSet, []*appsv1.Deployment) {
	var outDS []*appsv1.DaemonSet
	var outDep []*appsv1.Deployment
	if ds != nil {
		for i := range ds.Items {
			outDS = append(outDS, &ds.Items[i])
		}
	}
	if deps != nil {
		for i := range deps.Items {
			outDep = append(outDep, &deps.Items[i])
		}
	}
	return outDS, outDep
}

// loadDependencies fills Dependencies and DependenciesKnown: DaemonSets and
// Deployments listed in all namespaces, and the cluster DNS Services read
// by name, through DependenciesFrom. A refused list becomes a cluster-wide
// AccessGap; a DNS Service that cannot be read (absent, as
// openshift-dns/dns-default is outside OpenShift, or forbidden) leaves its
// default label in use, with no gap: it only refines the selector.
//
// Errors: a list or get failed with anything but Forbidden/not served/not
// found (wrapped).
func (s *Snapshot) loadDependencies(ctx context.Context, cs kubernetes.Interface) error {
	known := true
	dsl, err := cs.AppsV1().DaemonSets(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	switch {
	case isAccessGap(err):
		known, dsl = false, nil
		s.Gaps = append(s.Gaps, newGap("list", "daemonsets", "apps", "", err,
			"which DaemonSets run the CNI or cluster DNS: "+IDDependencyDeadlock+" (a webhook intercepting the pods its recovery depends on) saw only Deployments"))
	case err != nil:
		return fmt.Errorf("list DaemonSets in all namespaces: %w", err)
	}
	dl, err := cs.AppsV1().Deployments(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	switch {
	case isAccessGap(err):
		known, dl = false, nil
		s.Gaps = append(s.Gaps, newGap("list", "deployments", "apps", "", err,
			"which Deployments run cluster DNS or the certificate issuer (cert-manager): "+IDDependencyDeadlock+" (a webhook intercepting the pods its recovery depends on) saw only DaemonSets"))
	case err != nil:
		return fmt.Errorf("list Deployments in all namespaces: %w", err)
	}
	var svcs []*corev1.Service
	for _, d := range clusterDNS {
		sv, err := cs.CoreV1().Services(d.Namespace).Get(ctx, d.Name, metav1.GetOptions{})
		switch {
		case err == nil:
			svcs = append(svcs, sv)
		case apierrors.IsNotFound(err), isAccessGap(err):
		default:
			return fmt.Errorf("get service %s/%s: %w", d.Namespace, d.Name, err)
		}
	}
	ds, deps := dependencyWorkloads(dsl, dl)
	s.Dependencies, s.DependenciesKnown = DependenciesFrom(ds, deps, svcs), known
	return nil
}
