// Package podrequest computes what a pod asks the scheduler for, with the
// rule the kube-scheduler and the kubelet use, so that quota checks in
// kadmit's policies count exactly what the cluster will reserve.
package podrequest

import (
	"gopkg.in/inf.v0"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// ContainerRequests returns c's requests, with a limit standing in for a
// missing request of the same resource: the API server defaults requests to
// limits on create, but an offline manifest has not been defaulted yet.
func ContainerRequests(c *corev1.Container) corev1.ResourceList {
	out := corev1.ResourceList{}
	for name, q := range c.Resources.Limits {
		out[name] = q.DeepCopy()
	}
	for name, q := range c.Resources.Requests {
		out[name] = q.DeepCopy()
	}
	return out
}

// Effective returns the pod's effective request per resource:
//
//	max( sum(regular containers) + sum(restartable init containers),
//	     max over init containers i of the request of i plus the restartable
//	     init containers (sidecars) started before i )
//	+ spec.overhead
//
// A sidecar (an init container with restartPolicy Always) keeps running after
// it starts, so it adds to every later init container and to the regular
// containers; a plain init container runs alone with the sidecars before it.
// When spec.resources.requests (pod-level resources) sets a resource, that
// value replaces the container aggregate for it. The result is a new list.
func Effective(spec *corev1.PodSpec) corev1.ResourceList {
	sidecars := corev1.ResourceList{}
	initMax := corev1.ResourceList{}
	for i := range spec.InitContainers {
		c := &spec.InitContainers[i]
		req := ContainerRequests(c)
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			Add(sidecars, req)
			// While it starts, the sidecar runs with the earlier ones.
			maxInto(initMax, sidecars)
			continue
		}
		running := sidecars.DeepCopy()
		Add(running, req)
		maxInto(initMax, running)
	}
	out := corev1.ResourceList{}
	for i := range spec.Containers {
		Add(out, ContainerRequests(&spec.Containers[i]))
	}
	Add(out, sidecars)
	maxInto(out, initMax)
	if spec.Resources != nil {
		for name, q := range spec.Resources.Requests {
			out[name] = q.DeepCopy()
		}
	}
	Add(out, spec.Overhead)
	return out
}

// Add adds every quantity of b to a, in place.
func Add(a, b corev1.ResourceList) {
	for name, q := range b {
		cur := a[name]
		cur.Add(q)
		a[name] = cur
	}
}

// Scale returns l with every quantity multiplied by n (n >= 0), exactly:
// the product is computed on inf.Dec, so a bounded quantity (see
// internal/quantity) times a job's parallelism never wraps around int64.
func Scale(l corev1.ResourceList, n int64) corev1.ResourceList {
	out := corev1.ResourceList{}
	for name, q := range l {
		d := new(inf.Dec).Mul(q.AsDec(), inf.NewDec(n, 0))
		out[name] = *resource.NewDecimalQuantity(*d, q.Format)
	}
	return out
}

func maxInto(a, b corev1.ResourceList) {
	for name, q := range b {
		if cur, ok := a[name]; !ok || q.Cmp(cur) > 0 {
			a[name] = q.DeepCopy()
		}
	}
}
