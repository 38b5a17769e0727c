package apidefaults

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// The pod mutations of the default-on admission plugins, re-created on the
// v1 types from k8s.io/kubernetes v1.37.1 (paths below are in that module).
// Upstream they run on internal types inside the API server, with
// informers and a client; only the part that needs no cluster state is
// here, and docs/policies-cel.md says what is left out.

// ServiceAccount: plugin/pkg/admission/serviceaccount/admission.go.
const (
	// defaultServiceAccountName: admission.go:46.
	defaultServiceAccountName = "default"
	// serviceAccountVolumeName: admission.go:53; the volume is named with
	// this prefix, a dash and five random characters (admission.go:432-434,
	// names.SimpleNameGenerator, k8s.io/apiserver v0.37.1
	// pkg/storage/names/generate.go:53, from the alphabet
	// bcdfghjklmnpqrstvwxz2456789 of k8s.io/apimachinery
	// pkg/util/rand/rand.go:83). Offline the suffix is fixed, so that runs
	// are reproducible, and holds an "a", which the server never
	// generates: a policy or test must not depend on the name.
	serviceAccountVolumeName = "kube-api-access"
	TokenVolumeName          = serviceAccountVolumeName + "-kadmt"
	// defaultAPITokenMountPath: admission.go:57.
	defaultAPITokenMountPath = "/var/run/secrets/kubernetes.io/serviceaccount"
	// tokenExpirationSeconds: pkg/serviceaccount/claims.go:43
	// WarnOnlyBoundTokenExpirationSeconds.
	tokenExpirationSeconds = 60*60 + 7
)

// admitServiceAccount is ServiceAccount's Admit on CREATE
// (admission.go:138-177) for a service account that exists with no
// automountServiceAccountToken and no imagePullSecrets, which is what
// the service account controller creates as "default" in every namespace.
// Offline there is no ServiceAccount to look up: a pod naming another
// service account is treated the same way (the server would deny the pod
// if it does not exist, and use its automount and imagePullSecrets).
func admitServiceAccount(pod *corev1.Pod) {
	// A mirror pod's spec is left alone (admission.go:150-153).
	if _, mirror := pod.Annotations[corev1.MirrorPodAnnotationKey]; mirror {
		return
	}
	// admission.go:155-160.
	if pod.Spec.ServiceAccountName == "" {
		pod.Spec.ServiceAccountName = defaultServiceAccountName
		pod.Spec.DeprecatedServiceAccount = defaultServiceAccountName //nolint:staticcheck // kept in sync as upstream does
	}
	// shouldAutomount, admission.go:256-268: the pod's preference, then
	// the service account's (none here), then true.
	if pod.Spec.AutomountServiceAccountToken != nil && !*pod.Spec.AutomountServiceAccountToken {
		return
	}
	mountServiceAccountToken(pod)
}

// mountServiceAccountToken is admission.go:418-483.
func mountServiceAccountToken(pod *corev1.Pod) {
	tokenVolumeName, hasTokenVolume := "", false
	for _, v := range pod.Spec.Volumes {
		if strings.HasPrefix(v.Name, serviceAccountVolumeName+"-") {
			tokenVolumeName, hasTokenVolume = v.Name, true
			break
		}
	}
	if tokenVolumeName == "" {
		tokenVolumeName = TokenVolumeName
	}
	mount := corev1.VolumeMount{Name: tokenVolumeName, ReadOnly: true, MountPath: defaultAPITokenMountPath}
	needsTokenVolume := false
	// Init containers, then containers; a container that already mounts
	// something at the path is left alone.
	for _, cs := range []*[]corev1.Container{&pod.Spec.InitContainers, &pod.Spec.Containers} {
		for i := range *cs {
			c := &(*cs)[i]
			mounted := false
			for _, m := range c.VolumeMounts {
				if m.MountPath == defaultAPITokenMountPath {
					mounted = true
					break
				}
			}
			if !mounted {
				c.VolumeMounts = append(c.VolumeMounts, mount)
				needsTokenVolume = true
			}
		}
	}
	if !hasTokenVolume && needsTokenVolume {
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{
			Name:         tokenVolumeName,
			VolumeSource: corev1.VolumeSource{Projected: tokenVolumeSource()},
		})
	}
}

// tokenVolumeSource is TokenVolumeSource, admission.go:487-527.
func tokenVolumeSource() *corev1.ProjectedVolumeSource {
	mode := corev1.ProjectedVolumeSourceDefaultMode
	expiration := int64(tokenExpirationSeconds)
	return &corev1.ProjectedVolumeSource{
		DefaultMode: &mode,
		Sources: []corev1.VolumeProjection{
			{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: &expiration}},
			{ConfigMap: &corev1.ConfigMapProjection{
				LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"},
				Items:                []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}},
			}},
			{DownwardAPI: &corev1.DownwardAPIProjection{
				Items: []corev1.DownwardAPIVolumeFile{{
					Path:     "namespace",
					FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"},
				}},
			}},
		},
	}
}

// admitPriority is Priority's admitPod (plugin/pkg/admission/priority/
// admission.go:150-200) for a cluster without a global default
// PriorityClass, which is all kadmit can know offline:
//   - UPDATE keeps the old pod's priority and preemptionPolicy when the
//     new pod has none (admission.go:159-172);
//   - CREATE without priorityClassName resolves to priority 0
//     (getDefaultPriority, admission.go:347-357,
//     pkg/apis/scheduling/types.go:28 DefaultPriorityWhenNoDefaultClassExists)
//     and preemptionPolicy PreemptLowerPriority;
//   - CREATE with a priorityClassName is left alone: the class's value is
//     cluster state (the server denies a pod naming a class that does not
//     exist or whose priority differs from the class's).
//
// The server denies a pod whose priority is set and differs from the
// resolved one (admission.go:184-186); kadmit leaves that to the server.
func admitPriority(op string, pod, old *corev1.Pod) {
	switch op {
	case Update:
		if old == nil {
			return
		}
		if pod.Spec.Priority == nil && old.Spec.Priority != nil {
			p := *old.Spec.Priority
			pod.Spec.Priority = &p
		}
		if pod.Spec.PreemptionPolicy == nil && old.Spec.PreemptionPolicy != nil {
			p := *old.Spec.PreemptionPolicy
			pod.Spec.PreemptionPolicy = &p
		}
	case Create:
		if pod.Spec.PriorityClassName != "" {
			return
		}
		// A priority or preemptionPolicy already set is kept: equal to
		// the resolved one it is what the server sets, different the
		// server denies the pod.
		if pod.Spec.Priority == nil {
			priority := int32(0)
			pod.Spec.Priority = &priority
		}
		if pod.Spec.PreemptionPolicy == nil {
			policy := corev1.PreemptLowerPriority
			pod.Spec.PreemptionPolicy = &policy
		}
	}
}

// notReady and unreachable are DefaultTolerationSeconds' tolerations
// (plugin/pkg/admission/defaulttolerationseconds/admission.go:44-45,
// 99-110: the flags --default-not-ready-toleration-seconds and
// --default-unreachable-toleration-seconds at their default, 300).
const defaultTolerationSeconds = int64(300)

// admitDefaultTolerationSeconds is DefaultTolerationSeconds' Admit
// (admission.go:125-164): a pod that does not tolerate the not-ready or
// unreachable NoExecute taint (a toleration with that key or no key, and
// effect NoExecute or none) gets one for 300 s, appended.
func admitDefaultTolerationSeconds(pod *corev1.Pod) {
	notReady, unreachable := false, false
	for _, t := range pod.Spec.Tolerations {
		anyEffect := t.Effect == corev1.TaintEffectNoExecute || t.Effect == ""
		if (t.Key == corev1.TaintNodeNotReady || t.Key == "") && anyEffect {
			notReady = true
		}
		if (t.Key == corev1.TaintNodeUnreachable || t.Key == "") && anyEffect {
			unreachable = true
		}
	}
	for _, add := range []struct {
		key  string
		done bool
	}{{corev1.TaintNodeNotReady, notReady}, {corev1.TaintNodeUnreachable, unreachable}} {
		if add.done {
			continue
		}
		seconds := defaultTolerationSeconds
		pod.Spec.Tolerations = append(pod.Spec.Tolerations, corev1.Toleration{
			Key: add.key, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: &seconds,
		})
	}
}

// admitStorageObjectInUseProtection is StorageObjectInUseProtection's Admit
// on CREATE (plugin/pkg/admission/storage/storageobjectinuseprotection/
// admission.go:55,70-130): a PersistentVolume gets the finalizer
// kubernetes.io/pv-protection, a PersistentVolumeClaim
// kubernetes.io/pvc-protection (pkg/volume/util/finalizer.go:21,24),
// appended unless present. Its VolumeAttributesClass case is in
// storage.k8s.io, a group apidefaults does not decode.
func admitStorageObjectInUseProtection(obj runtime.Object) {
	var meta *metav1.ObjectMeta
	var finalizer string
	switch o := obj.(type) {
	case *corev1.PersistentVolume:
		meta, finalizer = &o.ObjectMeta, "kubernetes.io/pv-protection"
	case *corev1.PersistentVolumeClaim:
		meta, finalizer = &o.ObjectMeta, "kubernetes.io/pvc-protection"
	default:
		return
	}
	if !slices.Contains(meta.Finalizers, finalizer) {
		meta.Finalizers = append(meta.Finalizers, finalizer)
	}
}

// admitTaintNodesByCondition is TaintNodesByCondition's Admit on CREATE
// (plugin/pkg/admission/nodetaint/admission.go:45,63-95): a new node gets
// the taint node.kubernetes.io/not-ready:NoSchedule, appended unless a
// taint with that key and effect is there (pkg/apis/core/taint.go:26
// MatchTaint), until the node controller finds it ready.
func admitTaintNodesByCondition(node *corev1.Node) {
	for _, t := range node.Spec.Taints {
		if t.Key == corev1.TaintNodeNotReady && t.Effect == corev1.TaintEffectNoSchedule {
			return
		}
	}
	node.Spec.Taints = append(node.Spec.Taints, corev1.Taint{Key: corev1.TaintNodeNotReady, Effect: corev1.TaintEffectNoSchedule})
}
