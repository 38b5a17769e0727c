package watch

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kadmit/kadmit/pkg/webhookcerts"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"

	"github.com/kadmit/kadmit/internal/doctor"
)

// loopbackDial refuses everything but 127.0.0.0/8: unit tests dial only
// the servers they start.
func loopbackDial(ctx context.Context, network, addr string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return nil, fmt.Errorf("%w: %s", doctor.ErrDialNotAllowed, addr)
	}
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}

type testCA struct {
	cert *x509.Certificate
	key  crypto.Signer
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	c, k, err := webhookcerts.NewCA(time.Now(), 24*time.Hour, webhookcerts.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{c, k}
}

func (c *testCA) pem() []byte { return webhookcerts.EncodeCertificates(c.cert) }

func (c *testCA) serving(t *testing.T, names ...string) *tls.Certificate {
	t.Helper()
	cp, kp, err := webhookcerts.IssueServing(c.cert, c.key, names, nil, time.Now(), time.Hour, webhookcerts.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	kpair, err := webhookcerts.ParseKeyPair(cp, kp)
	if err != nil {
		t.Fatal(err)
	}
	return kpair
}

// tlsServer accepts TLS handshakes on ip:port with a certificate the test
// may swap (a serving-certificate rotation) and can be stopped (a pod
// going away: connection refused).
type tlsServer struct {
	ln   net.Listener
	cert atomic.Pointer[tls.Certificate]
	addr string
}

func startTLS(t *testing.T, ip string, port int, cert *tls.Certificate) *tlsServer {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, fmt.Sprint(port)))
	if err != nil {
		t.Fatal(err)
	}
	s := &tlsServer{ln: ln, addr: ln.Addr().String()}
	s.cert.Store(cert)
	cfg := &tls.Config{GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return s.cert.Load(), nil }}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				tc := tls.Server(c, cfg)
				_ = tc.SetDeadline(time.Now().Add(2 * time.Second))
				_ = tc.Handshake()
			}()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return s
}

func (s *tlsServer) port() int { return s.ln.Addr().(*net.TCPAddr).Port }

const testNS = "hooks"

func ptr[T any](v T) *T { return &v }

func testService(name string, port int) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS}, Spec: corev1.ServiceSpec{
		Selector: map[string]string{"app": name},
		Ports:    []corev1.ServicePort{{Name: "https", Port: 443, TargetPort: intstr.FromInt(port)}},
	}}
}

// slice is the Service's EndpointSlice with port "https" = port and the
// given endpoints ("ip" ready, "ip!" not ready).
func slice(svc string, port int, eps ...string) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: svc + "-1", Namespace: testNS, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("https"), Port: ptr(int32(port))}}}
	for _, e := range eps {
		ip, notReady := strings.CutSuffix(e, "!")
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(!notReady)}})
	}
	return s
}

// validatingConfig has one webhook per name calling svc, with bundle.
func validatingConfig(name, svc string, fail bool, bundle []byte, hooks ...string) *admissionregistrationv1.ValidatingWebhookConfiguration {
	fp := admissionregistrationv1.Ignore
	if fail {
		fp = admissionregistrationv1.Fail
	}
	c := &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name)}}
	for _, h := range hooks {
		c.Webhooks = append(c.Webhooks, admissionregistrationv1.ValidatingWebhook{Name: h,
			ClientConfig: admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{Namespace: testNS, Name: svc, Port: ptr(int32(443))}, CABundle: bundle},
			Rules: []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule: admissionregistrationv1.Rule{APIGroups: []string{"example.com"}, APIVersions: []string{"v1"}, Resources: []string{"widgets"}}}},
			FailurePolicy: &fp, SideEffects: ptr(admissionregistrationv1.SideEffectClassNone), AdmissionReviewVersions: []string{"v1"}, TimeoutSeconds: ptr(int32(5)),
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"widgets": "yes"}}})
	}
	return c
}

// running is a controller started on a fake clientset.
type running struct {
	c   *Controller
	cs  *fake.Clientset
	rec *record.FakeRecorder
	// seen accumulates drained events (peek).
	seen []string
}

func startController(t *testing.T, mod func(*Options), objs ...runtime.Object) *running {
	t.Helper()
	return startControllerDenying(t, nil, mod, objs...)
}

// startControllerDenying is startController with the resources in deny
// refused to list and watch (SelfSubjectAccessReview not allowed).
func startControllerDenying(t *testing.T, deny map[string]bool, mod func(*Options), objs ...runtime.Object) *running {
	t.Helper()
	return startControllerWith(t, nil, deny, mod, objs...)
}

// startControllerWith lets setup add reactors to the fake clientset before
// anything runs (its reactor chain is not safe to change concurrently).
func startControllerWith(t *testing.T, setup func(*fake.Clientset), deny map[string]bool, mod func(*Options), objs ...runtime.Object) *running {
	t.Helper()
	objs = append(objs, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNS}})
	cs := fake.NewClientset(objs...)
	cs.PrependReactor("create", "selfsubjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		rev := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SelfSubjectAccessReview).DeepCopy()
		rev.Status.Allowed = !deny[rev.Spec.ResourceAttributes.Resource]
		return true, rev, nil
	})
	if setup != nil {
		setup(cs)
	}
	rec := record.NewFakeRecorder(1000)
	o := Options{Client: cs, HandshakeInterval: time.Second, Debounce: 50 * time.Millisecond, ConfirmDelay: 300 * time.Millisecond,
		HandshakeTimeout: time.Second, Dial: loopbackDial}
	if mod != nil {
		mod(&o)
	}
	c, err := New(o, rec)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, "") }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return &running{c: c, cs: cs, rec: rec}
}

// states returns the last evaluation's states by "config/webhook".
func (r *running) states() map[string]*webhookState {
	out := map[string]*webhookState{}
	if p := r.c.states.Load(); p != nil {
		for _, s := range *p {
			out[s.key.Configuration+"/"+s.key.Webhook] = s
		}
	}
	return out
}

func has(s *webhookState, id string, sev doctor.Severity) bool {
	if s == nil {
		return false
	}
	for _, f := range s.findings {
		if f.ID == id && f.Severity == sev {
			return true
		}
	}
	return false
}

// alarms lists the warning and error findings of s.
func alarms(s *webhookState) []string {
	var out []string
	if s == nil {
		return nil
	}
	for _, f := range s.findings {
		if f.Severity != doctor.SeverityInfo {
			out = append(out, f.String())
		}
	}
	return out
}

// drain returns the events recorded so far.
func drain(rec *record.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-rec.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}
