package watch

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kadmit/kadmit/pkg/webhookcerts"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kadmit/kadmit/test/controlplane/kadmitproc"
	"github.com/kadmit/kadmit/test/e2e/e2eenv"
	"github.com/kadmit/kadmit/test/netns"
	"github.com/kadmit/kadmit/test/poll"
)

const (
	apiTimeout = 30 * time.Second
	// informerDriven is issue 15's bound for failures the informers see.
	informerDriven = 5 * time.Second
	targetPort     = 9443
	// webhookIP is the test webhook server's address on the namespace's lo.
	webhookIP = "198.18.0.31"
)

// watchProc is a running `kadmit watch`.
type watchProc struct {
	cmd     *exec.Cmd
	metrics string // http://addr
	log     string
	exited  chan struct{}
}

// startWatch runs `kadmit watch` on the control plane with leader
// election in namespace kadmit-system, its metrics on a free loopback
// port, its log in Tmp/watch.log; it stops (SIGTERM, then SIGKILL after
// 10s) when the test ends. It returns once /readyz answers 200 and the
// replica leads.
func startWatch(t *testing.T, e *e2eenv.Env) *watchProc {
	t.Helper()
	ctx := e2eenv.TestCtx(t, 2*time.Minute)
	if _, err := e.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kadmit-system"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	addr, err := kadmitproc.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	p := &watchProc{metrics: "http://" + addr, log: filepath.Join(e.Tmp, "watch.log"), exited: make(chan struct{})}
	logf, err := os.Create(p.log)
	if err != nil {
		t.Fatal(err)
	}
	p.cmd = exec.Command(e.Binary, "watch", "--kubeconfig", e.Kubeconfig, "--metrics-addr", addr, "--namespace", "kadmit-system",
		"--identity", "watch-e2e", "--log-format", "text", "--log-level", "debug")
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); logf.Close(); close(p.exited) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.exited
			t.Errorf("kadmit watch did not stop within 10s of SIGTERM")
		}
		if t.Failed() {
			b, _ := os.ReadFile(p.log)
			lines := strings.Split(string(b), "\n")
			t.Logf("watch log (last 40 lines):\n%s", strings.Join(lines[max(0, len(lines)-40):], "\n"))
		}
	})
	err = poll.Until(ctx, time.Minute, func(ctx context.Context) error {
		select {
		case <-p.exited:
			return poll.Stop(fmt.Errorf("kadmit watch exited: %v", p.cmd.ProcessState))
		default:
		}
		if code, _, err := get(ctx, p.metrics+"/readyz"); err != nil || code != http.StatusOK {
			return fmt.Errorf("readyz: %d %v", code, err)
		}
		body, err := p.scrape(ctx)
		if err != nil {
			return err
		}
		if v, ok := metric(body, "kadmit_watch_leader", nil); !ok || v != 1 {
			return fmt.Errorf("kadmit_watch_leader = %v (present %v)", v, ok)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("kadmit watch not ready and leading: %v", err)
	}
	return p
}

func get(ctx context.Context, url string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	return resp.StatusCode, string(b), err
}

func (p *watchProc) scrape(ctx context.Context) (string, error) {
	code, body, err := get(ctx, p.metrics+"/metrics")
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("/metrics: HTTP %d", code)
	}
	return body, err
}

// metric returns the value of the first sample of name whose labels
// include every pair of labels, in the text exposition format.
func metric(body, name string, labels map[string]string) (float64, bool) {
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		ok := true
		for k, v := range labels {
			if !strings.Contains(line, k+`="`+v+`"`) {
				ok = false
				break
			}
		}
		if !ok {
			continue
		}
		f, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		return f, err == nil
	}
	return 0, false
}

// event reports whether an Event of type typ and reason is recorded on the
// ValidatingWebhookConfiguration config (in namespace default).
func event(ctx context.Context, e *e2eenv.Env, config, typ, reason string) (string, bool, error) {
	l, err := e.Client.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{FieldSelector: fields.Set{
		"involvedObject.kind": "ValidatingWebhookConfiguration", "involvedObject.name": config, "reason": reason, "type": typ}.String()})
	if err != nil {
		return "", false, err
	}
	if len(l.Items) == 0 {
		return "", false, nil
	}
	return l.Items[0].Message, true, nil
}

// The watch finds a Fail webhook whose Service has no endpoint (KD201) in
// /metrics and as a Warning Event within 5s of the configuration's
// creation, and clears both (series gone, Normal KD201Resolved) within 5s
// of a ready endpoint appearing; the endpoint, a TLS server with a
// certificate from the caBundle's CA, is handshaken and raises nothing; a
// caBundle from another CA is KD404 within 5s, resolved when restored;
// deleting the configuration deletes its series.
func TestNoEndpointsFoundAndResolved(t *testing.T) {
	e := suite.Env(t)
	if !netns.Inside() {
		t.Skip("needs the private network namespace")
	}
	w := startWatch(t, e)
	ctx := e2eenv.TestCtx(t, 3*time.Minute)
	sfx := fmt.Sprintf("%05d", rand.IntN(100000))
	ns, svc, config, hook := "watch-e2e-"+sfx, "hook", "watch-e2e-"+sfx, "fail.watch-e2e.kadmit.io"
	if _, err := e.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Client.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: svc}, Spec: corev1.ServiceSpec{
		Selector: map[string]string{"app": svc},
		Ports:    []corev1.ServicePort{{Name: "https", Port: 443, TargetPort: intstr.FromInt32(targetPort), Protocol: corev1.ProtocolTCP}},
	}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	caCert, caKey, err := webhookcerts.NewCA(time.Now(), 24*time.Hour, webhookcerts.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	fail, none := admissionregistrationv1.Fail, admissionregistrationv1.SideEffectClassNone
	cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: config}, Webhooks: []admissionregistrationv1.ValidatingWebhook{{
		Name: hook,
		ClientConfig: admissionregistrationv1.WebhookClientConfig{CABundle: webhookcerts.EncodeCertificates(caCert),
			Service: &admissionregistrationv1.ServiceReference{Namespace: ns, Name: svc, Path: ptr("/validate"), Port: ptr(int32(443))}},
		Rules: []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
			Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}}}},
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}},
		FailurePolicy:     &fail, SideEffects: &none, AdmissionReviewVersions: []string{"v1"}, TimeoutSeconds: ptr(int32(5)),
	}}}
	reg := e.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	t.Cleanup(func() { _ = reg.Delete(context.Background(), config, metav1.DeleteOptions{}) })
	finding := map[string]string{"configuration": config, "webhook": hook, "check": "KD201", "severity": "error"}

	// 1. No endpoint: metric and Warning Event.
	t0 := time.Now()
	if _, err := reg.Create(ctx, cfg, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	toMetric, toEvent := both(t, ctx, 30*time.Second, t0,
		func(ctx context.Context) (bool, error) {
			body, err := w.scrape(ctx)
			v, ok := metric(body, "kadmit_watch_findings", finding)
			return ok && v == 1, err
		},
		func(ctx context.Context) (bool, error) {
			msg, ok, err := event(ctx, e, config, corev1.EventTypeWarning, "KD201")
			if ok && !strings.HasPrefix(msg, "webhook "+hook+": ") {
				t.Errorf("Warning KD201 message %q, want it to start with \"webhook %s: \"", msg, hook)
			}
			return ok, err
		})
	fmt.Printf("watch e2e: no endpoints (KD201): metric after %s, Warning Event after %s\n", toMetric.Round(time.Millisecond), toEvent.Round(time.Millisecond))
	if toMetric > informerDriven || toEvent > informerDriven {
		t.Errorf("KD201 took %s to the metric and %s to the Event; want both under %s", toMetric, toEvent, informerDriven)
	}

	// 2. A ready endpoint with a certificate from the caBundle's CA.
	if err := netns.AddLoopbackAddr(webhookIP); err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := webhookcerts.IssueServing(caCert, caKey, []string{svc + "." + ns + ".svc"}, nil, time.Now(), time.Hour, webhookcerts.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := webhookcerts.ParseKeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(webhookIP, strconv.Itoa(targetPort)))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.NotFoundHandler(), TLSConfig: &tls.Config{Certificates: []tls.Certificate{*kp}}, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = srv.Close() })
	t1 := time.Now()
	if _, err := e.Client.DiscoveryV1().EndpointSlices(ns).Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: svc + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: svc, discoveryv1.LabelManagedBy: "watch-e2e"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("https"), Port: ptr(int32(targetPort)), Protocol: ptr(corev1.ProtocolTCP)}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{webhookIP}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	toClear, toResolved := both(t, ctx, 30*time.Second, t1,
		func(ctx context.Context) (bool, error) {
			body, err := w.scrape(ctx)
			_, ok := metric(body, "kadmit_watch_findings", finding)
			ready, rok := metric(body, "kadmit_watch_ready_endpoints", map[string]string{"configuration": config, "webhook": hook})
			return !ok && rok && ready == 1, err
		},
		func(ctx context.Context) (bool, error) {
			_, ok, err := event(ctx, e, config, corev1.EventTypeNormal, "KD201Resolved")
			return ok, err
		})
	fmt.Printf("watch e2e: ready endpoint added: KD201 series gone after %s, Normal KD201Resolved after %s\n", toClear.Round(time.Millisecond), toResolved.Round(time.Millisecond))
	if toClear > informerDriven || toResolved > informerDriven {
		t.Errorf("clearing took %s (metric) and %s (Event); want both under %s", toClear, toResolved, informerDriven)
	}

	// 3. The endpoint is handshaken (its leaf's expiry is exported) and,
	// being healthy, raises no warning or error.
	endpoint := map[string]string{"configuration": config, "webhook": hook, "endpoint": net.JoinHostPort(webhookIP, strconv.Itoa(targetPort))}
	if err := poll.Until(ctx, 30*time.Second, func(ctx context.Context) error {
		body, err := w.scrape(ctx)
		if err != nil {
			return err
		}
		if v, ok := metric(body, "kadmit_watch_serving_cert_expiry_timestamp_seconds", endpoint); !ok || int64(v) != kp.Leaf.NotAfter.Unix() {
			return fmt.Errorf("serving cert expiry = %v (present %v), want %d", v, ok, kp.Leaf.NotAfter.Unix())
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := poll.Holds(ctx, 3*time.Second, func(ctx context.Context) error {
		body, err := w.scrape(ctx)
		if err != nil {
			return err
		}
		for _, sev := range []string{"warning", "error"} {
			for _, line := range strings.Split(body, "\n") {
				if strings.HasPrefix(line, "kadmit_watch_findings{") && strings.Contains(line, `configuration="`+config+`"`) && strings.Contains(line, `severity="`+sev+`"`) &&
					!strings.Contains(line, `check="KD605"`) && !strings.Contains(line, `check="KD604"`) {
					return fmt.Errorf("healthy endpoint: %s", line)
				}
			}
		}
		return nil
	}); err != nil {
		t.Error(err)
	}

	// 4. A caBundle from another CA (handshake-driven: the chain the
	// endpoint serves no longer verifies): KD404, then resolved.
	otherCA, _, err := webhookcerts.NewCA(time.Now(), 24*time.Hour, webhookcerts.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	setBundle := func(bundle []byte) {
		t.Helper()
		cur, err := reg.Get(ctx, config, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cur.Webhooks[0].ClientConfig.CABundle = bundle
		if _, err := reg.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	kd404 := map[string]string{"configuration": config, "webhook": hook, "check": "KD404", "severity": "error"}
	t2 := time.Now()
	setBundle(webhookcerts.EncodeCertificates(otherCA))
	toMetric, toEvent = both(t, ctx, 30*time.Second, t2,
		func(ctx context.Context) (bool, error) {
			body, err := w.scrape(ctx)
			v, ok := metric(body, "kadmit_watch_findings", kd404)
			return ok && v == 1, err
		},
		func(ctx context.Context) (bool, error) {
			_, ok, err := event(ctx, e, config, corev1.EventTypeWarning, "KD404")
			return ok, err
		})
	fmt.Printf("watch e2e: caBundle from another CA (KD404): metric after %s, Warning Event after %s\n", toMetric.Round(time.Millisecond), toEvent.Round(time.Millisecond))
	if toMetric > informerDriven || toEvent > informerDriven {
		t.Errorf("KD404 took %s to the metric and %s to the Event; want both under %s", toMetric, toEvent, informerDriven)
	}
	t3 := time.Now()
	setBundle(webhookcerts.EncodeCertificates(caCert))
	toClear, toResolved = both(t, ctx, 30*time.Second, t3,
		func(ctx context.Context) (bool, error) {
			body, err := w.scrape(ctx)
			_, ok := metric(body, "kadmit_watch_findings", kd404)
			return !ok, err
		},
		func(ctx context.Context) (bool, error) {
			_, ok, err := event(ctx, e, config, corev1.EventTypeNormal, "KD404Resolved")
			return ok, err
		})
	fmt.Printf("watch e2e: caBundle restored: KD404 series gone after %s, Normal KD404Resolved after %s\n", toClear.Round(time.Millisecond), toResolved.Round(time.Millisecond))

	// 5. Deleting the configuration deletes its series.
	if err := reg.Delete(ctx, config, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := poll.Until(ctx, 10*time.Second, func(ctx context.Context) error {
		body, err := w.scrape(ctx)
		if err != nil {
			return err
		}
		if strings.Contains(body, `configuration="`+config+`"`) {
			return fmt.Errorf("series of the deleted configuration remain")
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
}

// both polls a and b every 50ms from start until each has held once (or
// timeout), and returns how long after start each first held.
func both(t *testing.T, ctx context.Context, timeout time.Duration, start time.Time, a, b func(context.Context) (bool, error)) (time.Duration, time.Duration) {
	t.Helper()
	var da, db time.Duration
	deadline := start.Add(timeout)
	var lastErr error
	for da == 0 || db == 0 {
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("not within %s (metric after %s, Event after %s; last error %v)", timeout, da, db, lastErr)
		}
		for _, x := range []struct {
			f func(context.Context) (bool, error)
			d *time.Duration
		}{{a, &da}, {b, &db}} {
			if *x.d != 0 {
				continue
			}
			ok, err := x.f(ctx)
			if err != nil {
				lastErr = err
			}
			if ok {
				*x.d = time.Since(start)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return da, db
}

func ptr[T any](v T) *T { return &v }
