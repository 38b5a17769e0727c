package watch

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kadmit/kadmit/test/e2e/e2eenv"
)

// Bounds of TestWatchPodCacheMemory, the reproduction of issue 20 point 3
// for `kadmit watch`: 40 pods of 1.4 MB took it to 742 MiB against its
// 512Mi limit.
const (
	bigPods = 40
	// bigPodEnv env vars of ~78 bytes of JSON each make a pod of ~1.4 MB,
	// under etcd's 1.5 MiB value limit.
	bigPodEnv = 18_000
	// maxWatchRSS bounds the watch's peak RSS (VmHWM) from start to ready
	// and leading, with every informer synced.
	maxWatchRSS = 150 << 20
)

// TestWatchPodCacheMemory: with bigPods pods of ~1.4 MB in a namespace
// holding no webhook Service, `kadmit watch` (GOMEMLIMIT=400MiB, as the
// chart sets it) becomes ready and leads with a peak RSS under
// maxWatchRSS: those pods are cached with their labels and owner
// references only (internal/watch workloads.go).
func TestWatchPodCacheMemory(t *testing.T) {
	e := suite.Env(t)
	ctx := e2eenv.TestCtx(t, 4*time.Minute)
	ns := fmt.Sprintf("watch-big-%05d", rand.IntN(100000))
	if _, err := e.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Client.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	env := make([]corev1.EnvVar, bigPodEnv)
	for i := range env {
		env[i] = corev1.EnvVar{Name: fmt.Sprintf("V_%05d", i), Value: strings.Repeat("v", 50)}
	}
	var wg sync.WaitGroup
	errs := make(chan error, bigPods)
	next := make(chan int, bigPods)
	for i := range bigPods {
		next <- i
	}
	close(next)
	for range 4 {
		wg.Go(func() {
			for i := range next {
				p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("big-%02d", i), Labels: map[string]string{"app": "big"}},
					Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10", Env: env}}}}
				if _, err := e.Client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
					errs <- fmt.Errorf("create big pod %d: %w", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// The chart's setting; the child inherits it.
	t.Setenv("GOMEMLIMIT", "400MiB")
	start := time.Now()
	w := startWatch(t, e)
	peak, rss := procStatus(t, w.cmd.Process.Pid, "VmHWM:"), procStatus(t, w.cmd.Process.Pid, "VmRSS:")
	t.Logf("%d pods of ~1.4 MB: watch ready and leading in %s, peak RSS %d MiB, RSS %d MiB", bigPods, time.Since(start).Round(time.Millisecond), peak>>20, rss>>20)
	if peak > maxWatchRSS {
		t.Errorf("peak RSS %d MiB while the watch's informers synced, want < %d MiB", peak>>20, maxWatchRSS>>20)
	}
}

// procStatus reads a kB field of /proc/<pid>/status, in bytes.
func procStatus(t *testing.T, pid int, field string) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if fs := strings.Fields(s.Text()); len(fs) >= 2 && fs[0] == field {
			kb, err := strconv.ParseInt(fs[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}
