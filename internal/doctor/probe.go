package doctor

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Outcome of one probe, as doctor classifies the API server's answer.
type Outcome struct {
	// ID is the finding ID for this outcome (KD700..KD710).
	ID string
	// Class is a short label: "admitted", "denied", "connection refused",
	// "x509 unknown authority", "x509 SAN mismatch", "x509 expired",
	// "timeout", "no endpoints", "bad response", "inconclusive".
	Class string
	// Detail is the API server's message (empty when admitted).
	Detail string
}

// Classify maps the result of a dry-run create that webhook (by name) should
// have been called for to an Outcome. err nil means admitted. The API
// server's messages look like:
//
//	Internal error occurred: failed calling webhook "NAME": failed to call webhook: Post "https://...": dial tcp 198.18.0.5:9443: connect: connection refused
//	admission webhook "NAME" denied the request: ...
//
// A message naming another webhook, or none, is "inconclusive": something
// else answered before this webhook was called.
func Classify(err error, webhook string) Outcome {
	if err == nil {
		return Outcome{ID: IDProbeAdmitted, Class: "admitted"}
	}
	msg := err.Error()
	quoted := `"` + webhook + `"`
	switch {
	case strings.Contains(msg, "admission webhook "+quoted+" denied the request"):
		return Outcome{IDProbeDenied, "denied", msg}
	case !strings.Contains(msg, "failed calling webhook "+quoted):
		return Outcome{IDProbeInconclusive, "inconclusive", msg}
	case strings.Contains(msg, "connection refused"):
		return Outcome{IDProbeRefused, "connection refused", msg}
	case strings.Contains(msg, "certificate signed by unknown authority"):
		return Outcome{IDProbeUnknownAuthority, "x509 unknown authority", msg}
	case strings.Contains(msg, "x509: certificate is valid for"), strings.Contains(msg, "x509: certificate is not valid for any names"),
		strings.Contains(msg, "certificate relies on legacy Common Name field"):
		return Outcome{IDProbeSANMismatch, "x509 SAN mismatch", msg}
	case strings.Contains(msg, "certificate has expired or is not yet valid"):
		return Outcome{IDProbeCertExpired, "x509 expired", msg}
	case strings.Contains(msg, "no endpoints available for service"):
		return Outcome{IDProbeNoEndpoints, "no endpoints", msg}
	case strings.Contains(msg, "context deadline exceeded"), strings.Contains(msg, "Client.Timeout exceeded"),
		strings.Contains(msg, "i/o timeout"), strings.Contains(msg, "Timeout: request did not complete"):
		return Outcome{IDProbeTimeout, "timeout", msg}
	default:
		return Outcome{IDProbeBadResponse, "bad response", msg}
	}
}

// probeTarget is one resource doctor knows how to build a minimal valid
// object for.
type probeTarget struct {
	Group, Version, Resource string
	Namespaced               bool
}

// probeTargets in order of preference: pods first, since most webhooks
// intercept them and a pod is the cheapest object to validate.
var probeTargets = []probeTarget{
	{"", "v1", "pods", true},
	{"", "v1", "configmaps", true},
	{"", "v1", "secrets", true},
	{"", "v1", "serviceaccounts", true},
	{"", "v1", "services", true},
	{"apps", "v1", "deployments", true},
	{"apps", "v1", "replicasets", true},
	{"apps", "v1", "statefulsets", true},
	{"apps", "v1", "daemonsets", true},
	{"batch", "v1", "jobs", true},
	{"coordination.k8s.io", "v1", "leases", true},
	{"", "v1", "nodes", false},
}

// ProbePlan is what a probe creates (dry-run) for a webhook.
type ProbePlan struct {
	Request   Request
	Namespace string // "" for cluster-scoped
	Labels    map[string]string
}

// planProbe picks a CREATE the webhook intercepts, a namespace its
// namespaceSelector matches (namespaces: name -> labels, preferring
// "default", then any namespace not kube-*), and labels its objectSelector
// matches. It explains why when no probe is possible.
func planProbe(w *Webhook, namespaces map[string]map[string]string) (*ProbePlan, string) {
	if w.SideEffects != admissionregistrationv1.SideEffectClassNone && w.SideEffects != admissionregistrationv1.SideEffectClassNoneOnDryRun {
		return nil, fmt.Sprintf("sideEffects is %q: the API server rejects dry-run requests for it without calling it, so a probe cannot reach it", w.SideEffects)
	}
	objLabels, ok := satisfyingLabels(w.ObjectSelector)
	if !ok {
		return nil, fmt.Sprintf("no label set satisfies objectSelector %s", metav1.FormatLabelSelector(w.ObjectSelector))
	}
	nsNames := make([]string, 0, len(namespaces))
	for n := range namespaces {
		nsNames = append(nsNames, n)
	}
	sort.Slice(nsNames, func(a, b int) bool {
		ra, rb := nsRank(nsNames[a]), nsRank(nsNames[b])
		if ra != rb {
			return ra < rb
		}
		return nsNames[a] < nsNames[b]
	})
	for _, t := range probeTargets {
		req := Request{Group: t.Group, Version: t.Version, Resource: t.Resource, Operation: admissionregistrationv1.Create, Namespaced: t.Namespaced}
		if !RuleMatches(w.Rules, req) {
			continue
		}
		if !t.Namespaced {
			return &ProbePlan{Request: req, Labels: objLabels}, ""
		}
		for _, ns := range nsNames {
			if ok, err := SelectorMatches(w.NamespaceSelector, namespaceLabels(ns, namespaces[ns])); err == nil && ok {
				return &ProbePlan{Request: req, Namespace: ns, Labels: objLabels}, ""
			}
		}
		return nil, fmt.Sprintf("namespaceSelector %s matches no existing namespace", metav1.FormatLabelSelector(w.NamespaceSelector))
	}
	return nil, "its rules intercept no CREATE of a resource doctor can build a minimal object for (pods, configmaps, secrets, serviceaccounts, services, deployments, replicasets, statefulsets, daemonsets, jobs, leases, nodes)"
}

func nsRank(n string) int {
	switch {
	case n == "default":
		return 0
	case strings.HasPrefix(n, "kube-"):
		return 2
	default:
		return 1
	}
}

// satisfyingLabels builds labels that sel matches: matchLabels as given,
// In with its first value, Exists with a placeholder, NotIn and DoesNotExist
// by leaving the key out. ok is false when the result still does not match
// (contradictory requirements).
func satisfyingLabels(sel *metav1.LabelSelector) (map[string]string, bool) {
	out := map[string]string{}
	if sel == nil {
		return out, true
	}
	for k, v := range sel.MatchLabels {
		out[k] = v
	}
	for _, r := range sel.MatchExpressions {
		switch r.Operator {
		case metav1.LabelSelectorOpIn:
			if len(r.Values) > 0 {
				if _, set := out[r.Key]; !set {
					out[r.Key] = r.Values[0]
				}
			}
		case metav1.LabelSelectorOpExists:
			if _, set := out[r.Key]; !set {
				out[r.Key] = "kadmit-doctor"
			}
		}
	}
	ok, err := SelectorMatches(sel, out)
	return out, err == nil && ok
}

// probeName returns a fresh name for a dry-run object: nothing is stored,
// but a unique name keeps the API server from answering AlreadyExists.
func probeName() string {
	const letters = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 6)
	for i := range b {
		b[i] = letters[rand.IntN(len(letters))]
	}
	return "kadmit-doctor-probe-" + string(b)
}

// runProbe dry-runs the creation of plan's object once and returns the API
// server's error (nil when admitted) and the round-trip time. ctx bounds it.
func runProbe(ctx context.Context, cs kubernetes.Interface, plan *ProbePlan) (time.Duration, error) {
	name := probeName()
	meta := metav1.ObjectMeta{Name: name, Namespace: plan.Namespace, Labels: plan.Labels}
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldManager: "kadmit-doctor"}
	sel := map[string]string{"kadmit.io/doctor-probe": name}
	podLabels := map[string]string{"kadmit.io/doctor-probe": name}
	for k, v := range plan.Labels {
		podLabels[k] = v
	}
	podSpec := corev1.PodSpec{Containers: []corev1.Container{{Name: "probe", Image: "registry.k8s.io/pause:3.10"}}}
	template := corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: podLabels}, Spec: podSpec}
	ns := plan.Namespace
	start := time.Now()
	var err error
	switch plan.Request.Resource {
	case "pods":
		_, err = cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: meta, Spec: podSpec}, dry)
	case "configmaps":
		_, err = cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: meta}, dry)
	case "secrets":
		_, err = cs.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: meta}, dry)
	case "serviceaccounts":
		_, err = cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: meta}, dry)
	case "services":
		_, err = cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: meta, Spec: corev1.ServiceSpec{
			Ports: []corev1.ServicePort{{Port: 443}}, Selector: sel,
		}}, dry)
	case "deployments":
		_, err = cs.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{ObjectMeta: meta, Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: sel}, Template: template,
		}}, dry)
	case "replicasets":
		_, err = cs.AppsV1().ReplicaSets(ns).Create(ctx, &appsv1.ReplicaSet{ObjectMeta: meta, Spec: appsv1.ReplicaSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: sel}, Template: template,
		}}, dry)
	case "statefulsets":
		_, err = cs.AppsV1().StatefulSets(ns).Create(ctx, &appsv1.StatefulSet{ObjectMeta: meta, Spec: appsv1.StatefulSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: sel}, Template: template, ServiceName: name,
		}}, dry)
	case "daemonsets":
		_, err = cs.AppsV1().DaemonSets(ns).Create(ctx, &appsv1.DaemonSet{ObjectMeta: meta, Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: sel}, Template: template,
		}}, dry)
	case "jobs":
		jobTemplate := *template.DeepCopy()
		jobTemplate.Spec.RestartPolicy = corev1.RestartPolicyNever
		_, err = cs.BatchV1().Jobs(ns).Create(ctx, &batchv1.Job{ObjectMeta: meta, Spec: batchv1.JobSpec{Template: jobTemplate}}, dry)
	case "leases":
		_, err = cs.CoordinationV1().Leases(ns).Create(ctx, &coordinationv1.Lease{ObjectMeta: meta}, dry)
	case "nodes":
		meta.Namespace = ""
		_, err = cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: meta}, dry)
	default:
		return 0, fmt.Errorf("doctor: no probe object for %s", plan.Request.Resource)
	}
	return time.Since(start), err
}
