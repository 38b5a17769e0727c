package admission_test

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/gcpace"
	"github.com/kadmit/kadmit/internal/policy/seed/lifespan"
	"github.com/kadmit/kadmit/internal/policy/seed/podname"
)

// The parallel benchmarks answer the question of how the handler's cost
// grows with cores: run them at -cpu 1,2 (GOMAXPROCS) and compare the
// cpu-µs/op metric, the process's CPU time (user + system, getrusage) per
// request. ns/op is wall time and halves when a second core helps; CPU per
// request stays flat when nothing on the path contends (a lock, a shared
// pool, cache lines bouncing between cores) and grows when something does.
//
//	go test -run '^$' -bench 'Parallel' -cpu 1,2 -count 5 ./internal/admission

func BenchmarkServeHTTPParallel_ValidatePod(b *testing.B) {
	withHeapFloors(b, func(b *testing.B) { servePar(b, podname.Path, reviewFor(b, "Pod", "pods", benchPodJSON(b))) })
}

func BenchmarkServeHTTPParallel_MutatePodRealistic(b *testing.B) {
	withHeapFloors(b, func(b *testing.B) { servePar(b, lifespan.Path, reviewFor(b, "Pod", "pods", realisticPodJSON(b))) })
}

// withHeapFloors runs f as the Go runtime paces it by default (heap goal
// twice the live heap, at least 4 MiB) and with kadmit serve's default
// --gc-heap-floor, side by side: the floor is what keeps CPU per request
// flat from one core to two (docs/performance.md, "Cores and the garbage
// collector").
func withHeapFloors(b *testing.B, f func(*testing.B)) {
	b.Run("gc=runtime-default", f)
	b.Run("gc=heap-floor-64Mi", func(b *testing.B) {
		p := gcpace.Start(gcpace.DefaultFloor)
		if p == nil {
			b.Skip("GOGC=off in the environment: no floor to set")
		}
		defer p.Stop()
		runtime.GC() // the Pacer tunes after each collection: start from a tuned one
		runtime.GC()
		f(b)
	})
}

// servePar posts body to the seed webhook on path from GOMAXPROCS
// goroutines and reports CPU time per request next to ns/op.
func servePar(b *testing.B, path string, body []byte) {
	h := admission.NewHandler(seedWebhooks(b)[path], admission.HandlerOptions{})
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	cpu0 := processCPU(b)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		rd := bytes.NewReader(nil)
		w := &benchWriter{header: http.Header{}}
		for pb.Next() {
			rd.Reset(body)
			r := httptest.NewRequestWithContext(context.Background(), http.MethodPost, path+"?timeout=10s", rd)
			r.Header.Set("Content-Type", "application/json")
			w.reset()
			h.ServeHTTP(w, r)
			if w.code != http.StatusOK || !bytes.Contains(w.body.Bytes(), []byte(`"allowed":true`)) {
				b.Errorf("%s: %d %s", path, w.code, w.body.String())
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(processCPU(b)-cpu0)/float64(time.Microsecond)/float64(b.N), "cpu-µs/op")
}

// processCPU is the process's user and system CPU time so far.
func processCPU(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
