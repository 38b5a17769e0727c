// Command benchapi measures admission webhooks the way the API server sees
// them (`make bench-apiserver`): it starts the test control plane (a real
// kube-apiserver and etcd on 127.0.0.1), registers kadmit with the seed
// webhooks, runs `kadmit bench --through-apiserver` against it, then replaces
// kadmit with the controller-runtime reference of bench/reference, registered
// with a copy of kadmit's own webhook configurations (same rules,
// failurePolicy, selectors, matchConditions, timeouts; only the names, the
// URL and the caBundle differ), and runs the same bench again. It prints one
// table with both, writes the raw reports to -work, and stops everything it
// started on return, failure or Ctrl-C.
//
// With -trace (the default) the API server is started with
// --tracing-config-file (a TracingConfiguration, apiserver.config.k8s.io/v1,
// sampling every request) and kadmit serve with --tracing-endpoint, both
// exporting to the OTLP receiver each `kadmit bench --trace-receiver` run
// opens on one loopback port, and a second table gives each webhook call's
// exact latency from the API server's spans, split into kadmit, network+TLS
// and the API server's own handling.
//
//	make build controlplane
//	cd bench/reference && go build -o ../../bin/bench-reference .
//	cd test && go run ./cmd/benchapi -kadmit ../bin/kadmit -reference ../bin/bench-reference
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kadmit/kadmit/internal/bench"
	"github.com/kadmit/kadmit/test/controlplane"
	"github.com/kadmit/kadmit/test/controlplane/kadmitproc"
	"github.com/kadmit/kadmit/test/poll"
)

const (
	namespace      = "bench-apiserver"
	referenceName  = "bench-reference"
	readyLimit     = 90 * time.Second
	stopGrace      = 30 * time.Second
	lifespanTaint  = "acme.com/lifespan-remaining"
	lifespanLabel  = "acme.com/lifespan-requested"
	forbiddenWord  = "offensive"
	referenceCerts = "reference-certs"
)

type options struct {
	kadmit, reference, work string
	rate, maxInFlight       int
	duration, warmup        time.Duration
	trace                   bool
	// traceAddr is the receivers' loopback address, chosen at start.
	traceAddr string
}

func main() {
	var o options
	flag.StringVar(&o.kadmit, "kadmit", "", "kadmit binary (required)")
	flag.StringVar(&o.reference, "reference", "", "bench/reference binary; empty: kadmit only")
	flag.StringVar(&o.work, "work", "bin/bench-apiserver", "directory for logs, kubeconfig and the JSON reports")
	flag.IntVar(&o.rate, "rate", bench.TargetRate, "dry-run creates per second")
	flag.IntVar(&o.maxInFlight, "max-in-flight", bench.DefaultMaxInFlight, "creates awaiting an answer at most")
	flag.DurationVar(&o.duration, "duration", time.Minute, "measured run per server")
	flag.DurationVar(&o.warmup, "warmup", 5*time.Second, "unmeasured run per server before the measured one (0: none)")
	flag.BoolVar(&o.trace, "trace", true, "trace the API server's webhook calls and kadmit's reviews, and print the span-based table")
	flag.Parse()
	if o.kadmit == "" {
		fmt.Fprintln(os.Stderr, "benchapi: -kadmit is required")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "benchapi:", err)
		stop()
		os.Exit(1)
	}
}

// result is one server's measured run.
type result struct {
	server           string
	report           bench.APIServerJSON
	loadBefore, load string
}

func run(ctx context.Context, o options) error {
	if err := os.MkdirAll(o.work, 0o755); err != nil {
		return err
	}
	work, err := filepath.Abs(o.work)
	if err != nil {
		return err
	}
	cpLog, err := os.Create(filepath.Join(work, "controlplane.log"))
	if err != nil {
		return err
	}
	defer cpLog.Close()
	cpOpts := controlplane.Options{Output: cpLog}
	if o.trace {
		if o.traceAddr, err = kadmitproc.FreeAddr(); err != nil {
			return err
		}
		cfg := filepath.Join(work, "tracing-config.yaml")
		if err := os.WriteFile(cfg, tracingConfig(o.traceAddr), 0o644); err != nil {
			return err
		}
		cpOpts.APIServerFlags = map[string]string{"tracing-config-file": cfg}
	}
	fmt.Fprintln(os.Stderr, "benchapi: starting kube-apiserver and etcd")
	cp, err := controlplane.Start(ctx, cpOpts)
	if err != nil {
		return err
	}
	defer func() {
		if err := cp.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "benchapi:", err)
		}
	}()
	kubeconfig := filepath.Join(work, "kubeconfig")
	if err := cp.WriteKubeconfig(kubeconfig); err != nil {
		return err
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}
	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create namespace %s: %w", namespace, err)
	}

	// kadmit, registered by itself with the seed profile.
	kp, mwc, vwc, err := startKadmit(ctx, work, o.kadmit, kubeconfig, o.traceAddr, cp.Client)
	if kp != nil {
		defer func() { _, _, _ = kp.Terminate(stopGrace) }()
	}
	if err != nil {
		return err
	}
	var results []result
	r, err := measure(ctx, o, work, "kadmit", kubeconfig)
	if err != nil {
		return err
	}
	results = append(results, r)

	if o.reference != "" {
		// One server registered at a time: stop kadmit and remove its
		// configurations (failurePolicy Fail would refuse every pod).
		if _, _, err := kp.Terminate(stopGrace); err != nil {
			return fmt.Errorf("stop kadmit: %w", err)
		}
		if err := deleteConfigs(ctx, cp.Client, kadmitproc.ConfigName); err != nil {
			return err
		}
		stopRef, err := startReference(ctx, work, o.reference, cp.Client, mwc, vwc)
		defer stopRef()
		if err != nil {
			return err
		}
		r, err := measure(ctx, o, work, "controller-runtime", kubeconfig)
		if err != nil {
			return err
		}
		results = append(results, r)
	}
	printTable(os.Stdout, o, results)
	return nil
}

func startKadmit(ctx context.Context, work, binary, kubeconfig, traceAddr string, client kubernetes.Interface) (*kadmitproc.Process, *admissionregistrationv1.MutatingWebhookConfiguration, *admissionregistrationv1.ValidatingWebhookConfiguration, error) {
	addr, err := kadmitproc.FreeAddr()
	if err != nil {
		return nil, nil, nil, err
	}
	metricsAddr, err := kadmitproc.FreeAddr()
	if err != nil {
		return nil, nil, nil, err
	}
	log, err := os.Create(filepath.Join(work, "kadmit.log"))
	if err != nil {
		return nil, nil, nil, err
	}
	fmt.Fprintln(os.Stderr, "benchapi: starting kadmit serve --register (seed profile)")
	var extra []string
	if traceAddr != "" {
		extra = []string{"--tracing-endpoint", traceAddr}
	}
	kp, err := kadmitproc.Start(kadmitproc.Options{
		Binary: binary, Addr: addr, MetricsAddr: metricsAddr,
		CAFile: filepath.Join(work, "kadmit-ca.crt"), Kubeconfig: kubeconfig, Log: log, ExtraArgs: extra,
	})
	if err != nil {
		return nil, nil, nil, err
	}
	rctx, cancel := context.WithTimeout(ctx, readyLimit)
	defer cancel()
	if err := kp.WaitReady(rctx); err != nil {
		return kp, nil, nil, err
	}
	mwc, vwc, err := kp.WaitRegistered(rctx, client)
	if err != nil {
		return kp, nil, nil, err
	}
	return kp, mwc, vwc, kp.WaitEffective(rctx, client, namespace)
}

// startReference starts `bench-reference controller-runtime` on a free
// loopback port with a fresh self-signed certificate, registers it with
// copies of kadmit's configurations, and waits until the API server calls
// it. The returned stop ends the process and is safe to call always.
func startReference(ctx context.Context, work, binary string, client kubernetes.Interface,
	kadmitM *admissionregistrationv1.MutatingWebhookConfiguration, kadmitV *admissionregistrationv1.ValidatingWebhookConfiguration) (func(), error) {
	noop := func() {}
	certDir := filepath.Join(work, referenceCerts)
	if out, err := exec.CommandContext(ctx, binary, "certs", certDir).CombinedOutput(); err != nil {
		return noop, fmt.Errorf("%s certs: %w: %s", binary, err, out)
	}
	ca, err := os.ReadFile(filepath.Join(certDir, "tls.crt"))
	if err != nil {
		return noop, err
	}
	addr, err := kadmitproc.FreeAddr()
	if err != nil {
		return noop, err
	}
	_, port, _ := net.SplitHostPort(addr)
	log, err := os.Create(filepath.Join(work, "reference.log"))
	if err != nil {
		return noop, err
	}
	fmt.Fprintln(os.Stderr, "benchapi: starting the controller-runtime reference on", addr)
	cmd := exec.Command(binary, "controller-runtime", "-port", port, "-cert-dir", certDir)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return noop, fmt.Errorf("start %s: %w", binary, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	stop := func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(stopGrace):
			_ = cmd.Process.Kill()
			<-exited
		}
		_ = log.Close()
	}
	rctx, cancel := context.WithTimeout(ctx, readyLimit)
	defer cancel()
	if err := poll.Until(rctx, 0, func(ctx context.Context) error {
		select {
		case <-exited:
			return poll.Stop(fmt.Errorf("%s exited; see %s", binary, log.Name()))
		default:
		}
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		return c.Close()
	}); err != nil {
		return stop, fmt.Errorf("reference not listening on %s: %w", addr, err)
	}
	m, v, err := referenceConfigs(kadmitM, kadmitV, "https://"+addr, ca)
	if err != nil {
		return stop, err
	}
	reg := client.AdmissionregistrationV1()
	if _, err := reg.MutatingWebhookConfigurations().Create(ctx, m, metav1.CreateOptions{}); err != nil {
		return stop, fmt.Errorf("register reference: %w", err)
	}
	if _, err := reg.ValidatingWebhookConfigurations().Create(ctx, v, metav1.CreateOptions{}); err != nil {
		return stop, fmt.Errorf("register reference: %w", err)
	}
	return stop, waitEffective(rctx, client)
}

// referenceConfigs copies kadmit's configurations for the reference server:
// only the webhooks on the paths it serves (/mutate-pod, /validate-pod), with
// every setting kept and only the name, URL and caBundle changed.
func referenceConfigs(m *admissionregistrationv1.MutatingWebhookConfiguration, v *admissionregistrationv1.ValidatingWebhookConfiguration, base string, ca []byte) (*admissionregistrationv1.MutatingWebhookConfiguration, *admissionregistrationv1.ValidatingWebhookConfiguration, error) {
	served := map[string]bool{"/mutate-pod": true, "/validate-pod": true}
	retarget := func(name string, cc admissionregistrationv1.WebhookClientConfig) (string, admissionregistrationv1.WebhookClientConfig, bool, error) {
		if cc.URL == nil {
			return "", cc, false, fmt.Errorf("kadmit webhook %s has no clientConfig.url", name)
		}
		u, err := url.Parse(*cc.URL)
		if err != nil {
			return "", cc, false, fmt.Errorf("kadmit webhook %s: %w", name, err)
		}
		if !served[u.Path] {
			return "", cc, false, nil
		}
		nu := base + u.Path
		return strings.TrimSuffix(name, ".kadmit.io") + ".controller-runtime.reference", admissionregistrationv1.WebhookClientConfig{URL: &nu, CABundle: ca}, true, nil
	}
	meta := metav1.ObjectMeta{Name: referenceName}
	om := &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: meta}
	for _, w := range m.Webhooks {
		name, cc, ok, err := retarget(w.Name, w.ClientConfig)
		if err != nil {
			return nil, nil, err
		}
		if ok {
			w.Name, w.ClientConfig = name, cc
			om.Webhooks = append(om.Webhooks, w)
		}
	}
	ov := &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: meta}
	for _, w := range v.Webhooks {
		name, cc, ok, err := retarget(w.Name, w.ClientConfig)
		if err != nil {
			return nil, nil, err
		}
		if ok {
			w.Name, w.ClientConfig = name, cc
			ov.Webhooks = append(ov.Webhooks, w)
		}
	}
	if len(om.Webhooks) == 0 || len(ov.Webhooks) == 0 {
		return nil, nil, fmt.Errorf("kadmit registered no /mutate-pod or /validate-pod webhook to copy (%d mutating, %d validating)", len(om.Webhooks), len(ov.Webhooks))
	}
	return om, ov, nil
}

// waitEffective dry-runs pods until the API server calls the reference:
// the offensive one denied by its pod-name webhook, a labelled one given the
// lifespan toleration.
func waitEffective(ctx context.Context, client kubernetes.Interface) error {
	pods := client.CoreV1().Pods(namespace)
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	pod := func(name string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{lifespanLabel: "3"}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "pause", Image: "registry.k8s.io/pause:3.10"}}},
		}
	}
	return poll.Until(ctx, 0, func(ctx context.Context) error {
		_, err := pods.Create(ctx, pod("probe-"+forbiddenWord), dry)
		if err == nil || !strings.Contains(err.Error(), ".controller-runtime.reference\" denied the request") {
			return fmt.Errorf("reference pod-name webhook not in effect: %v", err)
		}
		got, err := pods.Create(ctx, pod("probe"), dry)
		if err != nil {
			return fmt.Errorf("reference lifespan webhook: %w", err)
		}
		for _, t := range got.Spec.Tolerations {
			if t.Key == lifespanTaint {
				return nil
			}
		}
		return errors.New("reference lifespan webhook not in effect: no toleration added")
	})
}

func deleteConfigs(ctx context.Context, client kubernetes.Interface, name string) error {
	reg := client.AdmissionregistrationV1()
	if err := reg.MutatingWebhookConfigurations().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete MutatingWebhookConfiguration %s: %w", name, err)
	}
	if err := reg.ValidatingWebhookConfigurations().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete ValidatingWebhookConfiguration %s: %w", name, err)
	}
	return nil
}

// measure runs the warm-up, then the measured `kadmit bench
// --through-apiserver`, and keeps its JSON report in work/<server>.json.
func measure(ctx context.Context, o options, work, server, kubeconfig string) (result, error) {
	args := func(d time.Duration) []string {
		a := []string{"bench", "--through-apiserver", "--kubeconfig", kubeconfig, "--namespace", namespace,
			"--rate", strconv.Itoa(o.rate), "--max-in-flight", strconv.Itoa(o.maxInFlight), "-d", d.String(), "-o", "json"}
		if o.traceAddr != "" {
			a = append(a, "--trace-receiver", o.traceAddr)
		}
		return a
	}
	if o.warmup > 0 {
		fmt.Fprintf(os.Stderr, "benchapi: %s: warm-up %s\n", server, o.warmup)
		if _, err := benchRun(ctx, o.kadmit, args(o.warmup)); err != nil {
			return result{}, fmt.Errorf("%s warm-up: %w", server, err)
		}
	}
	fmt.Fprintf(os.Stderr, "benchapi: %s: %d creates/s for %s\n", server, o.rate, o.duration)
	r := result{server: server, loadBefore: loadAvg()}
	out, err := benchRun(ctx, o.kadmit, args(o.duration))
	r.load = loadAvg()
	if err != nil {
		return r, fmt.Errorf("%s: %w", server, err)
	}
	if err := os.WriteFile(filepath.Join(work, server+".json"), out, 0o644); err != nil {
		return r, err
	}
	if err := json.Unmarshal(out, &r.report); err != nil {
		return r, fmt.Errorf("%s: report: %w", server, err)
	}
	return r, nil
}

// benchRun runs kadmit bench and returns its stdout. Exit status 1 (some
// creates failed) still has a report; the table shows the errors.
func benchRun(ctx context.Context, kadmit string, args []string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, kadmit, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !(errors.As(err, &ee) && ee.ExitCode() == 1) {
		return nil, fmt.Errorf("kadmit %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.Bytes(), nil
}

// loadAvg is the 1-minute load average, for the record.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	if f := strings.Fields(string(b)); len(f) > 0 {
		return f[0]
	}
	return "?"
}

func printTable(w io.Writer, o options, rs []result) {
	fmt.Fprintf(w, "\nThrough the API server: %d dry-run pod creates/s for %s per server (after a %s warm-up), at most %d in flight\n\n", o.rate, o.duration, o.warmup, o.maxInFlight)
	fmt.Fprintln(w, "| server | creates sent / planned | errors | late / held by in-flight bound | client p50 ms | client p99 ms | load avg (1 min) |")
	fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- | --- |")
	for _, r := range rs {
		j := r.report
		fmt.Fprintf(w, "| %s | %d / %d | %d | %d / %d | %.1f | %.1f | %s–%s |\n", r.server, j.Sent, j.Planned, errCount(j.Errors), j.Late, j.Held, j.ClientMS.P50, j.ClientMS.P99, r.loadBefore, r.load)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| server | webhook | type | calls | p50 ms (bucket-interp.) | p99 ms (bucket-interp.) | mean ms | calls <= 5 ms | share of client mean / p50 / p99 | target: p99 <= 5 ms |")
	fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
	for _, r := range rs {
		for _, wh := range r.report.Webhooks {
			target := "missed"
			if wh.MeetsTarget {
				target = "met"
			}
			p99 := fmt.Sprintf("%.2f", wh.P99MS)
			if wh.P99InInf {
				p99 = "> " + p99
			}
			fmt.Fprintf(w, "| %s | %s | %s | %d | %.2f | %s | %.2f | %.1f%% | %.0f%% / %.0f%% / %.0f%% | %s |\n",
				r.server, wh.Name, wh.Type, wh.Calls, wh.P50MS, p99, wh.MeanMS, 100*wh.LowestShare,
				100*wh.ShareMean, 100*wh.ShareP50, 100*wh.ShareP99, target)
		}
	}
	printSpanTable(w, rs)
	for _, r := range rs {
		for k, v := range r.report.ErrorSamples {
			fmt.Fprintf(w, "\n%s: %s, e.g. %s\n", r.server, k, v)
		}
	}
}

func errCount(m map[string]int64) int64 {
	var n int64
	for _, v := range m {
		n += v
	}
	return n
}

// tracingConfig is the kube-apiserver --tracing-config-file that exports
// every request's spans (samplingRatePerMillion 1000000) over OTLP/gRPC to
// endpoint (apiserver.config.k8s.io/v1 TracingConfiguration, GA with
// APIServerTracing in 1.34; k8s.io/apiserver v0.37.1
// pkg/apis/apiserver/v1/types.go).
func tracingConfig(endpoint string) []byte {
	return []byte(fmt.Sprintf("apiVersion: apiserver.config.k8s.io/v1\nkind: TracingConfiguration\nendpoint: %s\nsamplingRatePerMillion: 1000000\n", endpoint))
}

// printSpanTable prints the span-based split of each webhook call, from
// the runs that had a trace receiver.
func printSpanTable(w io.Writer, rs []result) {
	traced := false
	for _, r := range rs {
		traced = traced || r.report.Spans != nil
	}
	if !traced {
		return
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Each webhook call as the API server's spans measure it (exact, nearest-rank quantiles of each part; the means add up): call = the API server's \"Call mutating/validating webhook\" span; HTTP = its HTTP client span (the round trip); kadmit = kadmit's own span; network+TLS = HTTP - kadmit; API server = call - HTTP (encoding, decoding, patch)")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| server | webhook | type | part | count | p50 ms | p90 ms | p99 ms | max ms | mean ms |")
	fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
	for _, r := range rs {
		sp := r.report.Spans
		if sp == nil {
			continue
		}
		for _, wh := range sp.Webhooks {
			for _, p := range []struct {
				name string
				d    bench.SpanDistJSON
			}{{"call", wh.Call}, {"HTTP", wh.Client}, {"kadmit", wh.Kadmit}, {"network+TLS", wh.Network}, {"API server", wh.APIServer}} {
				if p.d.Count == 0 {
					fmt.Fprintf(w, "| %s | %s | %s | %s | 0 | - | - | - | - | - |\n", r.server, wh.Name, wh.Type, p.name)
					continue
				}
				fmt.Fprintf(w, "| %s | %s | %s | %s | %d | %.3f | %.3f | %.3f | %.3f | %.3f |\n", r.server, wh.Name, wh.Type, p.name,
					p.d.Count, p.d.P50, p.d.P90, p.d.P99, p.d.Max, p.d.Mean)
			}
		}
	}
	fmt.Fprintln(w)
	for _, r := range rs {
		sp := r.report.Spans
		if sp == nil {
			continue
		}
		fmt.Fprintf(w, "%s: %d spans received, %d dropped at the receiver's bound; ", r.server, sp.Received, sp.Dropped)
		for i, wh := range sp.Webhooks {
			if i > 0 {
				fmt.Fprint(w, ", ")
			}
			fmt.Fprintf(w, "%s %d calls traced (%d with kadmit's span, kadmit %.0f%% of the mean call)", wh.Name, wh.Calls, wh.WithKadmit, 100*wh.KadmitShare)
		}
		verdict := "MISSED"
		if sp.Target.Met {
			verdict = "met"
		}
		if r.report.Rate != bench.SpanTargetRate {
			verdict = fmt.Sprintf("not measured at this rate (%d creates/s, target at %d)", r.report.Rate, bench.SpanTargetRate)
		}
		fmt.Fprintf(w, "\n%s: span target (%s): %s\n", r.server, sp.Target.Text, verdict)
	}
}
