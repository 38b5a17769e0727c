package doctor

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kadmit/kadmit/pkg/webhookcerts"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kadmit/kadmit/internal/doctor"
	"github.com/kadmit/kadmit/test/e2e/e2eenv"
	"github.com/kadmit/kadmit/test/netns"
	"github.com/kadmit/kadmit/test/poll"
)

const (
	apiTimeout = 30 * time.Second
	// webhookTakeEffect bounds the wait for the API server to start (or
	// stop) calling a webhook after its configuration changed.
	webhookTakeEffect = 30 * time.Second
	portName          = "https"
	targetPort        = 9443
)

// testNet is the only non-loopback range tests may dial: 198.18.0.0/15 on the
// private namespace's lo.
var testNet = &net.IPNet{IP: net.IPv4(198, 18, 0, 0), Mask: net.CIDRMask(15, 32)}

// guardedDial is doctor's dialer in these tests: IP literals only (no DNS),
// loopback always, 198.18.0.0/15 only inside the private namespace (where it
// lives on lo). Everything else is refused with doctor.ErrDialNotAllowed,
// which doctor reports as "not reachable from here".
func guardedDial(ctx context.Context, network, addr string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", doctor.ErrDialNotAllowed, addr, err)
	}
	ip := net.ParseIP(host)
	switch {
	case ip == nil:
		return nil, fmt.Errorf("%w: %s is not an IP literal", doctor.ErrDialNotAllowed, addr)
	case ip.IsLoopback(), testNet.Contains(ip) && netns.Inside():
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	default:
		return nil, fmt.Errorf("%w: %s is outside loopback and 198.18.0.0/15", doctor.ErrDialNotAllowed, addr)
	}
}

// nextIP hands out 198.18.0.20 and up, one per server or endpoint, so that
// tests never share an address.
var ipCounter atomic.Int32

func nextIP(t *testing.T) string {
	t.Helper()
	n := 20 + ipCounter.Add(1)
	if n > 250 {
		t.Fatal("out of 198.18.0.x test addresses")
	}
	return fmt.Sprintf("198.18.0.%d", n)
}

func suffix() string { return fmt.Sprintf("%05d", rand.IntN(100000)) }

// namespace creates a namespace named prefix-<random> with labels. It is
// not deleted: without a namespace controller it would stay Terminating,
// and the control plane is discarded at the end anyway.
func namespace(t *testing.T, e *env, prefix string, labels map[string]string) string {
	t.Helper()
	name := prefix + "-" + suffix()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	if _, err := e.Client.CoreV1().Namespaces().Create(e2eenv.TestCtx(t, apiTimeout), ns, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
	return name
}

// workload creates what a controller install leaves in the API: a
// Deployment, its ReplicaSet (controller owner reference to the Deployment)
// and, when pods > 0, that many pods owned by the ReplicaSet, each with the
// template's labels and a container port named "https" (9443). It returns
// the pod names. edit changes the pod spec (template and pods) first.
func workload(t *testing.T, e *env, ns, name string, labels map[string]string, pods int, edit ...func(*corev1.PodSpec)) []string {
	t.Helper()
	ctx := e2eenv.TestCtx(t, apiTimeout)
	yes := true
	sel := &metav1.LabelSelector{MatchLabels: labels}
	spec := corev1.PodSpec{Containers: []corev1.Container{{Name: "manager", Image: "example.com/" + name + ":v1",
		Ports: []corev1.ContainerPort{{Name: portName, ContainerPort: targetPort}}}}}
	for _, f := range edit {
		f(&spec)
	}
	tmpl := corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: spec}
	d, err := e.Client.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec:       appsv1.DeploymentSpec{Replicas: ptr(int32(max(pods, 1))), Selector: sel, Template: tmpl},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create Deployment %s/%s: %v", ns, name, err)
	}
	rsLabels := map[string]string{"pod-template-hash": "5d4f" + suffix()}
	for k, v := range labels {
		rsLabels[k] = v
	}
	rsTmpl := tmpl
	rsTmpl.Labels = rsLabels
	rs, err := e.Client.AppsV1().ReplicaSets(ns).Create(ctx, &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-" + rsLabels["pod-template-hash"], Labels: rsLabels,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "Deployment", Name: d.Name, UID: d.UID, Controller: &yes}}},
		Spec: appsv1.ReplicaSetSpec{Replicas: ptr(int32(max(pods, 1))), Selector: &metav1.LabelSelector{MatchLabels: rsLabels}, Template: rsTmpl},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create ReplicaSet for %s/%s: %v", ns, name, err)
	}
	var names []string
	for i := 0; i < pods; i++ {
		p, err := e.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", rs.Name, i), Labels: rsLabels,
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: rs.Name, UID: rs.UID, Controller: &yes}}},
			Spec: spec,
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create pod of %s/%s: %v", ns, name, err)
		}
		names = append(names, p.Name)
	}
	return names
}

// service creates a ClusterIP Service with port 443 named "https" to
// targetPort 9443.
func service(t *testing.T, e *env, ns, name string, selector map[string]string) {
	t.Helper()
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: corev1.ServiceSpec{
		Selector: selector,
		Ports:    []corev1.ServicePort{{Name: portName, Port: 443, TargetPort: intstr.FromInt32(targetPort), Protocol: corev1.ProtocolTCP}},
	}}
	if _, err := e.Client.CoreV1().Services(ns).Create(e2eenv.TestCtx(t, apiTimeout), svc, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create Service %s/%s: %v", ns, name, err)
	}
}

// ep is one endpoint of a hand-made EndpointSlice.
type ep struct {
	IP    string
	Pod   string // targetRef pod name, optional
	Ready bool
}

// endpointSlice plays the endpoints controller: one IPv4 slice for Service
// ns/svc with port "https" 9443 and eps.
func endpointSlice(t *testing.T, e *env, ns, svc string, eps ...ep) {
	t.Helper()
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: svc + "-" + suffix(), Namespace: ns, Labels: map[string]string{
			discoveryv1.LabelServiceName: svc, discoveryv1.LabelManagedBy: "doctor-e2e"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr(portName), Port: ptr(int32(targetPort)), Protocol: ptr(corev1.ProtocolTCP)}},
	}
	for _, x := range eps {
		d := discoveryv1.Endpoint{Addresses: []string{x.IP}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(x.Ready)}}
		if x.Pod != "" {
			d.TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: x.Pod}
		}
		slice.Endpoints = append(slice.Endpoints, d)
	}
	if _, err := e.Client.DiscoveryV1().EndpointSlices(ns).Create(e2eenv.TestCtx(t, apiTimeout), slice, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create EndpointSlice for %s/%s: %v", ns, svc, err)
	}
}

// hook describes one webhook on pods CREATE for the configurations below.
type hook struct {
	Name              string
	Service           *admissionregistrationv1.ServiceReference // or URL
	URL               string
	CABundle          []byte
	Fail              bool
	TimeoutSeconds    int32
	NamespaceSelector *metav1.LabelSelector
	Rules             []admissionregistrationv1.RuleWithOperations
	ReviewVersions    []string
	MatchConditions   []admissionregistrationv1.MatchCondition
}

func (h hook) parts() (admissionregistrationv1.WebhookClientConfig, []admissionregistrationv1.RuleWithOperations, *admissionregistrationv1.FailurePolicyType, *int32, []string) {
	cc := admissionregistrationv1.WebhookClientConfig{Service: h.Service, CABundle: h.CABundle}
	if h.URL != "" {
		cc.URL = ptr(h.URL)
	}
	rules := h.Rules
	if rules == nil {
		rules = podRules()
	}
	fp := admissionregistrationv1.Ignore
	if h.Fail {
		fp = admissionregistrationv1.Fail
	}
	timeout := h.TimeoutSeconds
	if timeout == 0 {
		timeout = 5
	}
	versions := h.ReviewVersions
	if versions == nil {
		versions = []string{"v1"}
	}
	return cc, rules, &fp, &timeout, versions
}

func podRules() []admissionregistrationv1.RuleWithOperations {
	return []admissionregistrationv1.RuleWithOperations{{
		Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
		Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
	}}
}

// onlyNamespaces selects exactly the named namespaces, so that a test's
// webhook never intercepts another test's objects.
func onlyNamespaces(names ...string) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
		{Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpIn, Values: names}}}
}

func svcRef(ns, name string) *admissionregistrationv1.ServiceReference {
	return &admissionregistrationv1.ServiceReference{Namespace: ns, Name: name, Path: ptr("/validate"), Port: ptr(int32(443))}
}

// validating creates a ValidatingWebhookConfiguration and deletes it when
// the test ends.
func validating(t *testing.T, e *env, name string, hooks ...hook) {
	t.Helper()
	c := &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: name}}
	none := admissionregistrationv1.SideEffectClassNone
	for _, h := range hooks {
		cc, rules, fp, timeout, versions := h.parts()
		c.Webhooks = append(c.Webhooks, admissionregistrationv1.ValidatingWebhook{Name: h.Name, ClientConfig: cc, Rules: rules,
			FailurePolicy: fp, TimeoutSeconds: timeout, SideEffects: &none, AdmissionReviewVersions: versions, NamespaceSelector: h.NamespaceSelector, MatchConditions: h.MatchConditions})
	}
	reg := e.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	if _, err := reg.Create(e2eenv.TestCtx(t, apiTimeout), c, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ValidatingWebhookConfiguration %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
		defer cancel()
		if err := reg.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete ValidatingWebhookConfiguration %s: %v", name, err)
		}
	})
}

// mutating is validating for a MutatingWebhookConfiguration.
func mutating(t *testing.T, e *env, name string, hooks ...hook) {
	t.Helper()
	c := &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: name}}
	none := admissionregistrationv1.SideEffectClassNone
	for _, h := range hooks {
		cc, rules, fp, timeout, versions := h.parts()
		c.Webhooks = append(c.Webhooks, admissionregistrationv1.MutatingWebhook{Name: h.Name, ClientConfig: cc, Rules: rules,
			FailurePolicy: fp, TimeoutSeconds: timeout, SideEffects: &none, AdmissionReviewVersions: versions, NamespaceSelector: h.NamespaceSelector, MatchConditions: h.MatchConditions})
	}
	reg := e.Client.AdmissionregistrationV1().MutatingWebhookConfigurations()
	if _, err := reg.Create(e2eenv.TestCtx(t, apiTimeout), c, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create MutatingWebhookConfiguration %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
		defer cancel()
		if err := reg.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete MutatingWebhookConfiguration %s: %v", name, err)
		}
	})
}

// ca is a test CA.
type ca struct {
	cert *x509.Certificate
	key  crypto.Signer
}

func newCA(t *testing.T) *ca {
	t.Helper()
	c, k, err := webhookcerts.NewCA(time.Now(), 24*time.Hour, webhookcerts.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	return &ca{c, k}
}

func (c *ca) pem() []byte { return webhookcerts.EncodeCertificates(c.cert) }

// serving issues a certificate for names valid from notBefore for validity.
func (c *ca) serving(t *testing.T, names []string, notBefore time.Time, validity time.Duration) tls.Certificate {
	t.Helper()
	certPEM, keyPEM, err := webhookcerts.IssueServing(c.cert, c.key, names, nil, notBefore, validity, webhookcerts.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := webhookcerts.ParseKeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return *kp
}

// svcNames are the SANs a Service's serving certificate carries.
func svcNames(ns, svc string) []string {
	return []string{svc, svc + "." + ns, svc + "." + ns + ".svc", svc + "." + ns + ".svc.cluster.local"}
}

// webhookServer serves AdmissionReview v1 on ip:9443 with cert, admitting
// every request after delay; it puts ip on lo and stops with the test.
func webhookServer(t *testing.T, ip string, cert tls.Certificate, delay time.Duration) {
	t.Helper()
	if err := netns.AddLoopbackAddr(ip); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, fmt.Sprint(targetPort)))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{
		Handler:           http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { admit(w, r, delay) }),
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}},
		ReadHeaderTimeout: 10 * time.Second,
	}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
}

// admit answers an AdmissionReview v1 with allowed, after delay (bounded by
// the request's context, so a sleeping server does not outlive the call).
func admit(w http.ResponseWriter, r *http.Request, delay time.Duration) {
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-r.Context().Done():
			return
		}
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 8<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var rev admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &rev); err != nil || rev.Request == nil {
		http.Error(w, "not an AdmissionReview", http.StatusBadRequest)
		return
	}
	out := admissionv1.AdmissionReview{TypeMeta: rev.TypeMeta, Response: &admissionv1.AdmissionResponse{UID: rev.Request.UID, Allowed: true}}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

// waitCalled dry-runs pod creations in ns until the API server's answer
// names webhook (a call failed or the webhook denied), proving the API
// server has picked up the configuration. Bounded by webhookTakeEffect.
func waitCalled(t *testing.T, e *env, ns, webhook string) {
	t.Helper()
	err := poll.Until(t.Context(), webhookTakeEffect, func(ctx context.Context) error {
		_, err := e.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "wait-"},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "example.com/c"}}},
		}, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil && strings.Contains(err.Error(), `"`+webhook+`"`) {
			return nil
		}
		return fmt.Errorf("API server answered: %v", err)
	})
	if err != nil {
		t.Fatalf("the API server did not call webhook %s: %v", webhook, err)
	}
}

// runDoctor runs doctor in-process on the named configurations with the
// guarded dialer.
func runDoctor(t *testing.T, e *env, opts doctor.Options) *doctor.Report {
	t.Helper()
	opts.Dial = guardedDial
	rep, err := doctor.Run(e2eenv.TestCtx(t, 3*time.Minute), e.Client, opts)
	if err != nil {
		t.Fatalf("doctor.Run: %v", err)
	}
	return rep
}

// hookReport returns the report of webhook name in configuration config,
// failing the test (with the whole report) when absent.
func hookReport(t *testing.T, rep *doctor.Report, config, name string) *doctor.WebhookReport {
	t.Helper()
	w := rep.Webhook(config, name)
	if w == nil {
		t.Fatalf("no report for webhook %s of %s in:\n%s", name, config, render(rep))
	}
	return w
}

// need returns the findings with id, failing when there is none.
func need(t *testing.T, rep *doctor.Report, w *doctor.WebhookReport, id string, sev doctor.Severity) []doctor.Finding {
	t.Helper()
	fs := w.ByID(id)
	if len(fs) == 0 {
		t.Fatalf("webhook %s: no %s finding; report:\n%s", w.Webhook, id, render(rep))
	}
	for _, f := range fs {
		if f.Severity != sev {
			t.Errorf("webhook %s: %s has severity %s; want %s", w.Webhook, id, f.Severity, sev)
		}
	}
	return fs
}

func render(rep *doctor.Report) string {
	var b strings.Builder
	if err := doctor.WriteTable(&b, rep); err != nil {
		return err.Error()
	}
	return b.String()
}

func contains(t *testing.T, what, got string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(got, w) {
			t.Errorf("%s = %q; want it to contain %q", what, got, w)
		}
	}
}

func ptr[T any](v T) *T { return &v }
