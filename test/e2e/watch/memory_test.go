package watch

import (
	"context"
	"fmt"
	"math/rand/v2"
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
	if err := e2eenv.CreatePods(ctx, e.Client, ns, bigPods, func(i int) *corev1.Pod {
		return e2eenv.BigPod(fmt.Sprintf("big-%02d", i), map[string]string{"app": "big"}, nil)
	}); err != nil {
		t.Fatal(err)
	}
	// The chart's setting; the child inherits it.
	t.Setenv("GOMEMLIMIT", "400MiB")
	start := time.Now()
	w := startWatch(t, e)
	peak, rss := e2eenv.Memory(t, w.cmd.Process.Pid)
	t.Logf("%d pods of ~1.4 MB: watch ready and leading in %s, peak RSS %d MiB, RSS %d MiB", bigPods, time.Since(start).Round(time.Millisecond), peak>>20, rss>>20)
	if peak > maxWatchRSS {
		t.Errorf("peak RSS %d MiB while the watch's informers synced, want < %d MiB", peak>>20, maxWatchRSS>>20)
	}
}
