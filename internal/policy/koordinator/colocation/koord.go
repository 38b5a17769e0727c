package colocation

import (
	corev1 "k8s.io/api/core/v1"
)

// Koordinator's label, annotation and resource names, as in
// koordinator-sh/koordinator v1.8.0 apis/extension.
const (
	// LabelPodQoS is the pod's Koordinator QoS class (constants.go:33).
	LabelPodQoS = "koordinator.sh/qosClass"
	// LabelPodPriority is the pod's Koordinator sub-priority (constants.go:34).
	LabelPodPriority = "koordinator.sh/priority"
	// LabelPodPriorityClass overrides the priority class derived from
	// spec.priority (constants.go:38).
	LabelPodPriorityClass = "koordinator.sh/priority-class"

	// BatchCPU is in milli-cores: 500m of cpu becomes 500 (resource.go:27,
	// pkg/webhook/pod/mutating/cluster_colocation_profile.go:290-292).
	BatchCPU corev1.ResourceName = "kubernetes.io/batch-cpu"
	// BatchMemory is in bytes, like memory (resource.go:28).
	BatchMemory corev1.ResourceName = "kubernetes.io/batch-memory"
	// MidCPU and MidMemory are koord-mid's resources (resource.go:29-30).
	MidCPU    corev1.ResourceName = "kubernetes.io/mid-cpu"
	MidMemory corev1.ResourceName = "kubernetes.io/mid-memory"
)

// QoSClass is a Koordinator QoS class (apis/extension/qos.go:19-29).
type QoSClass string

// The Koordinator QoS classes; QoSNone is "no class".
const (
	QoSLSE    QoSClass = "LSE"
	QoSLSR    QoSClass = "LSR"
	QoSLS     QoSClass = "LS"
	QoSBE     QoSClass = "BE"
	QoSSystem QoSClass = "SYSTEM"
	QoSNone   QoSClass = ""
)

// qosByName is GetPodQoSClassByName (qos.go:31): an unknown name is QoSNone.
func qosByName(s string) QoSClass {
	switch q := QoSClass(s); q {
	case QoSLSE, QoSLSR, QoSLS, QoSBE, QoSSystem:
		return q
	}
	return QoSNone
}

// qosRaw is GetPodQoSClassRaw (qos_utils.go:57-70): the label only.
func qosRaw(labels map[string]string) QoSClass {
	if q, ok := labels[LabelPodQoS]; ok {
		return qosByName(q)
	}
	return QoSNone
}

// PriorityClass is a Koordinator priority class (apis/extension/priority.go:25-34).
type PriorityClass string

// The Koordinator priority classes; PriorityNone is "no class".
const (
	PriorityProd  PriorityClass = "koord-prod"
	PriorityMid   PriorityClass = "koord-mid"
	PriorityBatch PriorityClass = "koord-batch"
	PriorityFree  PriorityClass = "koord-free"
	PriorityNone  PriorityClass = ""
)

// priorityByName is GetPodPriorityClassByName (priority.go:60-69).
func priorityByName(s string) PriorityClass {
	switch p := PriorityClass(s); p {
	case PriorityProd, PriorityMid, PriorityBatch, PriorityFree:
		return p
	}
	return PriorityNone
}

// priorityByValue is getPriorityClassByPriority (priority.go:84-101) with
// upstream's default ranges (priority.go:37-49).
func priorityByValue(p *int32) PriorityClass {
	if p == nil {
		return PriorityNone
	}
	switch v := *p; {
	case v >= 9000 && v <= 9999:
		return PriorityProd
	case v >= 7000 && v <= 7999:
		return PriorityMid
	case v >= 5000 && v <= 5999:
		return PriorityBatch
	case v >= 3000 && v <= 3999:
		return PriorityFree
	}
	return PriorityNone
}

// priorityRaw is GetPodPriorityClassRaw (priority.go:71-82): the
// priority-class label when present, else the range spec.priority is in.
func priorityRaw(labels map[string]string, priority *int32) PriorityClass {
	if p, ok := labels[LabelPodPriorityClass]; ok {
		return priorityByName(p)
	}
	return priorityByValue(priority)
}

// defaultPriorityValue is GetDefaultPriorityByPriorityClass
// (priority_utils.go:78-91).
func defaultPriorityValue(p PriorityClass) (int32, bool) {
	switch p {
	case PriorityProd:
		return 9500, true
	case PriorityMid:
		return 7500, true
	case PriorityBatch:
		return 5500, true
	case PriorityFree:
		return 3500, true
	}
	return 0, false
}

// priorityForQoS is GetPodPriorityClassWithQoS (priority_utils.go:50-58).
func priorityForQoS(q QoSClass) PriorityClass {
	switch q {
	case QoSSystem, QoSLSE, QoSLSR, QoSLS:
		return PriorityProd
	case QoSBE:
		return PriorityBatch
	}
	return PriorityNone
}

// resourceNames is ResourceNameMap (resource.go:46-55): the resources cpu
// and memory become for a priority class; none for the others.
func resourceNames(p PriorityClass) (cpu, memory corev1.ResourceName, ok bool) {
	switch p {
	case PriorityBatch:
		return BatchCPU, BatchMemory, true
	case PriorityMid:
		return MidCPU, MidMemory, true
	}
	return "", "", false
}
