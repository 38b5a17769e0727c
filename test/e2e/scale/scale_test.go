package scale

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kadmit/kadmit/internal/doctor"
	"github.com/kadmit/kadmit/test/e2e/e2eenv"
	"github.com/kadmit/kadmit/test/poll"
	"github.com/kadmit/kadmit/test/procstat"
)

// The targets (one doctor run under 10 s, the watch under 256 MiB) are not
// met yet: measured 18 s (doctor lists nine kinds per namespace, at least
// 900 requests under its --qps 50) and 455 MiB (webhook pods' specs and
// templates, and doctor's Backend.objects building every podBody). The
// test logs both against the targets and asserts the ceilings below, so
// that what was reached does not regress.
const (
	targetDoctor   = 10 * time.Second
	targetWatchRSS = 256 << 20
	// maxDoctor bounds one `kadmit doctor` run over the whole cluster:
	// 18.0 s measured on the 2-core machine, with margin for CI.
	maxDoctor = 30 * time.Second
	// maxWatchRSS bounds the watch's peak RSS (VmHWM) from start through
	// ready, leading and evaluations: the chart's memory limit (512Mi,
	// GOMEMLIMIT 400MiB as the chart sets it); 455 MiB measured.
	maxWatchRSS = 512 << 20
	// evaluations is how many evaluations after the first are timed.
	evaluations = 3
)

// TestScale builds issue 23's cluster (world_test.go) and measures one
// `kadmit doctor` run and `kadmit watch` over it; see the package comment.
func TestScale(t *testing.T) {
	e := suite.Env(t)
	ctx := e2eenv.TestCtx(t, 12*time.Minute)
	w := build(ctx, t, e, fmt.Sprintf("%04d", rand.IntN(10000)))
	t.Logf("created %d objects in %s (%.0f/s): %d namespaces, %d Deployments and as many ReplicaSets, %d pods, %d Services, %d configurations of %d webhooks",
		w.objects, w.took.Round(time.Millisecond), float64(w.objects)/w.took.Seconds(), namespaces, len(w.workloads), wantPods, wantServices, configs, hooksPerConfig)

	t.Run("doctor", func(t *testing.T) { measureDoctor(t, e) })
	t.Run("watch", func(t *testing.T) { measureWatch(t, e, w) })
}

// measureDoctor runs `kadmit doctor -o json` as a user would (default
// --qps 50, --burst 100, --timeout 2m) and checks every webhook was
// checked through and found without endpoints (KD201).
func measureDoctor(t *testing.T, e *e2eenv.Env) {
	var out, errOut bytes.Buffer
	cmd := exec.Command(e.Binary, "doctor", "--kubeconfig", e.Kubeconfig, "-o", "json")
	cmd.Stdout, cmd.Stderr = &out, &errOut
	start := time.Now()
	err := cmd.Run()
	took := time.Since(start)
	var exit *exec.ExitError
	// Exit status 1: errors found (every Fail webhook lacks endpoints).
	if err != nil && (!errors.As(err, &exit) || exit.ExitCode() != 1) {
		t.Fatalf("kadmit doctor after %s: %v\n%s", took, err, errOut.String())
	}
	var peak int64
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		peak = ru.Maxrss << 10 // KiB on Linux
	}
	var rep doctor.Report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("decode doctor's JSON report (%d bytes): %v\n%s", out.Len(), err, errOut.String())
	}
	t.Logf("kadmit doctor: %d webhooks in %s, peak RSS %d MiB, report %d KiB", len(rep.Webhooks), took.Round(time.Millisecond), peak>>20, out.Len()>>10)
	if len(rep.Webhooks) != wantWebhooks {
		t.Errorf("%d webhooks in the report, want %d", len(rep.Webhooks), wantWebhooks)
	}
	for _, wr := range rep.Webhooks {
		if !wr.Has(doctor.IDNoReadyEndpoints) || wr.Has(doctor.IDNotChecked) {
			t.Errorf("%s/%s: want %s (no endpoints), checked through; got %+v", wr.Configuration, wr.Webhook, doctor.IDNoReadyEndpoints, wr.Findings)
			break
		}
	}
	t.Logf("kadmit doctor: %s (target %s, met: %v)", took.Round(time.Millisecond), targetDoctor, took <= targetDoctor)
	if took > maxDoctor {
		t.Errorf("kadmit doctor took %s, want under %s", took.Round(time.Millisecond), maxDoctor)
	}
}

// measureWatch starts `kadmit watch` (GOMEMLIMIT as the chart sets it,
// --max-webhooks raised to track all of them), times it to ready and
// leading, then times evaluations each triggered by an annotation on a
// configuration, and checks its peak RSS.
func measureWatch(t *testing.T, e *e2eenv.Env, w *world) {
	t.Setenv("GOMEMLIMIT", "400MiB") // the chart's watch.goMemLimit
	start := time.Now()
	p := startWatch(t, e, 3*time.Minute, "--max-webhooks", fmt.Sprint(wantWebhooks))
	pid := p.cmd.Process.Pid
	ready := time.Since(start)
	peak, rss := e2eenv.Memory(t, pid)
	cpu, _ := procstat.CPU(pid)
	t.Logf("kadmit watch: informers synced in %s (peak RSS then %d MiB); ready and leading (first evaluation done) in %s, peak RSS %d MiB, RSS %d MiB, CPU %s",
		p.synced.Round(time.Millisecond), p.syncedPeak>>20, ready.Round(time.Millisecond), peak>>20, rss>>20, cpu.Round(time.Millisecond))

	ctx := e2eenv.TestCtx(t, 3*time.Minute)
	body, err := p.scrape(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := metric(body, "kadmit_watch_untracked_webhooks"); v != 0 {
		t.Errorf("kadmit_watch_untracked_webhooks = %v, want 0", v)
	}
	if n := count(body, "kadmit_watch_webhook_info"); n != wantWebhooks {
		t.Errorf("%d kadmit_watch_webhook_info series, want %d", n, wantWebhooks)
	}
	var worst time.Duration
	for i := range evaluations {
		before, _ := metric(body, "kadmit_watch_evaluations_total")
		cpu0, _ := procstat.CPU(pid)
		patch := fmt.Sprintf(`{"metadata":{"annotations":{"scale.example.com/touch":"%d"}}}`, i)
		if _, err := e.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Patch(ctx, w.configs[0], types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		var took time.Duration
		err := poll.Until(ctx, time.Minute, func(ctx context.Context) error {
			b, err := p.scrape(ctx)
			if err != nil {
				return err
			}
			seen := time.Now()
			if n, _ := metric(b, "kadmit_watch_evaluations_total"); n <= before {
				return fmt.Errorf("kadmit_watch_evaluations_total = %v, still %v", n, before)
			}
			ts, ok := metric(b, "kadmit_watch_last_evaluation_timestamp_seconds")
			if !ok {
				return errors.New("no kadmit_watch_last_evaluation_timestamp_seconds")
			}
			// The timestamp is the evaluation's start; the counter moves at
			// its end: seen - start bounds its duration from above (by one
			// poll interval and a scrape).
			took = seen.Sub(time.Unix(0, int64(ts*1e9)))
			body = b
			return nil
		})
		if err != nil {
			t.Fatalf("evaluation %d: %v", i+1, err)
		}
		cpu1, _ := procstat.CPU(pid)
		worst = max(worst, took)
		t.Logf("evaluation %d: at most %s (watch CPU %s from the change to the scrape that saw it)", i+1, took.Round(time.Millisecond), (cpu1 - cpu0).Round(time.Millisecond))
	}
	peak, rss = e2eenv.Memory(t, pid)
	t.Logf("kadmit watch after %d evaluations: peak RSS %d MiB, RSS %d MiB, slowest evaluation at most %s", evaluations, peak>>20, rss>>20, worst.Round(time.Millisecond))
	t.Logf("kadmit watch peak RSS: %d MiB (target %d MiB, met: %v)", peak>>20, targetWatchRSS>>20, peak <= targetWatchRSS)
	if peak > maxWatchRSS {
		t.Errorf("kadmit watch peak RSS %d MiB, want under %d MiB", peak>>20, maxWatchRSS>>20)
	}
}
