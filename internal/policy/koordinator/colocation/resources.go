package colocation

import (
	"fmt"
	"maps"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/kadmit/kadmit/internal/jsonedit"
	"github.com/kadmit/kadmit/internal/quantity"
)

// containerResources is the part of a container the translation reads.
type containerResources struct {
	Name      string `json:"name"`
	Resources struct {
		Limits   quantity.List `json:"limits"`
		Requests quantity.List `json:"requests"`
	} `json:"resources"`
}

// translateResources is mutatePodResourceSpec
// (pkg/webhook/pod/mutating/cluster_colocation_profile.go:256-296) on the
// pod as the profiles left it (labels, priority): for a pod whose priority
// class (GetPodPriorityClassWithDefault, apis/extension/priority_utils.go:37-44)
// is koord-batch or koord-mid, the cpu and memory of every init and regular
// container's requests and limits and of spec.overhead move to the class's
// resources, cpu in milli-cores (500m -> 500, 2 -> 2k), memory unchanged;
// then a container with a translated limit and no request of it gets the
// limit as request (restrictResourceRequestAndLimit, lines 298-312).
//
// The containers are decoded only when the class needs a translation, and
// only for a pod with no class and no QoS label that has cpu or memory
// overhead does the Kubernetes QoS class have to be computed.
//
// It returns the regular containers' lists as translated, nil when nothing
// was translated.
func translateResources(doc *jsonedit.Doc, labels map[string]string, priority *int32) ([]containerLists, error) {
	pc := priorityRaw(labels, priority)
	var overhead quantity.List
	if pc == PriorityNone {
		if q := qosRaw(labels); q != QoSNone {
			pc = priorityForQoS(q)
		} else {
			// Kubernetes QoS: Guaranteed -> LSR and Burstable -> LS are
			// koord-prod; BestEffort -> BE is koord-batch
			// (qos_utils.go:44-55). A BestEffort pod has no cpu or memory
			// in its containers, so only its overhead can change.
			if _, err := doc.Decode(&overhead, "spec", "overhead"); err != nil {
				return nil, err
			}
			_, cpu := overhead[corev1.ResourceCPU]
			_, mem := overhead[corev1.ResourceMemory]
			if !cpu && !mem {
				return nil, nil
			}
			be, err := bestEffort(doc)
			if err != nil || !be {
				return nil, err
			}
			pc = PriorityBatch
		}
	}
	cpuName, memName, ok := resourceNames(pc)
	if !ok {
		return nil, nil
	}
	var out []containerLists
	for _, list := range []string{"initContainers", "containers"} {
		var cs []containerResources
		if _, err := doc.Decode(&cs, "spec", list); err != nil {
			return nil, err
		}
		for i := range cs {
			r := &cs[i].Resources
			req, lim := translateList(r.Requests, cpuName, memName), translateList(r.Limits, cpuName, memName)
			for _, name := range []corev1.ResourceName{cpuName, memName} {
				if _, has := req[name]; !has {
					if q, ok := lim[name]; ok {
						if req == nil {
							req = corev1.ResourceList{}
						}
						req[name] = q
					}
				}
			}
			base := []string{"spec", list, strconv.Itoa(i), "resources"}
			if err := writeList(doc, append(slices.Clone(base), "requests"), r.Requests, req); err != nil {
				return nil, err
			}
			if err := writeList(doc, append(slices.Clone(base), "limits"), r.Limits, lim); err != nil {
				return nil, err
			}
			if list == "containers" {
				out = append(out, containerLists{name: cs[i].Name, req: req, lim: lim})
			}
		}
	}
	if overhead == nil {
		if _, err := doc.Decode(&overhead, "spec", "overhead"); err != nil {
			return nil, err
		}
	}
	if out == nil {
		out = []containerLists{}
	}
	return out, writeList(doc, []string{"spec", "overhead"}, overhead, translateList(overhead, cpuName, memName))
}

// containerLists is a regular container's requests and limits.
type containerLists struct {
	name     string
	req, lim corev1.ResourceList
}

// translateList is replaceAndEraseResource (cluster_colocation_profile.go:283-296)
// for cpu and memory on a copy of l.
func translateList(l quantity.List, cpuName, memName corev1.ResourceName) corev1.ResourceList {
	if l == nil {
		return nil
	}
	out := corev1.ResourceList(maps.Clone(l))
	if q, ok := out[corev1.ResourceCPU]; ok {
		out[cpuName] = *resource.NewQuantity(q.MilliValue(), resource.DecimalSI)
		delete(out, corev1.ResourceCPU)
	}
	if q, ok := out[corev1.ResourceMemory]; ok {
		out[memName] = q
		delete(out, corev1.ResourceMemory)
	}
	return out
}

// writeList states have -> want as operations on the resource list at path:
// removals, then additions and changed values, in name order.
func writeList(doc *jsonedit.Doc, path []string, have quantity.List, want corev1.ResourceList) error {
	for _, k := range slices.Sorted(maps.Keys(have)) {
		if _, ok := want[k]; !ok {
			if err := doc.Remove(append(slices.Clone(path), string(k))...); err != nil {
				return err
			}
		}
	}
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if q, ok := have[k]; ok && q.Cmp(want[k]) == 0 {
			continue
		}
		if err := doc.Set(want[k], append(slices.Clone(path), string(k))...); err != nil {
			return err
		}
	}
	return nil
}

// bestEffort is Kubernetes' BestEffort QoS test (k8s.io/kubectl
// pkg/util/qos.GetPodQOS): no init or regular container, and no pod-level
// resources, requests or limits a positive cpu or memory.
func bestEffort(doc *jsonedit.Doc) (bool, error) {
	positive := func(l quantity.List) bool {
		for _, n := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			if q, ok := l[n]; ok && q.Sign() > 0 {
				return true
			}
		}
		return false
	}
	for _, list := range []string{"initContainers", "containers"} {
		var cs []containerResources
		if _, err := doc.Decode(&cs, "spec", list); err != nil {
			return false, err
		}
		for _, c := range cs {
			if positive(c.Resources.Requests) || positive(c.Resources.Limits) {
				return false, nil
			}
		}
	}
	var pod containerResources
	if _, err := doc.Decode(&pod.Resources, "spec", "resources"); err != nil {
		return false, fmt.Errorf("spec.resources: %w", err)
	}
	return !positive(pod.Resources.Requests) && !positive(pod.Resources.Limits), nil
}
