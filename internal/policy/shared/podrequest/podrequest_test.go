package podrequest

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func c(cpu string, sidecar bool) corev1.Container {
	ct := corev1.Container{Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu)}}}
	if sidecar {
		always := corev1.ContainerRestartPolicyAlways
		ct.RestartPolicy = &always
	}
	return ct
}

func TestEffective(t *testing.T) {
	for _, tc := range []struct {
		name string
		spec corev1.PodSpec
		want string
	}{
		{"containers sum", corev1.PodSpec{Containers: []corev1.Container{c("1", false), c("500m", false)}}, "1500m"},
		{"init larger than containers", corev1.PodSpec{InitContainers: []corev1.Container{c("3", false)}, Containers: []corev1.Container{c("1", false)}}, "3"},
		{"init smaller than containers", corev1.PodSpec{InitContainers: []corev1.Container{c("1", false)}, Containers: []corev1.Container{c("2", false)}}, "2"},
		// The sidecar runs beside the regular container: 1 + 2.
		{"sidecar adds to containers", corev1.PodSpec{InitContainers: []corev1.Container{c("1", true)}, Containers: []corev1.Container{c("2", false)}}, "3"},
		// init after the sidecar: 1 (sidecar) + 4 (init) = 5 > 1 + 1.
		{"init after sidecar", corev1.PodSpec{InitContainers: []corev1.Container{c("1", true), c("4", false)}, Containers: []corev1.Container{c("1", false)}}, "5"},
		// init before the sidecar runs alone: max(4, 1+1) = 4.
		{"init before sidecar", corev1.PodSpec{InitContainers: []corev1.Container{c("4", false), c("1", true)}, Containers: []corev1.Container{c("1", false)}}, "4"},
		{"overhead added", corev1.PodSpec{Containers: []corev1.Container{c("1", false)}, Overhead: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m")}}, "1250m"},
		{"pod-level requests win", corev1.PodSpec{Containers: []corev1.Container{c("1", false)}, Resources: &corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")}}}, "2"},
		{"limit stands in for request", corev1.PodSpec{Containers: []corev1.Container{{Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("700m")}}}}}, "700m"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Effective(&tc.spec)[corev1.ResourceCPU]
			if want := resource.MustParse(tc.want); got.Cmp(want) != 0 {
				t.Fatalf("cpu = %s, want %s", got.String(), tc.want)
			}
		})
	}
}

func TestScale(t *testing.T) {
	got := Scale(corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m"), corev1.ResourceMemory: resource.MustParse("1Gi")}, 3)
	if q := got[corev1.ResourceCPU]; q.Cmp(resource.MustParse("750m")) != 0 {
		t.Errorf("cpu = %s", q.String())
	}
	if q := got[corev1.ResourceMemory]; q.Cmp(resource.MustParse("3Gi")) != 0 {
		t.Errorf("memory = %s", q.String())
	}
}
