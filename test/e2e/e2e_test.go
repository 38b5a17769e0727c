package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"github.com/kadmit/kadmit/test/controlplane/kadmitproc"
	"github.com/kadmit/kadmit/test/e2e/e2eenv"
)

const (
	lifespanKey       = "acme.com/lifespan-remaining"
	lifespanLabel     = "acme.com/lifespan-requested"
	annotationRaw     = "kadmit.io/raw-allocatable"
	annotationRatio   = "kadmit.io/overcommit-ratio"
	offensiveMessage  = `pod name contains "offensive"`
	apiCallTimeout    = 30 * time.Second
	webhookTakeEffect = 30 * time.Second
)

// seed decodes examples/seed/<name> into out, strictly, so a typo in an
// example fails here rather than silently dropping a field.
func seed(t *testing.T, e *env, name string, out any) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(e.RepoRoot, "examples", "seed", name))
	if err != nil {
		t.Fatalf("read seed manifest: %v", err)
	}
	if err := yaml.UnmarshalStrict(data, out); err != nil {
		t.Fatalf("decode examples/seed/%s: %v", name, err)
	}
}

// seedPod loads a seed pod and moves it into this run's namespace.
func seedPod(t *testing.T, e *env, file string) *corev1.Pod {
	t.Helper()
	var pod corev1.Pod
	seed(t, e, file, &pod)
	pod.Namespace = e.namespace
	return &pod
}

// createPod creates pod and deletes it when the test ends, so that the tests
// can run again (-count) against the same control plane.
func createPod(ctx context.Context, t *testing.T, e *env, pod *corev1.Pod) (*corev1.Pod, error) {
	t.Helper()
	created, err := e.Client.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err == nil {
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), apiCallTimeout)
			defer cancel()
			// No kubelet runs the pod, so nothing waits on the grace period.
			zero := int64(0)
			_ = e.Client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		})
	}
	return created, err
}

func lifespanTolerations(ts []corev1.Toleration) []corev1.Toleration {
	var out []corev1.Toleration
	for _, t := range ts {
		if strings.HasPrefix(t.Key, "acme.com/") {
			out = append(out, t)
		}
	}
	return out
}

func TestOffensivePodIsDenied(t *testing.T) {
	e := world(t)
	ctx := e2eenv.TestCtx(t, apiCallTimeout)
	pod := seedPod(t, e, "offensive-pod.yaml")

	_, err := createPod(ctx, t, e, pod)
	if err == nil {
		t.Fatalf("creating pod %q succeeded; want it denied", pod.Name)
	}
	if !strings.Contains(err.Error(), offensiveMessage) {
		t.Fatalf("error = %q; want it to contain %q", err, offensiveMessage)
	}
	if !apierrors.IsForbidden(err) {
		t.Errorf("error is HTTP %d (%s); want 403 Forbidden", statusCode(err), apierrors.ReasonForError(err))
	}
	if !strings.Contains(err.Error(), `admission webhook "pod-name.kadmit.io" denied the request`) {
		t.Errorf("error = %q; want it attributed to webhook pod-name.kadmit.io", err)
	}
	if _, err := e.Client.CoreV1().Pods(e.namespace).Get(ctx, pod.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("after the denial, Get(%s) = %v; want NotFound", pod.Name, err)
	}
}

func TestLifespanThreeGetsTolerationsThreeToFourteen(t *testing.T) {
	e := world(t)
	ctx := e2eenv.TestCtx(t, apiCallTimeout)
	pod := seedPod(t, e, "lifespan-three.yaml")

	created, err := createPod(ctx, t, e, pod)
	if err != nil {
		t.Fatalf("create %s: %v", pod.Name, err)
	}
	// Read back what etcd holds rather than trusting the create response.
	stored, err := e.Client.CoreV1().Pods(e.namespace).Get(ctx, created.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get %s: %v", pod.Name, err)
	}
	got := lifespanTolerations(stored.Spec.Tolerations)
	if len(got) != 12 {
		t.Fatalf("stored pod has %d acme.com tolerations; want 12 (values 3..14): %+v", len(got), got)
	}
	for i, tol := range got {
		want := corev1.Toleration{Key: lifespanKey, Operator: corev1.TolerationOpEqual, Value: strconv.Itoa(3 + i), Effect: corev1.TaintEffectNoSchedule}
		if tol.Key != want.Key || tol.Operator != want.Operator || tol.Value != want.Value || tol.Effect != want.Effect || tol.TolerationSeconds != nil {
			t.Errorf("toleration %d = %+v; want %+v", i, tol, want)
		}
	}
}

func TestPlainPodGetsExistsToleration(t *testing.T) {
	e := world(t)
	ctx := e2eenv.TestCtx(t, apiCallTimeout)
	pod := seedPod(t, e, "plain-pod.yaml")
	if _, ok := pod.Labels[lifespanLabel]; ok {
		t.Fatalf("seed plain-pod.yaml carries %s; it must not", lifespanLabel)
	}

	if _, err := createPod(ctx, t, e, pod); err != nil {
		t.Fatalf("create %s: %v", pod.Name, err)
	}
	stored, err := e.Client.CoreV1().Pods(e.namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get %s: %v", pod.Name, err)
	}
	got := lifespanTolerations(stored.Spec.Tolerations)
	want := corev1.Toleration{Key: lifespanKey, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}
	if len(got) != 1 || got[0] != want {
		t.Fatalf("stored acme.com tolerations = %+v; want exactly [%+v]", got, want)
	}
}

func TestLifespanLabelNotANumberIsRejected(t *testing.T) {
	e := world(t)
	ctx := e2eenv.TestCtx(t, apiCallTimeout)
	pod := seedPod(t, e, "lifespan-three.yaml")
	pod.Name = "lifespan-abc"
	pod.Labels[lifespanLabel] = "abc"

	_, err := createPod(ctx, t, e, pod)
	if err == nil {
		t.Fatalf("pod with %s=abc was admitted; want it rejected", lifespanLabel)
	}
	for _, want := range []string{lifespanLabel, "[0, 14]", `"abc"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error = %q; want it to contain %s", err, want)
		}
	}
	if c := statusCode(err); c < 400 || c >= 500 {
		t.Errorf("error is HTTP %d; want a 4xx client error", c)
	}
}

// createNode creates node and deletes it when t ends: nodes are
// cluster-wide and outlive the test's namespace.
func createNode(ctx context.Context, t *testing.T, e *env, node *corev1.Node) {
	t.Helper()
	nodes := e.Client.CoreV1().Nodes()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), apiCallTimeout)
		defer cancel()
		_ = nodes.Delete(ctx, node.Name, metav1.DeleteOptions{})
	})
	if _, err := nodes.Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create node: %v", err)
	}
}

// TestNodeOvercommitSurvivesKubeletStatusUpdates plays a kubelet: it
// registers a node with its raw resources, then keeps posting the same raw
// status, as a kubelet that knows nothing of kadmit does. The stored node must
// stay amplified exactly once (cpu allocatable 3500m -> 7, capacity
// 4 -> 7500m), never compounding.
func TestNodeOvercommitSurvivesKubeletStatusUpdates(t *testing.T) {
	e := world(t)
	ctx := e2eenv.TestCtx(t, 2*apiCallTimeout)
	nodes := e.Client.CoreV1().Nodes()

	var node, status corev1.Node
	seed(t, e, "node.yaml", &node)
	seed(t, e, "node-status.yaml", &status)
	// Nodes are cluster-wide; a run-specific name keeps reruns against a
	// kept control plane from colliding.
	node.Name = "e2e-" + e.namespace
	createNode(ctx, t, e, &node)
	stored, err := nodes.Get(ctx, node.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get node: %v", err)
	}
	checkAmplified(t, "after create", stored)

	for i := 1; i <= 4; i++ {
		latest, err := nodes.Get(ctx, node.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("status update %d: get node: %v", i, err)
		}
		// Exactly what a kubelet posts: its raw status on the latest
		// resourceVersion, metadata as last read.
		latest.Status = *status.Status.DeepCopy()
		updated, err := nodes.UpdateStatus(ctx, latest, metav1.UpdateOptions{})
		if err != nil {
			t.Fatalf("status update %d: %v", i, err)
		}
		stored, err := nodes.Get(ctx, node.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("status update %d: get node: %v", i, err)
		}
		if stored.ResourceVersion != updated.ResourceVersion {
			t.Logf("status update %d: node changed since the update (rv %s -> %s)", i, updated.ResourceVersion, stored.ResourceVersion)
		}
		checkAmplified(t, fmt.Sprintf("after status update %d", i), stored)
		if _, ok := stored.Annotations[annotationRaw]; !ok {
			t.Errorf("after status update %d: annotation %s is missing; annotations = %v", i, annotationRaw, stored.Annotations)
		} else if i == 1 {
			t.Logf("%s after a nodes/status update: %s", annotationRaw, stored.Annotations[annotationRaw])
		}
		if !hasReady(stored) {
			t.Errorf("after status update %d: the kubelet's Ready condition was not stored", i)
		}
	}
}

// TestNodeOvercommitSurvivesKubeletStatusPatches covers the writes a real
// kubelet makes: strategic-merge PATCHes of nodes/status, one carrying its
// raw resources again and one that is a heartbeat touching only a condition.
// The heartbeat reaches kadmit with the already amplified values merged in,
// which must not be amplified a second time.
func TestNodeOvercommitSurvivesKubeletStatusPatches(t *testing.T) {
	e := world(t)
	ctx := e2eenv.TestCtx(t, 2*apiCallTimeout)
	nodes := e.Client.CoreV1().Nodes()

	var node corev1.Node
	seed(t, e, "node.yaml", &node)
	node.Name = "e2e-patch-" + e.namespace
	createNode(ctx, t, e, &node)

	patches := []struct{ name, body string }{
		{"raw resources", `{"status":{"capacity":{"cpu":"4"},"allocatable":{"cpu":"3500m"}}}`},
		{"heartbeat only", `{"status":{"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady","lastHeartbeatTime":"2025-01-01T00:00:40Z","lastTransitionTime":"2025-01-01T00:00:00Z"}]}}`},
		{"raw resources again", `{"status":{"capacity":{"cpu":"4"},"allocatable":{"cpu":"3500m"}}}`},
		{"heartbeat again", `{"status":{"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady","lastHeartbeatTime":"2025-01-01T00:01:20Z","lastTransitionTime":"2025-01-01T00:00:00Z"}]}}`},
	}
	for _, p := range patches {
		if _, err := nodes.Patch(ctx, node.Name, types.StrategicMergePatchType, []byte(p.body), metav1.PatchOptions{}, "status"); err != nil {
			t.Fatalf("PATCH nodes/status (%s): %v", p.name, err)
		}
		stored, err := nodes.Get(ctx, node.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("get node: %v", err)
		}
		checkAmplified(t, "after PATCH "+p.name, stored)
	}
}

func checkAmplified(t *testing.T, when string, n *corev1.Node) {
	t.Helper()
	alloc, capa := n.Status.Allocatable[corev1.ResourceCPU], n.Status.Capacity[corev1.ResourceCPU]
	if alloc.Cmp(resource.MustParse("7")) != 0 || capa.Cmp(resource.MustParse("7500m")) != 0 {
		t.Errorf("%s: cpu allocatable/capacity = %s/%s; want 7/7500m", when, alloc.String(), capa.String())
	}
	// Only cpu is amplified in the seed profile; memory must be left alone.
	if m := n.Status.Allocatable[corev1.ResourceMemory]; m.Cmp(resource.MustParse("7Gi")) != 0 {
		t.Errorf("%s: memory allocatable = %s; want 7Gi (untouched)", when, m.String())
	}
}

func hasReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

func TestNodeWithBadOvercommitRatioIsRejected(t *testing.T) {
	e := world(t)
	ctx := e2eenv.TestCtx(t, apiCallTimeout)
	var node corev1.Node
	seed(t, e, "bad-ratio-node.yaml", &node)
	node.Name = "e2e-bad-ratio-" + e.namespace
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), apiCallTimeout)
		defer cancel()
		_ = e.Client.CoreV1().Nodes().Delete(ctx, node.Name, metav1.DeleteOptions{})
	})

	_, err := e.Client.CoreV1().Nodes().Create(ctx, &node, metav1.CreateOptions{})
	if err == nil {
		t.Fatalf("node with %s %s was admitted; want it rejected", annotationRatio, node.Annotations[annotationRatio])
	}
	if !strings.Contains(err.Error(), annotationRatio) {
		t.Fatalf("error = %q; want it to name %s", err, annotationRatio)
	}
	t.Logf("rejected with HTTP %d: %v", statusCode(err), err)
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
	deadline := time.Now().Add(webhookTakeEffect)
	var denied error
	for {
		_, err := createPod(ctx, t, e, offensive)
		if err == nil {
			t.Fatalf("pod %q labelled for the v1beta1 hook was admitted; want it denied", offensive.Name)
		}
		denied = err
		m, err := webhookMetrics(ctx, e, hookName)
		if err != nil {
			t.Fatalf("read API server metrics: %v", err)
		}
		m = m.since(base)
		if m.callErrors > 0 {
			t.Fatalf("the API server failed to call %s (AdmissionReview v1beta1) %v times: %v; metrics: %v", hookName, m.callErrors, denied, m.lines)
		}
		if m.rejectedNoError > 0 {
			t.Logf("API server metrics for %s: %v", hookName, m.lines)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never rejected the pod within %s; last error %v; metrics: %v", hookName, webhookTakeEffect, denied, m.lines)
		}
		time.Sleep(250 * time.Millisecond)
	}
	if !strings.Contains(denied.Error(), offensiveMessage) || !apierrors.IsForbidden(denied) {
		t.Errorf("denial = HTTP %d %q; want 403 containing %q", statusCode(denied), denied, offensiveMessage)
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
	pool := x509.NewCertPool()
	if pem, err := os.ReadFile(caFile); err != nil || !pool.AppendCertsFromPEM(pem) {
		t.Fatalf("read the CA kadmit wrote to %s: %v", caFile, err)
	}
	hs := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
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

func statusCode(err error) int32 {
	var s apierrors.APIStatus
	if errors.As(err, &s) {
		return s.Status().Code
	}
	return 0
}
