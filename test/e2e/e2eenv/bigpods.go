package e2eenv

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kadmit/kadmit/test/procstat"
)

// BigPodEnv env vars of ~78 bytes of JSON each make a BigPod of ~1.4 MB,
// under etcd's 1.5 MiB value limit in the API server's protobuf form: the
// pods of issue 20 point 3, which took kadmit serve and kadmit watch past
// their memory limits while their pod informers synced.
const BigPodEnv = 18_000

// BigPod is a pod of about 1.4 MB named name with labels: one pause
// container with BigPodEnv env vars no policy reads and, when requests is
// not nil, those resource requests.
func BigPod(name string, labels map[string]string, requests corev1.ResourceList) *corev1.Pod {
	env := make([]corev1.EnvVar, BigPodEnv)
	for i := range env {
		env[i] = corev1.EnvVar{Name: fmt.Sprintf("V_%05d", i), Value: strings.Repeat("v", 50)}
	}
	c := corev1.Container{Name: "c", Image: "registry.k8s.io/pause:3.10", Env: env}
	if requests != nil {
		c.Resources = corev1.ResourceRequirements{Requests: requests}
	}
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Spec: corev1.PodSpec{Containers: []corev1.Container{c}}}
}

// CreatePods creates pod(i) for i in [0, n) in namespace ns, four at a
// time (each create of a BigPod is a 1.4 MB request that the suite's
// kadmit also reviews). It returns the first error, naming the pod's
// index; the creates already started finish first.
func CreatePods(ctx context.Context, client kubernetes.Interface, ns string, n int, pod func(i int) *corev1.Pod) error {
	var wg sync.WaitGroup
	errs := make(chan error, n)
	next := make(chan int, n)
	for i := range n {
		next <- i
	}
	close(next)
	for range 4 {
		wg.Go(func() {
			for i := range next {
				if _, err := client.CoreV1().Pods(ns).Create(ctx, pod(i), metav1.CreateOptions{}); err != nil {
					errs <- fmt.Errorf("create big pod %d: %w", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// Memory is the peak RSS (VmHWM) and the RSS (VmRSS) of process pid, in
// bytes; the test fails when they can not be read.
func Memory(t *testing.T, pid int) (peak, rss int64) {
	t.Helper()
	peak, err := procstat.Status(pid, "VmHWM")
	if err != nil {
		t.Fatal(err)
	}
	if rss, err = procstat.Status(pid, "VmRSS"); err != nil {
		t.Fatal(err)
	}
	return peak, rss
}
