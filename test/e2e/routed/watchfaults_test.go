package routed

// Fault backends for the `kadmit watch` e2e: each failure class gets its own
// webhook backend (a Deployment, its ReplicaSet and pods as objects, a
// Service, an EndpointSlice whose addresses are TLS servers of this test on
// 198.18.1.0/24, a PodDisruptionBudget) and its own
// ValidatingWebhookConfiguration, all in namespace watchFaultsNS, so that
// injecting a fault never touches kadmit's own path. The namespace carries
// kadmit.io/ignore=true: kadmit's own webhooks skip it, so the backends'
// pods are not kadmit's business (no KD505 on kadmit's configurations).

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kadmit/kadmit/pkg/webhookcerts"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/kadmit/kadmit/test/e2e/e2eenv"
	"github.com/kadmit/kadmit/test/netns"
)

const (
	watchFaultsNS = "watch-faults"
	// faultReplicas is each backend's ready endpoints: two, so that a
	// healthy backend has no KD604 (single replica) finding.
	faultReplicas = 2
	// faultTemplateHash names the backends' ReplicaSets as a Deployment
	// controller would (<deployment>-<pod-template-hash>).
	faultTemplateHash = "6f8d9c7b5"
	// otherTemplateHash is the colliding workload's.
	otherTemplateHash = "7c5b8d4f9"
	// healthyValidity is the backends' serving certificates' lifetime:
	// well past the 7 days of KadmitWebhookCertificateExpiringSoon.
	healthyValidity = 90 * 24 * time.Hour
)

// testCA signs the fault backends' serving certificates.
type testCA struct {
	cert *x509.Certificate
	key  crypto.Signer
	pem  []byte
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	c, k, err := webhookcerts.NewCA(time.Now(), 365*24*time.Hour, webhookcerts.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: c, key: k, pem: webhookcerts.EncodeCertificates(c)}
}

// issue signs a serving certificate for dnsName valid from notBefore for
// validity (in the past for an expired one).
func (ca *testCA) issue(t *testing.T, dnsName string, notBefore time.Time, validity time.Duration) *tls.Certificate {
	t.Helper()
	// IssueServing backdates NotBefore by min(5m, validity/10).
	certPEM, keyPEM, err := webhookcerts.IssueServing(ca.cert, ca.key, []string{dnsName}, nil, notBefore, validity, webhookcerts.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	c, err := webhookcerts.ParseKeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// faultServer is one endpoint of a fault backend: an HTTPS server that
// admits every AdmissionReview, with a certificate the test can swap.
type faultServer struct {
	ip   string
	cert atomic.Pointer[tls.Certificate]
	srv  *http.Server
	ln   net.Listener
}

func startFaultServer(t *testing.T, ip string, cert *tls.Certificate) *faultServer {
	t.Helper()
	if err := netns.AddLoopbackAddr(ip); err != nil {
		t.Fatal(err)
	}
	s := &faultServer{ip: ip}
	s.cert.Store(cert)
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(targetPort)))
	if err != nil {
		t.Fatal(err)
	}
	s.ln = ln
	s.srv = &http.Server{
		Handler:           http.HandlerFunc(admitAll),
		ReadHeaderTimeout: 5 * time.Second,
		TLSConfig: &tls.Config{MinVersion: tls.VersionTLS12,
			GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return s.cert.Load(), nil }},
		// The watch handshakes and hangs up without a request: net/http
		// would log each such connection.
		ErrorLog: log.New(io.Discard, "", 0),
	}
	go func() { _ = s.srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.srv.Shutdown(ctx)
	})
	return s
}

// admitAll answers an AdmissionReview v1 with allowed: true.
func admitAll(w http.ResponseWriter, r *http.Request) {
	var rev admissionv1.AdmissionReview
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&rev); err != nil || rev.Request == nil {
		http.Error(w, "want an AdmissionReview", http.StatusBadRequest)
		return
	}
	rev.Response = &admissionv1.AdmissionResponse{UID: rev.Request.UID, Allowed: true}
	rev.Request = nil
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(&rev)
}

// stallListener accepts TCP connections and never answers: a TLS handshake
// with it times out. It reads (and drops) what the peer sends until the peer
// hangs up; at most maxStalled connections are held, further ones closed at
// once.
type stallListener struct {
	ln     net.Listener
	mu     sync.Mutex
	conns  map[net.Conn]bool
	closed bool
}

const maxStalled = 64

func startStallListener(t *testing.T, ip string) *stallListener {
	t.Helper()
	if err := netns.AddLoopbackAddr(ip); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(targetPort)))
	if err != nil {
		t.Fatal(err)
	}
	s := &stallListener{ln: ln, conns: map[net.Conn]bool{}}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			if s.closed || len(s.conns) >= maxStalled {
				s.mu.Unlock()
				_ = c.Close()
				continue
			}
			s.conns[c] = true
			s.mu.Unlock()
			go func() {
				_, _ = io.Copy(io.Discard, c)
				_ = c.Close()
				s.mu.Lock()
				delete(s.conns, c)
				s.mu.Unlock()
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		s.mu.Lock()
		defer s.mu.Unlock()
		s.closed = true
		for c := range s.conns {
			_ = c.Close()
		}
	})
	return s
}

// faultBackend is one webhook and what stands behind it.
type faultBackend struct {
	e       *env
	class   string // e.g. "refused"
	name    string // Service, Deployment, configuration: "wf-<class>"
	webhook string // the webhook's name
	ca      *testCA
	servers []*faultServer
	// endpoints are the EndpointSlice's addresses and readiness, in order.
	endpoints []faultEndpoint
	index     int              // picks the addresses: 198.18.1.<10*index+n>
	swapped   *tls.Certificate // servers[0]'s own certificate while a class swaps it
	deleted   bool
}

// spareIP is the backend's address n (0-9) beyond its servers'.
func (b *faultBackend) spareIP(n int) string { return fmt.Sprintf("198.18.1.%d", 10*b.index+n) }

// addEndpoint adds a ready endpoint at ip for a new pod of the backend's
// ReplicaSet named <rs>-<suffix>, and writes the slice.
func (b *faultBackend) addEndpoint(ctx context.Context, ip, suffix string) error {
	pod := b.name + "-" + faultTemplateHash + "-" + suffix
	if err := createPods(ctx, b.e, b.name+"-"+faultTemplateHash, []string{pod}, []string{ip}); err != nil {
		return err
	}
	b.endpoints = append(b.endpoints, faultEndpoint{ip: ip, ready: true, pod: pod})
	return b.writeSlice(ctx)
}

// removeEndpoint undoes addEndpoint.
func (b *faultBackend) removeEndpoint(ctx context.Context, suffix string) error {
	pod := b.name + "-" + faultTemplateHash + "-" + suffix
	b.endpoints = slices.DeleteFunc(b.endpoints, func(ep faultEndpoint) bool { return ep.pod == pod })
	if err := b.writeSlice(ctx); err != nil {
		return err
	}
	err := b.e.Client.CoreV1().Pods(watchFaultsNS).Delete(ctx, pod, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	if apierrors.IsNotFound(err) {
		err = nil
	}
	return err
}

type faultEndpoint struct {
	ip    string
	ready bool
	pod   string
}

func (b *faultBackend) serverName() string { return b.name + "." + watchFaultsNS + ".svc" }

func (b *faultBackend) labels() map[string]string { return map[string]string{"app": b.name} }

// ensureFaultsNamespace creates watchFaultsNS once.
func (e *env) ensureFaultsNamespace(t *testing.T) {
	t.Helper()
	ctx := e2eenv.TestCtx(t, 30*time.Second)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: watchFaultsNS, Labels: map[string]string{"kadmit.io/ignore": "true"}}}
	if _, err := e.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// newFaultBackend builds a healthy backend for class: index picks its
// addresses (198.18.1.<10*index+1..>).
func (e *env) newFaultBackend(t *testing.T, class string, index int) *faultBackend {
	t.Helper()
	ctx := e2eenv.TestCtx(t, time.Minute)
	b := &faultBackend{e: e, class: class, name: "wf-" + class, ca: newTestCA(t), index: index}
	b.webhook = b.name + ".watch-e2e.kadmit.test"
	leaf := b.ca.issue(t, b.serverName(), time.Now(), healthyValidity)
	for i := range faultReplicas {
		ip := b.spareIP(1 + i)
		b.servers = append(b.servers, startFaultServer(t, ip, leaf))
		b.endpoints = append(b.endpoints, faultEndpoint{ip: ip, ready: true, pod: fmt.Sprintf("%s-%s-%c", b.name, faultTemplateHash, 'a'+i)})
	}
	t.Cleanup(func() { b.delete(t) })

	cs := e.Client
	if err := createWorkloadHash(ctx, e, b.name, b.labels(), faultTemplateHash, b.podNames(), b.ips()); err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: b.name, Namespace: watchFaultsNS},
		Spec: corev1.ServiceSpec{Selector: b.labels(), Ports: []corev1.ServicePort{{Name: portName, Port: servicePort,
			TargetPort: intstr.FromInt32(targetPort), Protocol: corev1.ProtocolTCP}}},
	}
	if _, err := cs.CoreV1().Services(watchFaultsNS).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: b.name, Namespace: watchFaultsNS},
		Spec:       policyv1.PodDisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromInt32(1)), Selector: &metav1.LabelSelector{MatchLabels: b.labels()}},
	}
	if _, err := cs.PolicyV1().PodDisruptionBudgets(watchFaultsNS).Create(ctx, pdb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := b.writeSlice(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, b.config(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return b
}

func (b *faultBackend) ips() []string {
	var out []string
	for _, ep := range b.endpoints {
		out = append(out, ep.ip)
	}
	return out
}

func (b *faultBackend) podNames() []string {
	var out []string
	for _, ep := range b.endpoints {
		out = append(out, ep.pod)
	}
	return out
}

// config is the backend's healthy ValidatingWebhookConfiguration: Fail,
// ConfigMap creations in watchFaultsNS only (nothing the suite does), the
// backend's CA as caBundle.
func (b *faultBackend) config() *admissionregistrationv1.ValidatingWebhookConfiguration {
	fail, none := admissionregistrationv1.Fail, admissionregistrationv1.SideEffectClassNone
	return &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: b.name},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name: b.webhook,
			ClientConfig: admissionregistrationv1.WebhookClientConfig{CABundle: b.ca.pem, Service: &admissionregistrationv1.ServiceReference{
				Namespace: watchFaultsNS, Name: b.name, Port: ptr.To[int32](servicePort), Path: ptr.To("/validate")}},
			Rules:                   []admissionregistrationv1.RuleWithOperations{configMapCreate},
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": watchFaultsNS}},
			FailurePolicy:           &fail,
			SideEffects:             &none,
			AdmissionReviewVersions: []string{"v1"},
			TimeoutSeconds:          ptr.To[int32](5),
		}},
	}
}

var (
	configMapCreate = admissionregistrationv1.RuleWithOperations{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
		Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}}}
	podCreate = admissionregistrationv1.RuleWithOperations{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
		Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}}}
)

// writeSlice writes the backend's EndpointSlice from b.endpoints.
func (b *faultBackend) writeSlice(ctx context.Context) error {
	var eps []discoveryv1.Endpoint
	for _, ep := range b.endpoints {
		eps = append(eps, discoveryv1.Endpoint{Addresses: []string{ep.ip},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(ep.ready), Serving: ptr.To(ep.ready), Terminating: ptr.To(false)},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: watchFaultsNS, Name: ep.pod}})
	}
	desired := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: b.name, Namespace: watchFaultsNS, Labels: map[string]string{
			discoveryv1.LabelServiceName: b.name, discoveryv1.LabelManagedBy: "routed-e2e.kadmit.io"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   eps,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To(portName), Port: ptr.To[int32](targetPort), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	api := b.e.Client.DiscoveryV1().EndpointSlices(watchFaultsNS)
	cur, err := api.Get(ctx, b.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = api.Create(ctx, desired, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	desired.ResourceVersion = cur.ResourceVersion
	_, err = api.Update(ctx, desired, metav1.UpdateOptions{})
	return err
}

// updateConfig applies edit to the backend's configuration's webhook.
func (b *faultBackend) updateConfig(ctx context.Context, edit func(w *admissionregistrationv1.ValidatingWebhook)) error {
	api := b.e.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	cur, err := api.Get(ctx, b.name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if len(cur.Webhooks) != 1 {
		return fmt.Errorf("%s has %d webhooks", b.name, len(cur.Webhooks))
	}
	edit(&cur.Webhooks[0])
	_, err = api.Update(ctx, cur, metav1.UpdateOptions{FieldManager: "watch-e2e"})
	return err
}

// delete removes every object of the backend, once; it also runs from
// t.Cleanup, when t's context has ended.
func (b *faultBackend) delete(t *testing.T) {
	if b.deleted {
		return
	}
	b.deleted = true
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs := b.e.Client
	var errs []error
	add := func(err error) {
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	add(cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(ctx, b.name, metav1.DeleteOptions{}))
	add(cs.DiscoveryV1().EndpointSlices(watchFaultsNS).Delete(ctx, b.name, metav1.DeleteOptions{}))
	add(cs.CoreV1().Services(watchFaultsNS).Delete(ctx, b.name, metav1.DeleteOptions{}))
	add(cs.PolicyV1().PodDisruptionBudgets(watchFaultsNS).Delete(ctx, b.name, metav1.DeleteOptions{}))
	add(deleteWorkloadHash(ctx, b.e, b.name, faultTemplateHash, append(b.podNames(), b.name+"-"+faultTemplateHash+"-z")))
	if err := errors.Join(errs...); err != nil {
		t.Errorf("deleting fault backend %s: %v", b.name, err)
	}
}

// createWorkloadHash creates Deployment name, its ReplicaSet
// name-hash and pods (objects only: no kubelet runs them) with
// controller owner references, as a Deployment controller would.
func createWorkloadHash(ctx context.Context, e *env, name string, lbls map[string]string, hash string, pods, ips []string) error {
	cs := e.Client
	tmplLabels := map[string]string{"pod-template-hash": hash}
	for k, v := range lbls {
		tmplLabels[k] = v
	}
	// A preStop sleep inside the grace period, as a well-run webhook has:
	// each fault injects one class, not also KD203.
	spec := corev1.PodSpec{TerminationGracePeriodSeconds: ptr.To[int64](45), Containers: []corev1.Container{{Name: "webhook", Image: "registry.k8s.io/pause:3.10",
		Ports:     []corev1.ContainerPort{{Name: portName, ContainerPort: targetPort, Protocol: corev1.ProtocolTCP}},
		Lifecycle: &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: 10}}}}}}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: watchFaultsNS, Labels: lbls},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To(int32(len(pods))), Selector: &metav1.LabelSelector{MatchLabels: lbls},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: lbls}, Spec: spec}},
	}
	d, err := cs.AppsV1().Deployments(watchFaultsNS).Create(ctx, d, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create Deployment %s: %w", name, err)
	}
	rs := &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-" + hash, Namespace: watchFaultsNS, Labels: tmplLabels,
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(d, appsv1.SchemeGroupVersion.WithKind("Deployment"))}},
		Spec: appsv1.ReplicaSetSpec{Replicas: ptr.To(int32(len(pods))), Selector: &metav1.LabelSelector{MatchLabels: tmplLabels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: tmplLabels}, Spec: spec}},
	}
	rs, err = cs.AppsV1().ReplicaSets(watchFaultsNS).Create(ctx, rs, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create ReplicaSet %s: %w", name, err)
	}
	return createPods(ctx, e, rs.Name, pods, ips)
}

// createPods creates pods of ReplicaSet rsName (its template, a controller
// owner reference to it) with the status a kubelet reports for a running,
// ready pod at ips[i].
func createPods(ctx context.Context, e *env, rsName string, pods, ips []string) error {
	cs := e.Client
	rs, err := cs.AppsV1().ReplicaSets(watchFaultsNS).Get(ctx, rsName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	for i, pn := range pods {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: pn, Namespace: watchFaultsNS, Labels: rs.Spec.Template.Labels,
				OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(rs, appsv1.SchemeGroupVersion.WithKind("ReplicaSet"))}},
			Spec: rs.Spec.Template.Spec,
		}
		p, err := cs.CoreV1().Pods(watchFaultsNS).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create pod %s: %w", pn, err)
		}
		p.Status = corev1.PodStatus{Phase: corev1.PodRunning,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}}
		if i < len(ips) {
			p.Status.PodIP, p.Status.PodIPs = ips[i], []corev1.PodIP{{IP: ips[i]}}
		}
		if _, err := cs.CoreV1().Pods(watchFaultsNS).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("pod %s status: %w", pn, err)
		}
	}
	return nil
}

// deleteWorkloadHash removes what createWorkloadHash made. Pods bound to no node
// are deleted at once (no kubelet has to confirm).
func deleteWorkloadHash(ctx context.Context, e *env, name, hash string, pods []string) error {
	cs := e.Client
	var errs []error
	add := func(err error) {
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	for _, pn := range pods {
		add(cs.CoreV1().Pods(watchFaultsNS).Delete(ctx, pn, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}))
	}
	add(cs.AppsV1().ReplicaSets(watchFaultsNS).Delete(ctx, name+"-"+hash, metav1.DeleteOptions{}))
	add(cs.AppsV1().Deployments(watchFaultsNS).Delete(ctx, name, metav1.DeleteOptions{}))
	return errors.Join(errs...)
}
