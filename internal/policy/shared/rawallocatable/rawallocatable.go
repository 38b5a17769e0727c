// Package rawallocatable holds the kadmit.io/raw-allocatable node
// annotation, the one piece of state two node policies from different
// origins share: the seed's node-overcommit writes it when it amplifies a
// node, and Koordinator's node-amplification reads it so that it does not
// amplify the same resource a second time. Keeping it here lets neither
// policy import the other.
package rawallocatable

import corev1 "k8s.io/api/core/v1"

// Annotation records the kubelet's raw values of the resources
// node-overcommit amplified, as JSON
// {"allocatable":{"cpu":"3500m"},"capacity":{"cpu":"4"}}.
const Annotation = "kadmit.io/raw-allocatable"

// Values is the content of Annotation: the kubelet's own values of the
// amplified resources, as Quantity strings keyed by resource name.
type Values struct {
	Allocatable map[corev1.ResourceName]string `json:"allocatable"`
	Capacity    map[corev1.ResourceName]string `json:"capacity"`
}
