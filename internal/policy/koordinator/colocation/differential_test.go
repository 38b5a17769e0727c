package colocation

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kadmit/kadmit/internal/policy/policytest"
)

// diffProfiles are the differential tests' profiles: batch (for qos: be
// pods in namespaces with colocation: on), one that keeps existing values,
// one with an empty selector that matches every pod, one skipped by its
// probability, and 10 more that match by namespace name, each with its own
// label and annotation.
func diffProfiles() []Profile {
	half := intstr.FromString("50%")
	out := []Profile{
		{Name: "batch", NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"colocation": "on"}},
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"qos": "be"}},
			QoSClass: "BE", PriorityClassName: "koord-batch", SchedulerName: "koord-scheduler",
			Annotations:   map[string]string{"note": "batch"},
			Tolerations:   []corev1.Toleration{{Key: "colocation", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
			NodeSelector:  map[string]string{"node-pool": "mixed"},
			LabelSuffixes: map[string]string{"qos": "-x"}},
		{Name: "keep", Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"qos": "be"}}, KeepExisting: true,
			Labels: map[string]string{"koordinator.sh/qosClass": "LS"}, PriorityClassName: "other", KoordinatorPriority: p32(7),
			Annotations: map[string]string{"note": "keep", "h": "<&>"}, SchedulerName: "kept"},
		{Name: "everyone", Labels: map[string]string{"a.example/b-c": "set"}, NodeSelector: map[string]string{"zone": "z1"},
			LabelKeysMapping: map[string]string{"qos": "qos-copy"}, AnnotationKeysMapping: map[string]string{"h": "h-copy"},
			Tolerations: []corev1.Toleration{{Key: "t", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: new(int64(9007199254740993))}}},
		{Name: "never", Probability: &half, Labels: map[string]string{"never": "x"}},
	}
	for i := range 10 {
		out = append(out, Profile{Name: fmt.Sprintf("p%d", i),
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: "mixed"}},
			Labels:            map[string]string{fmt.Sprintf("colocation.example.com/p%d", i): "on"},
			Annotations:       map[string]string{fmt.Sprintf("colocation.example.com/p%d", i): "applied"}})
	}
	return out
}

// withoutAnnotations is ps with no profile setting or mapping annotations.
func withoutAnnotations(ps []Profile) []Profile {
	for i := range ps {
		ps[i].Annotations, ps[i].AnnotationKeysMapping = nil, nil
	}
	return ps
}

// diffPods adds pods with resources to policytest's corpus.
func diffPods(t *testing.T) map[string]string {
	pods := policytest.Pods(t)
	for k, v := range map[string]string{
		"be with resources":   `{"metadata":{"labels":{"qos":"be"}},"spec":{"initContainers":[{"name":"i","resources":{"limits":{"cpu":"500m","memory":"1Gi"}}}],"containers":[{"name":"c","resources":{"requests":{"cpu":"0.25","memory":"1024Mi","nvidia.com/gpu":"1"},"limits":{"cpu":"2","memory":"4Gi"}}},{"name":"d"},{"name":"e","resources":{"requests":{"cpu":"1","kubernetes.io/batch-cpu":"1000"}}}],"overhead":{"cpu":"100m","memory":"10Mi"}}}`,
		"be priority label":   `{"metadata":{"labels":{"koordinator.sh/priority-class":"koord-mid"}},"spec":{"containers":[{"name":"c","resources":{"requests":{"cpu":"1500m"}}}]}}`,
		"best effort":         `{"metadata":{"name":"p"},"spec":{"containers":[{"name":"c","resources":{"requests":{"cpu":"0"}}}],"overhead":{"cpu":"250m","memory":"64Mi"}}}`,
		"burstable overhead":  `{"metadata":{"name":"p"},"spec":{"containers":[{"name":"c","resources":{"requests":{"cpu":"1"}}}],"overhead":{"cpu":"250m"}}}`,
		"prod priority":       `{"metadata":{"labels":{"qos":"be"}},"spec":{"priority":9000,"containers":[{"name":"c","resources":{"requests":{"cpu":"1"}}}]}}`,
		"resources null":      `{"metadata":{"labels":{"qos":"be"}},"spec":{"containers":[{"name":"c","resources":null},{"name":"d","resources":{"requests":null,"limits":{"memory":"1G"}}}]}}`,
		"preemption present":  `{"metadata":{"labels":{"qos":"be"}},"spec":{"priority":5,"priorityClassName":"x","preemptionPolicy":"Never","schedulerName":"default-scheduler"}}`,
		"keys to map present": `{"metadata":{"labels":{"qos":"be","qos-copy":"old"},"annotations":{"h":"a","h-copy":"b"}},"spec":{}}`,
		// Pods no selective profile matches, whose batch resources and
		// annotation the extended-resource-spec step still reconciles.
		"batch, no label":    `{"metadata":{"name":"p"},"spec":{"containers":[{"name":"c","resources":{"requests":{"kubernetes.io/batch-cpu":"500","kubernetes.io/batch-memory":"1Gi"},"limits":{"kubernetes.io/batch-cpu":"1k"}}},{"name":"d"}]}}`,
		"stale annotation":   `{"metadata":{"annotations":{"node.koordinator.sh/extended-resource-spec":"{\"containers\":{\"gone\":{\"requests\":{\"kubernetes.io/batch-cpu\":\"1\"}}}}"}},"spec":{"containers":[{"name":"c"}]}}`,
		"current annotation": `{"metadata":{"annotations":{"node.koordinator.sh/extended-resource-spec":"{\"containers\":{\"c\":{\"requests\":{\"kubernetes.io/batch-cpu\":\"500\"}}}}"}},"spec":{"containers":[{"name":"c","resources":{"requests":{"kubernetes.io/batch-cpu":"500"}}}]}}`,
		"other team":         `{"metadata":{"labels":{"team":"other","qos":"ls"}},"spec":{"schedulerName":"s","priority":3,"nodeSelector":{"a":"b"},"tolerations":[{"key":"k","operator":"Exists"}],"containers":[{"name":"c","resources":{"requests":{"cpu":"1"}}}]}}`,
		// Tolerations lists, read without decoding (tolerationsHave) or,
		// for the forms it leaves to the decoder, decoded.
		"has a profile's toleration": `{"metadata":{"labels":{"qos":"be"}},"spec":{"tolerations":[{"key":"x"},{"effect":"NoExecute","operator":"Exists","key":"t","tolerationSeconds":9007199254740993},{"key":"colocation","operator":"Exists","effect":"NoSchedule"}]}}`,
		"toleration seconds differ":  `{"metadata":{"name":"p"},"spec":{"tolerations":[{"key":"t","operator":"Exists","effect":"NoExecute","tolerationSeconds":9007199254740992},{"key":"t","operator":"Exists","effect":"NoExecute"}]}}`,
		"toleration repeats members": `{"metadata":{"name":"p"},"spec":{"tolerations":[{"key":"t","operator":"Exists","effect":"NoExecute","tolerationSeconds":null,"tolerationSeconds":9007199254740993,"key":"t"}]}}`,
		"toleration escaped":         `{"metadata":{"name":"p"},"spec":{"tolerations":[{"key":"\u0074","operator":"Exists","effect":"NoExecute","tolerationSeconds":9007199254740993}]}}`,
		"toleration unknown member":  `{"metadata":{"name":"p"},"spec":{"tolerations":[{"key":"t","operator":"Exists","effect":"NoExecute","tolerationSeconds":9007199254740993,"extra":[1]}]}}`,
		"toleration null value":      `{"metadata":{"name":"p"},"spec":{"tolerations":[{"key":"t","operator":"Exists","effect":"NoExecute","tolerationSeconds":9007199254740993,"value":null}]}}`,
		"tolerations null":           `{"metadata":{"name":"p"},"spec":{"tolerations":null}}`,
	} {
		pods[k] = v
	}
	return pods
}

// slowMutate is upstream's typed algorithm (cluster_colocation_profile.go:54-312)
// on a corev1.Pod, with kadmit's extras, for the differential test.
func slowMutate(p *Policy, ns string) func(*corev1.Pod) {
	return func(pod *corev1.Pod) {
		slowProfiles(p, ns, pod)
		typedExtendedResources(pod)
	}
}

func slowProfiles(p *Policy, ns string, pod *corev1.Pod) {
	{
		matched := p.profiles.match(pod.Labels, func() (map[string]string, bool) { l, ok, _ := p.namespaceLabels(ns); return l, ok })
		if len(matched) == 0 {
			return
		}
		skipRes := false
		for _, c := range matched {
			skipRes = skipRes || c.SkipUpdateResources
			if p.profiles.skip(c) {
				continue
			}
			keep := c.KeepExisting
			set := func(m *map[string]string, k, v string) {
				if *m == nil {
					*m = map[string]string{}
				}
				if _, ok := (*m)[k]; ok && keep {
					return
				}
				(*m)[k] = v
			}
			for k, v := range c.Labels {
				set(&pod.Labels, k, v)
			}
			for k, v := range c.Annotations {
				set(&pod.Annotations, k, v)
			}
			for _, old := range slices.Sorted(maps.Keys(c.LabelKeysMapping)) {
				if pod.Labels == nil {
					pod.Labels = map[string]string{}
				}
				pod.Labels[c.LabelKeysMapping[old]] = pod.Labels[old]
			}
			for _, old := range slices.Sorted(maps.Keys(c.AnnotationKeysMapping)) {
				if pod.Annotations == nil {
					pod.Annotations = map[string]string{}
				}
				pod.Annotations[c.AnnotationKeysMapping[old]] = pod.Annotations[old]
			}
			for k, s := range c.LabelSuffixes {
				if v, ok := pod.Labels[k]; ok {
					pod.Labels[k] = v + s
				}
			}
			if c.SchedulerName != "" && (!keep || pod.Spec.SchedulerName == "" || pod.Spec.SchedulerName == corev1.DefaultSchedulerName) {
				pod.Spec.SchedulerName = c.SchedulerName
			}
			if c.QoSClass != "" {
				set(&pod.Labels, LabelPodQoS, c.QoSClass)
			}
			if c.PriorityClassName != "" && (!keep || pod.Spec.PriorityClassName == "") {
				v, pp, _ := p.classes.PriorityClass(c.PriorityClassName)
				pod.Spec.PriorityClassName, pod.Spec.Priority, pod.Spec.PreemptionPolicy = c.PriorityClassName, &v, pp
			}
			if c.KoordinatorPriority != nil {
				set(&pod.Labels, LabelPodPriority, strconv.Itoa(int(*c.KoordinatorPriority)))
			}
			for k, v := range c.NodeSelector {
				set(&pod.Spec.NodeSelector, k, v)
			}
			for _, tol := range c.Tolerations {
				if !slices.ContainsFunc(pod.Spec.Tolerations, func(have corev1.Toleration) bool { return equality.Semantic.DeepEqual(have, tol) }) {
					pod.Spec.Tolerations = append(pod.Spec.Tolerations, tol)
				}
			}
		}
		if p.cfg.RecordProfiles {
			var names []string
			for _, c := range matched {
				if !p.profiles.skip(c) {
					names = append(names, c.Name)
				}
			}
			if len(names) > 0 {
				if pod.Annotations == nil {
					pod.Annotations = map[string]string{}
				}
				pod.Annotations[ProfilesAnnotation] = joinComma(names)
			}
		}
		if skipRes || p.cfg.SkipMutatingResources {
			return
		}
		pc := priorityRaw(pod.Labels, pod.Spec.Priority)
		if pc == PriorityNone {
			qos := qosRaw(pod.Labels)
			if qos == QoSNone {
				qos = QoSLS
				if typedBestEffort(pod) {
					qos = QoSBE
				}
			}
			pc = priorityForQoS(qos)
		}
		cpuName, memName, ok := resourceNames(pc)
		if !ok {
			return
		}
		replace := func(l corev1.ResourceList) {
			if q, ok := l[corev1.ResourceCPU]; ok {
				l[cpuName] = *resource.NewQuantity(q.MilliValue(), resource.DecimalSI)
				delete(l, corev1.ResourceCPU)
			}
			if q, ok := l[corev1.ResourceMemory]; ok {
				l[memName] = q
				delete(l, corev1.ResourceMemory)
			}
		}
		for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
			for i := range cs {
				r := &cs[i].Resources
				replace(r.Requests)
				replace(r.Limits)
				for _, n := range []corev1.ResourceName{cpuName, memName} {
					if _, ok := r.Requests[n]; !ok {
						if l, ok := r.Limits[n]; ok {
							if r.Requests == nil {
								r.Requests = corev1.ResourceList{}
							}
							r.Requests[n] = l
						}
					}
				}
			}
		}
		replace(pod.Spec.Overhead)
	}
}

func joinComma(s []string) string {
	out := ""
	for i, v := range s {
		if i > 0 {
			out += ","
		}
		out += v
	}
	return out
}

func typedBestEffort(pod *corev1.Pod) bool {
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range cs {
			for _, l := range []corev1.ResourceList{c.Resources.Requests, c.Resources.Limits} {
				for _, n := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
					if q, ok := l[n]; ok && q.Sign() > 0 {
						return false
					}
				}
			}
		}
	}
	return true
}

func TestDifferential(t *testing.T) {
	for _, cfg := range []Config{
		{Profiles: diffProfiles()},
		{Profiles: diffProfiles(), RecordProfiles: true},
		{Profiles: diffProfiles(), SkipMutatingResources: true},
		// Only selective profiles: most pods match none, the path that
		// returns after reading the labels.
		{Profiles: slices.DeleteFunc(diffProfiles(), func(p Profile) bool { return p.Name == "everyone" })},
		// Profiles that change no annotation: a matched pod's annotations
		// are not read, but for the extended-resource-spec one.
		{Profiles: withoutAnnotations(diffProfiles())},
	} {
		p, err := New(cfg, fakeNS{"mixed": {"colocation": "on", corev1.LabelMetadataName: "mixed"}, "plain": {}},
			WithPriorityClasses(fakeClasses{"koord-batch": 5500, "other": 1}))
		if err != nil {
			t.Fatal(err)
		}
		// "never" (50%) is skipped: 99 > 50.
		p.profiles.intn = func(int) int { return 99 }
		for name, raw := range diffPods(t) {
			for _, ns := range []string{"mixed", "plain", "unknown"} {
				t.Run(fmt.Sprintf("%s/%s/record=%v,skip=%v", name, ns, cfg.RecordProfiles, cfg.SkipMutatingResources), func(t *testing.T) {
					ops, v := p.Mutate(t.Context(), podReq(ns, admissionv1.Create, []byte(raw), nil))
					if !v.Allowed {
						t.Fatalf("denied: %+v", v)
					}
					policytest.Check(t, []byte(raw), ops, slowMutate(p, ns))
				})
			}
		}
	}
}

// typedExtendedResources is upstream's mutateByExtendedResources
// (extended_resource_spec.go:33-80) on a typed pod, run after the profiles
// as upstream's handleCreate does (mutating_handler.go:124-132).
func typedExtendedResources(pod *corev1.Pod) {
	want := extendedResourceSpec{}
	for _, c := range pod.Spec.Containers {
		r := extendedContainerSpec{Requests: corev1.ResourceList{}, Limits: corev1.ResourceList{}}
		for _, n := range []corev1.ResourceName{BatchCPU, BatchMemory} {
			if q, ok := c.Resources.Requests[n]; ok {
				r.Requests[n] = q
			}
			if q, ok := c.Resources.Limits[n]; ok {
				r.Limits[n] = q
			}
		}
		if len(r.Requests) > 0 || len(r.Limits) > 0 {
			if want.Containers == nil {
				want.Containers = map[string]extendedContainerSpec{}
			}
			want.Containers[c.Name] = r
		}
	}
	cur, has := pod.Annotations[AnnotationExtendedResourceSpec]
	b, _ := json.Marshal(want)
	if !has && want.Containers == nil {
		return
	}
	if has {
		var got extendedResourceSpec
		_ = json.Unmarshal([]byte(cur), &got)
		if g, _ := json.Marshal(got); string(g) == string(b) {
			return
		}
	}
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[AnnotationExtendedResourceSpec] = string(b)
}
