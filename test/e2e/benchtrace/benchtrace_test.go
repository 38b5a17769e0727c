// Package benchtrace checks `kadmit bench --through-apiserver
// --trace-receiver` against a real kube-apiserver started with
// --tracing-config-file (every request sampled, exported to the bench's
// receiver) and kadmit serve with --tracing-endpoint at the same address:
// every dry-run create must show up as one "Call mutating/validating
// webhook" span per seed webhook, each with the API server's HTTP client
// span under it and kadmit's own "kadmit.review" span under that, and the
// parts must nest (kadmit within the client span within the call span).
//
// It starts its own control plane (the shared e2eenv suite has no tracing
// flags). Run: cd test && KADMIT_E2E_REQUIRED=1 KADMIT_CONTROLPLANE_DIR=...
// go test -count=1 ./e2e/benchtrace/
package benchtrace

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kadmit/kadmit/internal/bench"
	"github.com/kadmit/kadmit/test/controlplane"
	"github.com/kadmit/kadmit/test/controlplane/kadmitproc"
)

const (
	namespace = "benchtrace"
	rate      = 20
	duration  = 5 * time.Second
	creates   = rate * 5
	// setupLimit bounds building kadmit and starting the control plane on
	// a busy machine; benchLimit one bench (duration, two scrapes, up to
	// 20 s waiting for the last span batches, start-up).
	setupLimit = 5 * time.Minute
	benchLimit = duration + 2*time.Minute
)

func TestSpansFromRealAPIServer(t *testing.T) {
	if _, err := controlplane.FindBinaries(""); err != nil {
		if os.Getenv("KADMIT_E2E_REQUIRED") == "1" {
			t.Fatalf("control plane binaries: %v", err)
		}
		t.Skipf("needs the control plane binaries (make controlplane): %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), setupLimit)
	defer cancel()
	tmp := t.TempDir()
	root, err := kadmitproc.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(tmp, "kadmit")
	if err := kadmitproc.Build(ctx, root, bin); err != nil {
		t.Fatal(err)
	}
	traceAddr, err := kadmitproc.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(tmp, "tracing-config.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf("apiVersion: apiserver.config.k8s.io/v1\nkind: TracingConfiguration\nendpoint: %s\nsamplingRatePerMillion: 1000000\n", traceAddr)), 0o644); err != nil {
		t.Fatal(err)
	}
	cpLog, err := os.Create(filepath.Join(tmp, "controlplane.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer cpLog.Close()
	cp, err := controlplane.Start(ctx, controlplane.Options{Output: cpLog, APIServerFlags: map[string]string{"tracing-config-file": cfg}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := cp.Stop(); err != nil {
			t.Error(err)
		}
	}()
	kubeconfig := filepath.Join(tmp, "kubeconfig")
	if err := cp.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	addr, metricsAddr, err := kadmitproc.FreeAddrs()
	if err != nil {
		t.Fatal(err)
	}
	var kadmitLog bytes.Buffer
	kp, err := kadmitproc.Start(kadmitproc.Options{
		Binary: bin, Addr: addr, MetricsAddr: metricsAddr, CAFile: filepath.Join(tmp, "ca.crt"),
		Kubeconfig: kubeconfig, ExtraArgs: []string{"--tracing-endpoint", traceAddr}, Log: &kadmitLog,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _, _, _ = kp.Terminate(30 * time.Second) }()
	if err := kp.WaitReady(ctx); err != nil {
		t.Fatalf("%v\n%s", err, kp.Tail(30))
	}
	if _, _, err := kp.WaitRegistered(ctx, cp.Client); err != nil {
		t.Fatal(err)
	}
	if err := kp.WaitEffective(ctx, cp.Client, namespace); err != nil {
		t.Fatal(err)
	}

	bctx, bcancel := context.WithTimeout(context.Background(), benchLimit)
	defer bcancel()
	cmd := exec.CommandContext(bctx, bin, "bench", "--through-apiserver", "--kubeconfig", kubeconfig, "--namespace", namespace,
		"--rate", fmt.Sprint(rate), "-d", duration.String(), "--trace-receiver", traceAddr, "-o", "json")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Fatal(err)
		}
		t.Fatalf("kadmit bench exited %d: %s\n%s", ee.ExitCode(), errb.String(), out.String())
	}
	var rep bench.APIServerJSON
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("report: %v\n%s", err, out.String())
	}
	if rep.Created != creates {
		t.Fatalf("%d creates, want %d", rep.Created, creates)
	}
	sp := rep.Spans
	if sp == nil {
		t.Fatalf("no spans in the report:\n%s", out.String())
	}
	if sp.Dropped != 0 {
		t.Errorf("%d spans dropped at the receiver's bound", sp.Dropped)
	}
	metricCalls := map[string]int64{}
	for _, w := range rep.Webhooks {
		metricCalls[w.Name] = w.Calls
	}
	seen := map[string]bool{}
	for _, w := range sp.Webhooks {
		seen[w.Name] = true
		// Every call the API server's histogram counted was traced, and
		// every traced call reached kadmit with the API server's
		// traceparent: the three spans of each call were matched.
		if int64(w.Calls) != metricCalls[w.Name] || w.Calls < creates {
			t.Errorf("%s: %d call spans, the API server's histogram counted %d, %d creates", w.Name, w.Calls, metricCalls[w.Name], creates)
		}
		if w.WithClient != w.Calls || w.WithKadmit != w.Calls {
			t.Errorf("%s: %d calls, %d with the client span, %d with kadmit's span: want all", w.Name, w.Calls, w.WithClient, w.WithKadmit)
		}
		// The parts nest: kadmit's span inside the client span inside the
		// call span, so no part exceeds the call and the means add up.
		if w.Client.Count != w.Calls || w.Client.Max > w.Call.Max || w.Kadmit.Max > w.Client.Max || w.Kadmit.Mean <= 0 || w.Network.Mean <= 0 || w.APIServer.Mean <= 0 {
			t.Errorf("%s: parts do not nest: call %+v kadmit %+v network %+v apiserver %+v", w.Name, w.Call, w.Kadmit, w.Network, w.APIServer)
		}
		if sum := w.Kadmit.Mean + w.Network.Mean + w.APIServer.Mean; sum < w.Call.Mean*0.999 || sum > w.Call.Mean*1.001 {
			t.Errorf("%s: parts' means add to %.4f ms, the call's mean is %.4f ms", w.Name, sum, w.Call.Mean)
		}
		// The histogram's exact mean and the spans' mean measure the same
		// calls; the spans start a little later (after the request object
		// is built), so they are at most the histogram's.
		for _, m := range rep.Webhooks {
			if m.Name == w.Name && (w.Call.Mean > m.MeanMS*1.05+0.05 || w.Call.Mean < m.MeanMS*0.5) {
				t.Errorf("%s: span mean %.3f ms, histogram mean %.3f ms", w.Name, w.Call.Mean, m.MeanMS)
			}
		}
	}
	for name, n := range metricCalls {
		if n > 0 && !seen[name] {
			t.Errorf("webhook %s was called %d times but no call span arrived", name, n)
		}
	}
	if len(sp.Webhooks) < 2 {
		t.Errorf("span rows %+v: want the seed's mutating and validating pod webhooks", sp.Webhooks)
	}
	t.Logf("spans: %d received, waited %.1f s for the last batches; %+v", sp.Received, sp.WaitedSeconds, sp.Webhooks)
}
