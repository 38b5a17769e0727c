package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kadmit/kadmit/pkg/webhookcerts"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kadmit/kadmit/test/controlplane/kadmitproc"
	"github.com/kadmit/kadmit/test/e2e/e2eenv"
	"github.com/kadmit/kadmit/test/poll"
	"github.com/kadmit/kadmit/test/seed"
)

const (
	apiCallTimeout    = 30 * time.Second
	webhookTakeEffect = 30 * time.Second
)

// TestSeedScenarios runs the seed table (test/seed), the same rows `make
// demo` prints: each manifest of examples/seed applied to the API server
// with kadmit registered, and what was stored or refused checked. Objects
// are deleted when the test ends, so that it can run again (-count) against
// the same control plane.
func TestSeedScenarios(t *testing.T) {
	e := world(t)
	env := &seed.Env{
		Client:     e.Client,
		Dir:        seed.Dir(e.RepoRoot),
		Namespace:  e.namespace,
		NodeSuffix: e.namespace,
		Created: func(kind, namespace, name string) {
			t.Cleanup(func() { deleteObject(t, e, kind, namespace, name) })
		},
	}
	for _, sc := range seed.Scenarios() {
		t.Run(sc.Name, func(t *testing.T) {
			r := sc.Run(e2eenv.TestCtx(t, 2*apiCallTimeout), env)
			for _, p := range r.Problems {
				t.Error(p)
			}
			if !r.Matched() {
				t.Logf("expected %s; the API server answered: %s", sc.Expected, r.Got)
			}
		})
	}
}

// deleteObject deletes what a seed scenario stored. No kubelet runs the
// pods, so nothing waits on a grace period.
func deleteObject(t *testing.T, e *env, kind, namespace, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), apiCallTimeout)
	defer cancel()
	zero := int64(0)
	var err error
	switch kind {
	case "Pod":
		err = e.Client.CoreV1().Pods(namespace).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	case "Node":
		err = e.Client.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{})
	default:
		err = fmt.Errorf("no deletion for kind %s", kind)
	}
	if err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("clean up %s %s/%s: %v", kind, namespace, name, err)
	}
}

// seedPod loads a seed pod and moves it into this run's namespace.
func seedPod(t *testing.T, e *env, file string) *corev1.Pod {
	t.Helper()
	var pod corev1.Pod
	if err := seed.Load(seed.Dir(e.RepoRoot), file, &pod); err != nil {
		t.Fatal(err)
	}
	pod.Namespace = e.namespace
	return &pod
}

// createPod creates pod and deletes it when the test ends.
func createPod(ctx context.Context, t *testing.T, e *env, pod *corev1.Pod) (*corev1.Pod, error) {
	t.Helper()
	created, err := e.Client.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err == nil {
		t.Cleanup(func() { deleteObject(t, e, "Pod", pod.Namespace, pod.Name) })
	}
	return created, err
}

// TestAdmissionReviewV1beta1 registers a second validating webhook, aimed at
// kadmit's /validate-pod, that may only speak AdmissionReview v1beta1, and
// checks through the API server's own metrics that it answered, and denied,
// with a well-formed v1beta1 response. The denial message alone could not
// show that: kadmit's own v1 webhook denies the same pod in parallel.
func TestAdmissionReviewV1beta1(t *testing.T) {
	e := world(t)
	ctx := e2eenv.TestCtx(t, 2*apiCallTimeout)

	vwcs := e.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	own, err := vwcs.Get(ctx, kadmitproc.ConfigName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get kadmit's ValidatingWebhookConfiguration: %v", err)
	}
	var podName *admissionregistrationv1.ValidatingWebhook
	for i := range own.Webhooks {
		if own.Webhooks[i].Name == "pod-name.kadmit.io" {
			podName = &own.Webhooks[i]
		}
	}
	if podName == nil || podName.ClientConfig.URL == nil {
		t.Fatalf("kadmit's configuration has no pod-name.kadmit.io webhook with a URL: %+v", own.Webhooks)
	}
	if !strings.HasSuffix(*podName.ClientConfig.URL, "/validate-pod") {
		t.Fatalf("pod-name.kadmit.io URL = %s; want it to end in /validate-pod", *podName.ClientConfig.URL)
	}

	const hookName = "pod-name-v1beta1.e2e.kadmit.io"
	selectorKey, selectorValue := "e2e.kadmit.io/v1beta1", e.namespace
	fail := admissionregistrationv1.Fail
	none := admissionregistrationv1.SideEffectClassNone
	timeout := int32(5)
	cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "kadmit-e2e-v1beta1"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name: hookName,
			ClientConfig: admissionregistrationv1.WebhookClientConfig{
				URL:      podName.ClientConfig.URL,
				CABundle: podName.ClientConfig.CABundle,
			},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule: admissionregistrationv1.Rule{
					APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"},
				},
			}},
			ObjectSelector:          &metav1.LabelSelector{MatchLabels: map[string]string{selectorKey: selectorValue}},
			FailurePolicy:           &fail,
			SideEffects:             &none,
			TimeoutSeconds:          &timeout,
			AdmissionReviewVersions: []string{"v1beta1"},
		}},
	}
	if _, err := vwcs.Create(ctx, cfg, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create %s: %v", cfg.Name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), apiCallTimeout)
		defer cancel()
		if err := vwcs.Delete(ctx, cfg.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete %s: %v", cfg.Name, err)
		}
	})

	// The API server's counters are cumulative over its life; compare with
	// their values before this run.
	base, err := webhookMetrics(ctx, e, hookName)
	if err != nil {
		t.Fatalf("read API server metrics: %v", err)
	}
	offensive := seedPod(t, e, "offensive-pod.yaml")
	offensive.Name = "offensive-v1beta1"
	offensive.Labels = map[string]string{selectorKey: selectorValue}

	// A new configuration takes a few seconds to reach the API server's
	// webhook informer; retry until the v1beta1 hook has been called.
	var denied error
	err = poll.Until(ctx, webhookTakeEffect, func(ctx context.Context) error {
		_, err := createPod(ctx, t, e, offensive)
		if err == nil {
			return poll.Stop(fmt.Errorf("pod %q labelled for the v1beta1 hook was admitted; want it denied", offensive.Name))
		}
		denied = err
		m, err := webhookMetrics(ctx, e, hookName)
		if err != nil {
			return poll.Stop(fmt.Errorf("read API server metrics: %w", err))
		}
		m = m.since(base)
		if m.callErrors > 0 {
			return poll.Stop(fmt.Errorf("the API server failed to call %s (AdmissionReview v1beta1) %v times: %v; metrics: %v", hookName, m.callErrors, denied, m.lines))
		}
		if m.rejectedNoError == 0 {
			return fmt.Errorf("%s has not rejected the pod (API server answered %v); metrics: %v", hookName, denied, m.lines)
		}
		t.Logf("API server metrics for %s: %v", hookName, m.lines)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(denied.Error(), seed.OffensiveMessage) || !apierrors.IsForbidden(denied) {
		t.Errorf("denial = HTTP %d %q; want 403 containing %q", seed.StatusCode(denied), denied, seed.OffensiveMessage)
	}

	// The allow path too: with failurePolicy Fail a malformed v1beta1
	// answer would reject this pod as a call error.
	fine := seedPod(t, e, "plain-pod.yaml")
	fine.Name = "plain-v1beta1"
	fine.Labels = map[string]string{selectorKey: selectorValue}
	if _, err := createPod(ctx, t, e, fine); err != nil {
		t.Fatalf("pod %q admitted by kadmit's v1 hooks was refused via the v1beta1 hook: %v", fine.Name, err)
	}
	m, err := webhookMetrics(ctx, e, hookName)
	if err != nil {
		t.Fatalf("read API server metrics: %v", err)
	}
	m = m.since(base)
	if m.callErrors > 0 || m.admitted == 0 {
		t.Errorf("after an allowed pod, %s: admitted=%v callErrors=%v; want >0 and 0; metrics: %v", hookName, m.admitted, m.callErrors, m.lines)
	}
}

// hookMetrics summarises the API server's own view of one webhook.
type hookMetrics struct {
	rejectedNoError float64 // well-formed responses that denied
	callErrors      float64 // calls that failed: TLS, HTTP, malformed review
	admitted        float64 // well-formed responses that allowed
	lines           []string
}

// since returns the counts accumulated after base was read.
func (m hookMetrics) since(base hookMetrics) hookMetrics {
	m.rejectedNoError -= base.rejectedNoError
	m.callErrors -= base.callErrors
	m.admitted -= base.admitted
	return m
}

// webhookMetrics scrapes the API server's /metrics for hook. Rejections with
// error_type="no_error" are webhook denials the API server parsed;
// "calling_webhook_error" covers anything that went wrong on the wire,
// including an answer in the wrong AdmissionReview version.
func webhookMetrics(ctx context.Context, e *env, hook string) (hookMetrics, error) {
	raw, err := e.Client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return hookMetrics{}, fmt.Errorf("GET /metrics: %w", err)
	}
	var m hookMetrics
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	nameLabel := `name="` + hook + `"`
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") || !strings.Contains(line, nameLabel) {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		switch {
		case strings.HasPrefix(line, "apiserver_admission_webhook_rejection_count{"):
			m.lines = append(m.lines, line)
			if strings.Contains(line, `error_type="no_error"`) {
				m.rejectedNoError += v
			} else {
				m.callErrors += v
			}
		case strings.HasPrefix(line, "apiserver_admission_webhook_request_total{"):
			m.lines = append(m.lines, line)
			if strings.Contains(line, `rejected="false"`) && strings.Contains(line, `code="200"`) {
				m.admitted += v
			}
		}
	}
	return m, sc.Err()
}

// TestSIGTERMExitsZeroWithinGrace runs a second, unregistered kadmit (the
// shared one must keep serving the other tests) and checks it drains and
// exits 0 on SIGTERM within its shutdown grace.
func TestSIGTERMExitsZeroWithinGrace(t *testing.T) {
	e := world(t)
	const grace = 2 * time.Second
	addr, metricsAddr, err := e2eenv.FreeAddrs()
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	p, err := kadmitproc.Start(kadmitproc.Options{
		Binary:        e.Binary,
		Addr:          addr,
		MetricsAddr:   metricsAddr,
		CAFile:        caFile,
		ShutdownGrace: grace,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, _, err := p.Terminate(5 * time.Second); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	if err := p.WaitReady(e2eenv.TestCtx(t, kadmitReadyLimit)); err != nil {
		t.Fatal(err)
	}
	// Serving: the HTTPS port answers /readyz with a certificate that the
	// CA kadmit wrote verifies for 127.0.0.1, as the API server will check.
	hs := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: caPool(t, caFile)}}}
	resp, err := hs.Get("https://" + addr + "/readyz")
	if err != nil {
		t.Fatalf("GET https://%s/readyz: %v", addr, err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET https://%s/readyz = %d; want 200", addr, resp.StatusCode)
	}
	hs.CloseIdleConnections()

	// Slack over the grace for process start-up of the signal handler and
	// exit; a kadmit that ignores the grace blows well past it.
	code, took, err := p.Terminate(grace + 3*time.Second)
	if err != nil {
		t.Fatalf("%v\nkadmit's last log lines:\n%s", err, p.Tail(20))
	}
	if code != 0 {
		t.Fatalf("kadmit exited with code %d after SIGTERM; want 0\nlast log lines:\n%s", code, p.Tail(20))
	}
	t.Logf("kadmit exited 0 %s after SIGTERM (grace %s)", took.Round(time.Millisecond), grace)

	// Nothing may still listen once it has exited.
	hc := &http.Client{Timeout: time.Second}
	if resp, err := hc.Get("http://" + metricsAddr + "/readyz"); err == nil {
		_ = resp.Body.Close()
		t.Errorf("metrics port %s still answers after exit", metricsAddr)
	}
}

// caPool reads the PEM CA certificates kadmit wrote to file, the way kadmit
// reads them (internal/certs), into a pool.
func caPool(t *testing.T, file string) *x509.CertPool {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("read the CA kadmit wrote: %v", err)
	}
	cas, err := webhookcerts.ParseCertificates(data)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	pool := x509.NewCertPool()
	for _, c := range cas {
		pool.AddCert(c)
	}
	return pool
}
