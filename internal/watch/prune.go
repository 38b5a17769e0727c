package watch

import (
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/kadmit/kadmit/internal/clustercache"
)

// The fields of cluster-wide pods and workloads the watch's checks read
// (internal/doctor: cluster.go resolveOwner, addTemplates, objects,
// podInfos; doctor.go checkTargetPort): labels and owner references to find
// the pods a webhook Service selects and their owners, and the pod spec,
// which checkTargetPort reads (container ports) and matchConditions see
// whole as object.spec (podBody). Annotations, status and managedFields are
// never read and are not kept.
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
	podTransform      = podPruner.Transform()
	workloadTransform = workloadPruner.Transform()
)

// transform is the watch's informer transform: pods and workloads keep
// the fields above; every other object only loses its managedFields.
func transform(o any) (any, error) {
	switch o.(type) {
	case *corev1.Pod:
		return podTransform(o)
	case *appsv1.ReplicaSet, *appsv1.Deployment, *appsv1.StatefulSet, *appsv1.DaemonSet:
		return workloadTransform(o)
	case cache.DeletedFinalStateUnknown:
		return o, nil
	}
	if m, ok := o.(metav1.ObjectMetaAccessor); ok {
		m.GetObjectMeta().SetManagedFields(nil)
	}
	return o, nil
}
