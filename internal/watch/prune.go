package watch

import (
	"slices"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/tools/cache"

	"github.com/kadmit/kadmit/internal/clustercache"
)

// The fields of pods and workloads the watch's checks read
// (internal/doctor: cluster.go resolveOwner, addTemplates, objects,
// podInfos; doctor.go checkTargetPort). Of a pod a webhook Service
// selects (podCache, workloads.go): labels and owner references, to find
// its owners, and the pod spec, which checkTargetPort reads (container
// ports) and matchConditions see whole as object.spec (podBody); of the
// status only the pod's node addresses (KD107, netpol.go: the API server's
// calls from the pod's own node are never isolated). Of any other pod
// nothing but its identity (prunePod). Workloads keep their template's
// spec only when a webhook Service selects it or may select its pods
// (workloadTransform).
// Annotations, the rest of the status and managedFields are never read
// and never kept.
var (
	workloadPruner = clustercache.NewPruner(false,
		clustercache.P("metadata", "labels"),
		clustercache.P("metadata", "ownerReferences"),
		clustercache.P("spec", "selector"),
		clustercache.P("spec", "template", "metadata", "labels"),
		clustercache.P("spec", "template", "spec"),
	)
	// A workload whose template no webhook Service selects keeps its
	// labels and owner references (a pod's owner chain), its selector (a
	// Deployment's confirms an owner inferred from a name, resolveOwner) and
	// its template's labels (which a webhook Service's selector is matched
	// against, addTemplates; KD506 reads them of Deployments and DaemonSets
	// in any namespace: the CNI's DaemonSet, cluster DNS, cert-manager).
	unselectedPruner = clustercache.NewPruner(false,
		clustercache.P("metadata", "labels"),
		clustercache.P("metadata", "ownerReferences"),
		clustercache.P("spec", "selector"),
		clustercache.P("spec", "template", "metadata", "labels"),
	)
	// DaemonSets also keep what doctor.DependenciesFrom reads of them
	// cluster-wide: hostNetwork and the hostPath of each volume; a few
	// hundred bytes each.
	unselectedDaemonSetPruner = clustercache.NewPruner(false,
		clustercache.P("metadata", "labels"),
		clustercache.P("metadata", "ownerReferences"),
		clustercache.P("spec", "selector"),
		clustercache.P("spec", "template", "metadata", "labels"),
		clustercache.P("spec", "template", "spec", "hostNetwork"),
		clustercache.P("spec", "template", "spec", "volumes", "hostPath"),
	)
	workloadTransform1           = workloadPruner.Transform()
	unselectedTransform          = unselectedPruner.Transform()
	unselectedDaemonSetTransform = unselectedDaemonSetPruner.Transform()
)

// workloadTransform is the transform of the workload informers
// (workloads.go). A workload keeps the fields workloadPruner keeps, its
// template's spec included (matchConditions see it as object.spec of the
// pods it would create, addTemplates; KD203 reads its preStop), when sel
// selects its template (by the template's labels, in its namespace) or may
// select pods it owns: its selector does not contradict a selector of sel
// (mayOwnSelected; a Deployment whose template's labels changed in a
// rollout still owns the old pods the Service selects, and the checks read
// its template). Any other workload keeps no template spec
// (unselectedPruner).
//
// A ReplicaSet a Deployment controls keeps its template's spec only when
// sel selects it by its pod-template-hash label, which the Deployment's
// template lacks: otherwise the checks read the Deployment's template
// (resolveOwner names the Deployment the pods' workload), and every
// ReplicaSet a rollout leaves behind would hold a second copy. When
// Deployments may not be read (deployments false) ReplicaSets keep theirs.
func workloadTransform(sel podSelection, deployments bool) cache.TransformFunc {
	return func(o any) (any, error) {
		var ns string
		var tpl map[string]string
		var ls *metav1.LabelSelector
		switch w := o.(type) {
		case *appsv1.ReplicaSet:
			if c := metav1.GetControllerOfNoCopy(w); deployments && c != nil && c.Kind == "Deployment" {
				if sel.selects(w.Namespace, w.Spec.Template.Labels) && !sel.selects(w.Namespace, withoutHash(w.Spec.Template.Labels)) {
					return workloadTransform1(o)
				}
				return unselectedTransform(o)
			}
			ns, tpl, ls = w.Namespace, w.Spec.Template.Labels, w.Spec.Selector
		case *appsv1.Deployment:
			ns, tpl, ls = w.Namespace, w.Spec.Template.Labels, w.Spec.Selector
		case *appsv1.StatefulSet:
			ns, tpl, ls = w.Namespace, w.Spec.Template.Labels, w.Spec.Selector
		case *appsv1.DaemonSet:
			if sel.selects(w.Namespace, w.Spec.Template.Labels) || sel.mayOwnSelected(w.Namespace, w.Spec.Selector) {
				return workloadTransform1(o)
			}
			return unselectedDaemonSetTransform(o)
		default:
			return o, nil
		}
		if sel.selects(ns, tpl) || sel.mayOwnSelected(ns, ls) {
			return workloadTransform1(o)
		}
		return unselectedTransform(o)
	}
}

// mayOwnSelected reports whether a workload of namespace ns with selector
// ls may own pods a selector of s selects: some selector of s has no
// requirement ls contradicts (a different matchLabels value for its key,
// an In without its value, a NotIn or DoesNotExist excluding it). It errs
// towards true: a nil or empty ls, or a requirement it does not decide.
func (s podSelection) mayOwnSelected(ns string, ls *metav1.LabelSelector) bool {
	for _, sel := range s[ns] {
		reqs, _ := sel.Requirements()
		ok := true
		for _, r := range reqs {
			if contradicts(r, ls) {
				ok = false
				break
			}
		}
		if ok {
			return true
		}
	}
	return false
}

// contradicts reports whether no pod ls selects can meet r, an equality
// requirement of a Service selector (labels.SelectorFromSet makes only
// those); other requirements never contradict.
func contradicts(r labels.Requirement, ls *metav1.LabelSelector) bool {
	if ls == nil || (r.Operator() != selection.Equals && r.Operator() != selection.DoubleEquals) || r.Values().Len() != 1 {
		return false
	}
	v := r.Values().UnsortedList()[0]
	if mv, ok := ls.MatchLabels[r.Key()]; ok && mv != v {
		return true
	}
	for _, e := range ls.MatchExpressions {
		if e.Key != r.Key() {
			continue
		}
		switch e.Operator {
		case metav1.LabelSelectorOpIn:
			if !slices.Contains(e.Values, v) {
				return true
			}
		case metav1.LabelSelectorOpNotIn:
			if slices.Contains(e.Values, v) {
				return true
			}
		case metav1.LabelSelectorOpDoesNotExist:
			return true
		}
	}
	return false
}

// withoutHash is l without the pod-template-hash label the Deployment
// controller adds to its ReplicaSets' templates: the labels of the
// Deployment's own template.
func withoutHash(l map[string]string) map[string]string {
	if _, ok := l[appsv1.DefaultDeploymentUniqueLabelKey]; !ok {
		return l
	}
	out := make(map[string]string, len(l))
	for k, v := range l {
		if k != appsv1.DefaultDeploymentUniqueLabelKey {
			out[k] = v
		}
	}
	return out
}

// prunePod is the pod cache's transform (workloads.go): a pod sel selects
// becomes a new *corev1.Pod holding its name, namespace, uid,
// resourceVersion, labels, owner references, spec and node addresses
// (keptPod); any other pod a *metav1.PartialObjectMetadata holding its
// name, namespace and resourceVersion (a stub: the store needs a key, the
// pod cache the version to tell a fetched copy current). The spec is
// taken, not copied: the informer hands over a pod it decoded for this
// call. The fields are assigned, not converted through the unstructured
// form (clustercache.Pruner), which would cost more than decoding the pod
// on the initial list of 50,000. Anything else (a tombstone, a stub) is
// returned unchanged, so the transform is idempotent, as client-go asks.
func prunePod(o any, sel podSelection) any {
	p, ok := o.(*corev1.Pod)
	if !ok {
		return o
	}
	if sel.selects(p.Namespace, p.Labels) {
		return keptPod(p)
	}
	return &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, ResourceVersion: p.ResourceVersion}}
}

// keptPod is what the checks read of pod p (see prunePod).
func keptPod(p *corev1.Pod) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion,
			Labels: p.Labels, OwnerReferences: p.OwnerReferences},
		Spec:   p.Spec,
		Status: corev1.PodStatus{HostIP: p.Status.HostIP, HostIPs: p.Status.HostIPs},
	}
}

// transform is the transform of the other informers: they lose only
// their managedFields (clustercache's whole-object pruner).
var transform = clustercache.NewPruner(true).Transform()
