package doctor

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kadmit/kadmit/internal/doctor"
	"github.com/kadmit/kadmit/test/e2e/e2eenv"
)

// countingTransport counts the requests doctor sends.
type countingTransport struct {
	rt http.RoundTripper
	n  *atomic.Int64
}

func (c countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.rt.RoundTrip(r)
}

// TestDoctorManyWebhooks is issue 20's "624 webhooks hit the 2-minute
// timeout": 600 webhooks (60 configurations of 10), each calling its own
// Service, spread over 4 namespaces, in the real API server. Doctor reads
// each namespace's objects once, so the run takes a number of API requests
// that does not grow with the webhooks (nine reads per Service before:
// 5,400 requests, 108 s at the CLI's 50 requests per second, 18 minutes at
// client-go's default 5), and finishes well inside the CLI's 2-minute
// --timeout at the CLI's rate limit.
func TestDoctorManyWebhooks(t *testing.T) {
	e := world(t)
	const configs, perConfig, namespaces = 60, 10, 4
	var nss []string
	for range namespaces {
		nss = append(nss, namespace(t, e, "many", nil))
	}
	var names []string
	rules := []admissionregistrationv1.RuleWithOperations{{
		Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
		Rule:       admissionregistrationv1.Rule{APIGroups: []string{"many.example.com"}, APIVersions: []string{"v1"}, Resources: []string{"widgets"}},
	}}
	for c := range configs {
		var hooks []hook
		for h := range perConfig {
			ns, svc := nss[(c*perConfig+h)%namespaces], fmt.Sprintf("svc-%d-%d", c, h)
			// Headless: 600 ClusterIPs would exhaust the test's service range.
			s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: svc, Namespace: ns}, Spec: corev1.ServiceSpec{
				ClusterIP: corev1.ClusterIPNone, Selector: map[string]string{"app": svc},
				Ports: []corev1.ServicePort{{Name: portName, Port: 443, TargetPort: intstr.FromInt32(targetPort), Protocol: corev1.ProtocolTCP}},
			}}
			if _, err := e.Client.CoreV1().Services(ns).Create(e2eenv.TestCtx(t, apiTimeout), s, metav1.CreateOptions{}); err != nil {
				t.Fatalf("create Service %s/%s: %v", ns, svc, err)
			}
			hooks = append(hooks, hook{Name: fmt.Sprintf("h%d.many.example.com", h), Service: svcRef(ns, svc), Rules: rules})
		}
		name := fmt.Sprintf("many-%03d-%s", c, suffix())
		validating(t, e, name, hooks...)
		names = append(names, name)
	}

	var requests atomic.Int64
	cfg := rest.CopyConfig(e.Config)
	cfg.QPS, cfg.Burst = 50, 100 // kadmit doctor's --qps and --burst defaults
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return countingTransport{rt: rt, n: &requests} })
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	rep, err := doctor.Run(e2eenv.TestCtx(t, 2*time.Minute), cs, doctor.Options{Names: names, Dial: guardedDial})
	took := time.Since(start)
	if err != nil {
		t.Fatalf("doctor.Run after %s and %d requests: %v", took, requests.Load(), err)
	}
	if len(rep.Webhooks) != configs*perConfig {
		t.Fatalf("%d webhooks in the report, want %d", len(rep.Webhooks), configs*perConfig)
	}
	for _, w := range rep.Webhooks {
		if !w.Has(doctor.IDNoReadyEndpoints) || w.Has(doctor.IDNotChecked) {
			t.Fatalf("%s/%s: want KD201 (no endpoints), checked through; got %+v", w.Configuration, w.Webhook, w.Findings)
		}
	}
	// 2 configuration lists, the namespaces, 8 lists per namespace holding
	// a webhook Service (the 4 here and those of other tests' webhooks still
	// registered), the admission policies: far below one request per webhook.
	const bound = 150
	t.Logf("%d webhooks checked in %s with %d API requests", len(rep.Webhooks), took, requests.Load())
	if n := requests.Load(); n > bound {
		t.Errorf("%d API requests for %d webhooks, want at most %d", n, len(rep.Webhooks), bound)
	}
	if took > 30*time.Second {
		t.Errorf("doctor took %s for %d webhooks, want under 30s", took, len(rep.Webhooks))
	}
}

// TestDoctorTimeoutPrintsPartialReport: `kubectl kadmit doctor` whose
// --timeout ends while a handshake hangs prints the report so far, each
// webhook not checked through marked KD003, and exits 2 (it used to print
// nothing). The endpoint is a loopback listener that never answers TLS.
func TestDoctorTimeoutPrintsPartialReport(t *testing.T) {
	e := world(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		var held []net.Conn // never read: every handshake hangs
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	rules := []admissionregistrationv1.RuleWithOperations{{
		Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
		Rule:       admissionregistrationv1.Rule{APIGroups: []string{"many.example.com"}, APIVersions: []string{"v1"}, Resources: []string{"widgets"}},
	}}
	var hooks []hook
	for i := range 3 {
		hooks = append(hooks, hook{Name: fmt.Sprintf("h%d.hang.example.com", i), URL: fmt.Sprintf("https://%s/h%d", ln.Addr(), i), Rules: rules})
	}
	name := "hang-" + suffix()
	validating(t, e, name, hooks...)

	start := time.Now()
	out, code := runPlugin(t, e, "doctor", name, "--timeout", "1500ms", "--concurrency", "1")
	if code != 2 || time.Since(start) > time.Minute {
		t.Fatalf("exit %d after %s; want 2 (incomplete)\n%s", code, time.Since(start), out)
	}
	for _, want := range []string{doctor.IDNotChecked, "report incomplete", "2 of 3 webhook(s) not checked", "h0.hang.example.com", "h2.hang.example.com"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}
