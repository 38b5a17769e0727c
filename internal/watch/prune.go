package watch

import (
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/kadmit/kadmit/internal/clustercache"
)

// The fields of pods and workloads the watch's checks read
// (internal/doctor: cluster.go resolveOwner, addTemplates, objects,
// podInfos; doctor.go checkTargetPort) in a namespace holding a webhook
// Service: labels and owner references to find the pods a webhook Service
// selects and their owners, and the pod spec, which checkTargetPort reads
// (container ports) and matchConditions see whole as object.spec
// (podBody). Elsewhere the checks read nothing of them; the informers'
// event handlers read the namespace, and labels and owner references are
// kept (the "labels and owner references only"). Annotations,
// status and managedFields are never read and never kept.
var (
	podPruner = clustercache.NewPruner(false,
		clustercache.P("metadata", "labels"),
		clustercache.P("metadata", "ownerReferences"),
		clustercache.P("spec"),
	)
	workloadPruner = clustercache.NewPruner(false,
		clustercache.P("metadata", "labels"),
		clustercache.P("metadata", "ownerReferences"),
		clustercache.P("spec", "selector"),
		clustercache.P("spec", "template", "metadata", "labels"),
		clustercache.P("spec", "template", "spec"),
	)
	elsewherePruner = clustercache.NewPruner(false,
		clustercache.P("metadata", "labels"),
		clustercache.P("metadata", "ownerReferences"),
	)
	podTransform       = podPruner.Transform()
	workloadTransform1 = workloadPruner.Transform()
	elsewhereTransform = elsewherePruner.Transform()
)

// workloadTransform is the transform of the workload informers
// (workloads.go): pods and workloads in specNS keep the fields above,
// elsewhere labels and owner references.
func workloadTransform(specNS map[string]bool) cache.TransformFunc {
	return func(o any) (any, error) {
		m, ok := o.(metav1.Object)
		if !ok {
			return o, nil
		}
		if !specNS[m.GetNamespace()] {
			return elsewhereTransform(o)
		}
		switch o.(type) {
		case *corev1.Pod:
			return podTransform(o)
		case *appsv1.ReplicaSet, *appsv1.Deployment, *appsv1.StatefulSet, *appsv1.DaemonSet:
			return workloadTransform1(o)
		}
		return o, nil
	}
}

// transform is the transform of the other informers: they lose only
// their managedFields (clustercache's whole-object pruner).
var transform = clustercache.NewPruner(true).Transform()
