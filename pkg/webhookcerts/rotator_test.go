package webhookcerts

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
)

// The test world: namespace "sys", Service "hook" (port 443 named https,
// target 9443), Secret "hook-cert", a validating configuration "v" with two
// webhooks, a mutating "m" with one, and a CRD "widgets.example.com" with a
// conversion webhook.
const (
	testNS     = "sys"
	testSvc    = "hook"
	testSecret = "hook-cert"
	serverName = "hook.sys.svc"
	testCRD    = "widgets.example.com"
)

var secretGVR = corev1.SchemeGroupVersion.WithResource("secrets")

// cluster is a fake API server: a typed clientset whose Secrets get
// resourceVersions and optimistic concurrency (the fake tracker has
// neither), and a dynamic client whose CRD applies merge the applied
// fields (the dynamic fake cannot apply to unstructured objects).
type cluster struct {
	kube *fake.Clientset
	dyn  *dynamicfake.FakeDynamicClient
	rv   atomic.Int64
	eps  *fakeEndpoints
}

func newCluster(t *testing.T, objs ...runtime.Object) *cluster {
	t.Helper()
	c := &cluster{eps: &fakeEndpoints{serve: map[string]*tls.Certificate{}}}
	var typed, crds []runtime.Object
	for _, o := range objs {
		if u, ok := o.(*unstructured.Unstructured); ok {
			crds = append(crds, u)
		} else {
			typed = append(typed, o)
		}
	}
	c.kube = fake.NewClientset(typed...)
	c.kube.PrependReactor("create", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		s := a.(k8stesting.CreateAction).GetObject().(*corev1.Secret)
		s.ResourceVersion = strconv.FormatInt(c.rv.Add(1), 10)
		return false, nil, nil // the tracker stores it, or answers AlreadyExists
	})
	c.kube.PrependReactor("update", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		s := a.(k8stesting.UpdateAction).GetObject().(*corev1.Secret).DeepCopy()
		cur, err := c.kube.Tracker().Get(secretGVR, s.Namespace, s.Name)
		if err != nil {
			return true, nil, err
		}
		// An empty resourceVersion is an unconditional update, as on a real
		// API server.
		if s.ResourceVersion != "" && cur.(*corev1.Secret).ResourceVersion != s.ResourceVersion {
			return true, nil, apierrors.NewConflict(secretGVR.GroupResource(), s.Name, errors.New("the object has been modified"))
		}
		s.ResourceVersion = strconv.FormatInt(c.rv.Add(1), 10)
		if err := c.kube.Tracker().Update(secretGVR, s, s.Namespace); err != nil {
			return true, nil, err
		}
		return true, s.DeepCopy(), nil
	})
	scheme := runtime.NewScheme()
	c.dyn = dynamicfake.NewSimpleDynamicClientWithCustomListKinds(scheme,
		map[schema.GroupVersionResource]string{crdGVR: "CustomResourceDefinitionList"}, crds...)
	c.dyn.PrependReactor("patch", "customresourcedefinitions", func(a k8stesting.Action) (bool, runtime.Object, error) {
		p := a.(k8stesting.PatchAction)
		if p.GetPatchType() != types.ApplyPatchType {
			return false, nil, nil
		}
		cur, err := c.dyn.Tracker().Get(crdGVR, "", p.GetName())
		if err != nil {
			return true, nil, err
		}
		var patch map[string]any
		if err := json.Unmarshal(p.GetPatch(), &patch); err != nil {
			return true, nil, err
		}
		u := cur.(*unstructured.Unstructured).DeepCopy()
		mergeMaps(u.Object, patch)
		if err := c.dyn.Tracker().Update(crdGVR, u, ""); err != nil {
			return true, nil, err
		}
		return true, u, nil
	})
	return c
}

// mergeMaps merges src into dst as a JSON merge patch does (maps merge,
// anything else replaces): enough to emulate an apply of the fields the
// Rotator applies.
func mergeMaps(dst, src map[string]any) {
	for k, v := range src {
		if sm, ok := v.(map[string]any); ok {
			if dm, ok := dst[k].(map[string]any); ok {
				mergeMaps(dm, sm)
				continue
			}
		}
		dst[k] = v
	}
}

// world returns the standard objects: Service, EndpointSlice (endpoints
// 10.0.0.1 and 10.0.0.2, ready), configurations v and m with empty
// caBundles, and the CRD.
func world() []runtime.Object {
	port := func(p int32) *int32 { return &p }
	name := func(s string) *string { return &s }
	yes := true
	sideEffects := admissionv1.SideEffectClassNone
	svcRef := &admissionv1.ServiceReference{Namespace: testNS, Name: testSvc, Path: name("/validate")}
	return []runtime.Object{
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: testSvc},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "https", Port: 443, TargetPort: intstr.FromInt32(9443)}}}},
		&discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: testNS, Name: testSvc + "-abc", Labels: map[string]string{discoveryv1.LabelServiceName: testSvc}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: name("https"), Port: port(9443)}},
			Endpoints: []discoveryv1.Endpoint{
				{Addresses: []string{"10.0.0.1"}, Conditions: discoveryv1.EndpointConditions{Ready: &yes}},
				{Addresses: []string{"10.0.0.2"}},
			},
		},
		&admissionv1.ValidatingWebhookConfiguration{
			ObjectMeta: metav1.ObjectMeta{Name: "v"},
			Webhooks: []admissionv1.ValidatingWebhook{
				{Name: "a.example.com", ClientConfig: admissionv1.WebhookClientConfig{Service: svcRef}, SideEffects: &sideEffects, AdmissionReviewVersions: []string{"v1"}},
				{Name: "b.example.com", ClientConfig: admissionv1.WebhookClientConfig{Service: svcRef}, SideEffects: &sideEffects, AdmissionReviewVersions: []string{"v1"}},
			},
		},
		&admissionv1.MutatingWebhookConfiguration{
			ObjectMeta: metav1.ObjectMeta{Name: "m"},
			Webhooks: []admissionv1.MutatingWebhook{
				{Name: "c.example.com", ClientConfig: admissionv1.WebhookClientConfig{Service: svcRef}, SideEffects: &sideEffects, AdmissionReviewVersions: []string{"v1"}},
			},
		},
		crd(testCRD, true),
	}
}

// crd is a CRD, with a conversion webhook or not.
func crd(name string, conversion bool) *unstructured.Unstructured {
	spec := map[string]any{"group": "example.com", "scope": "Namespaced",
		"names":    map[string]any{"plural": "widgets", "kind": "Widget"},
		"versions": []any{map[string]any{"name": "v1", "served": true, "storage": true}}}
	if conversion {
		spec["conversion"] = map[string]any{"strategy": "Webhook", "webhook": map[string]any{
			"conversionReviewVersions": []any{"v1"},
			"clientConfig":             map[string]any{"service": map[string]any{"namespace": testNS, "name": testSvc, "path": "/convert"}},
		}}
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
		"metadata": map[string]any{"name": name}, "spec": spec,
	}}
}

var allWebhooks = []WebhookInfo{{Type: Validating, Name: "v"}, {Type: Mutating, Name: "m"}, {Type: CRDConversion, Name: testCRD}}

func testOptions() Options {
	return Options{
		SecretKey: types.NamespacedName{Namespace: testNS, Name: testSecret},
		Service:   &ServiceRef{Namespace: testNS, Name: testSvc},
		Webhooks:  allWebhooks,
	}
}

// logSink collects log lines.
type logSink struct {
	mu    sync.Mutex
	lines []string
}

func (l *logSink) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.lines = append(l.lines, args)
	}, funcr.Options{Verbosity: 1})
}

func (l *logSink) count(substr string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, s := range l.lines {
		if strings.Contains(s, substr) {
			n++
		}
	}
	return n
}

func (c *cluster) rotator(t *testing.T, opts Options) *Rotator {
	t.Helper()
	r, err := NewForClients(c.kube, c.dyn, opts)
	if err != nil {
		t.Fatal(err)
	}
	r.hs = c.eps
	return r
}

func (c *cluster) secret(t *testing.T) *corev1.Secret {
	t.Helper()
	s, err := c.kube.CoreV1().Secrets(testNS).Get(context.Background(), testSecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func (c *cluster) material(t *testing.T) *Material {
	t.Helper()
	m, err := ParseSecretData(c.secret(t).Data)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// bundles returns every owned webhook's live caBundle, keyed
// "<config>/<webhook>".
func (c *cluster) bundles(t *testing.T) map[string][]byte {
	t.Helper()
	ctx := context.Background()
	out := map[string][]byte{}
	v, err := c.kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, "v", metav1.GetOptions{})
	if err == nil {
		for _, w := range v.Webhooks {
			out["v/"+w.Name] = w.ClientConfig.CABundle
		}
	}
	m, err := c.kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "m", metav1.GetOptions{})
	if err == nil {
		for _, w := range m.Webhooks {
			out["m/"+w.Name] = w.ClientConfig.CABundle
		}
	}
	u, err := c.dyn.Resource(crdGVR).Get(ctx, testCRD, metav1.GetOptions{})
	if err == nil {
		o, err := ownedFrom(WebhookInfo{Type: CRDConversion, Name: testCRD}, u)
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range o.hooks {
			out["crd/"+h.name] = h.caBundle
		}
	}
	return out
}

// fakeEndpoints is the test handshaker: addr serves the chain set for it,
// verified against roots as a TLS client would.
type fakeEndpoints struct {
	mu    sync.Mutex
	serve map[string]*tls.Certificate
	calls atomic.Int64
}

func (f *fakeEndpoints) set(addr string, c *tls.Certificate) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.serve[addr] = c
}

func (f *fakeEndpoints) Handshake(_ context.Context, addr, serverName string, roots *x509.CertPool) ([]*x509.Certificate, error) {
	f.calls.Add(1)
	f.mu.Lock()
	c := f.serve[addr]
	f.mu.Unlock()
	if c == nil {
		return nil, fmt.Errorf("dial %s: connection refused", addr)
	}
	var chain []*x509.Certificate
	inter := x509.NewCertPool()
	for i, der := range c.Certificate {
		x, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, err
		}
		chain = append(chain, x)
		if i > 0 {
			inter.AddCert(x)
		}
	}
	if _, err := chain[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, DNSName: serverName}); err != nil {
		return nil, fmt.Errorf("tls: failed to verify certificate: %w", err)
	}
	return chain, nil
}

// serveAll makes both endpoints serve c.
func (c *cluster) serveAll(cert *tls.Certificate) {
	c.eps.set("10.0.0.1:9443", cert)
	c.eps.set("10.0.0.2:9443", cert)
}

func mustBootstrap(t *testing.T, r *Rotator) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := r.Bootstrap(ctx); err != nil {
		t.Fatal(err)
	}
}

// pass runs one reconcile pass without informers and returns the gate
// that waits, if any.
func pass(t *testing.T, r *Rotator) error {
	t.Helper()
	waiting, err := r.reconcileOnce(context.Background())
	if err != nil {
		t.Fatalf("reconcile pass: %v", err)
	}
	return waiting
}

func issuerIs(c *x509.Certificate, ca *x509.Certificate) bool { return c.CheckSignatureFrom(ca) == nil }

func TestBootstrapFreshInstall(t *testing.T) {
	c := newCluster(t, world()...)
	ready := make(chan struct{})
	opts := testOptions()
	opts.IsReady = ready
	opts.CertDir = t.TempDir()
	r := c.rotator(t, opts)
	select {
	case <-ready:
		t.Fatal("IsReady closed before Bootstrap")
	default:
	}
	mustBootstrap(t, r)
	select {
	case <-ready:
	default:
		t.Fatal("IsReady not closed by Bootstrap")
	}
	m := c.material(t)
	if len(m.Bundle) != 1 {
		t.Fatalf("bundle has %d CAs, want 1", len(m.Bundle))
	}
	if got := c.secret(t).Annotations[GenerationAnnotation]; got != "1" {
		t.Errorf("generation = %q, want 1", got)
	}
	want := []string{"hook", "hook.sys", "hook.sys.svc", "hook.sys.svc.cluster.local"}
	if !sameSet(m.Serving.Leaf.DNSNames, want) {
		t.Errorf("SANs = %v, want %v", m.Serving.Leaf.DNSNames, want)
	}
	bundles := c.bundles(t)
	if len(bundles) != 4 {
		t.Fatalf("got %d owned webhooks, want 4: %v", len(bundles), bundles)
	}
	for k, b := range bundles {
		if string(b) != string(m.BundlePEM()) {
			t.Errorf("%s caBundle is not the Secret's ca.crt", k)
		}
	}
	if cur, _ := r.GetCertificate(nil); cur == nil || !cur.Leaf.Equal(m.Serving.Leaf) {
		t.Error("GetCertificate does not serve the Secret's certificate")
	}
	if string(r.CABundle()) != string(m.BundlePEM()) {
		t.Error("CABundle is not the Secret's ca.crt")
	}
	var cfg tls.Config
	r.TLSOpt(&cfg)
	if cfg.GetCertificate == nil {
		t.Error("TLSOpt did not set GetCertificate")
	}
	// IsReady is closed once: further passes must not close it again.
	pass(t, r)
	if err := r.markReady(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// Two replicas start at once on an empty cluster: both GET NotFound, both
// Create; the API server takes one and the other uses the winner's
// material. One CA in play.
func TestBootstrapRaceOneCA(t *testing.T) {
	c := newCluster(t, world()...)
	// Both replicas' first GET finds no Secret, whatever the interleaving
	// (the fake runs reactors under one lock, so they cannot be held at a
	// barrier): each then Creates.
	var gets atomic.Int64
	c.kube.PrependReactor("get", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if gets.Add(1) <= 2 {
			return true, nil, apierrors.NewNotFound(secretGVR.GroupResource(), testSecret)
		}
		return false, nil, nil
	})
	r1, r2 := c.rotator(t, testOptions()), c.rotator(t, testOptions())
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, r := range []*Rotator{r1, r2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			errs[i] = r.Bootstrap(ctx)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	creates := 0
	for _, a := range c.kube.Actions() {
		if a.GetVerb() == "create" && a.GetResource().Resource == "secrets" {
			creates++
		}
	}
	if creates != 2 {
		t.Fatalf("%d Secret creates, want 2 (the race did not happen)", creates)
	}
	m := c.material(t)
	for i, r := range []*Rotator{r1, r2} {
		if string(r.CABundle()) != string(m.BundlePEM()) {
			t.Errorf("replica %d holds another CA than the Secret's", i)
		}
		cur, _ := r.GetCertificate(nil)
		if err := VerifyChain(cur, m.BundlePEM(), serverName, time.Now()); err != nil {
			t.Errorf("replica %d serves a certificate the Secret's CA does not verify: %v", i, err)
		}
	}
	if len(m.Bundle) != 1 {
		t.Errorf("%d CAs, want 1", len(m.Bundle))
	}
}

// A full CA rotation, driven pass by pass, with each gate held and then
// met: new CA added (leaf unchanged); re-issue only once every live bundle
// holds the new CA; old CA dropped only once every ready endpoint serves a
// leaf from the new CA.
func TestCARotationPhasesAndGates(t *testing.T) {
	c := newCluster(t, world()...)
	r := c.rotator(t, testOptions())
	mustBootstrap(t, r)
	old := c.material(t)
	oldCA := old.Bundle[0]
	c.serveAll(old.Serving)
	if w := pass(t, r); w != nil {
		t.Fatalf("steady state waits: %v", w)
	}

	// The mutating configuration refuses applies for now: its bundle lags.
	var refuse atomic.Bool
	refuse.Store(true)
	c.kube.PrependReactor("patch", "mutatingwebhookconfigurations", func(k8stesting.Action) (bool, runtime.Object, error) {
		if refuse.Load() {
			return true, nil, apierrors.NewInternalError(errors.New("etcd is slow"))
		}
		return false, nil, nil
	})

	// Phase 1: rotate=ca -> the new CA joins the bundle, the leaf stays.
	s := c.secret(t)
	s.Annotations[RotateAnnotation] = RotateCA
	if _, err := c.kube.CoreV1().Secrets(testNS).Update(context.Background(), s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.reconcileOnce(context.Background()); err == nil {
		t.Fatal("want the refused apply to fail the pass")
	}
	m1 := c.material(t)
	if len(m1.Bundle) != 2 || !m1.Bundle[1].Equal(oldCA) {
		t.Fatalf("after new-ca: bundle %d CAs, old CA second: %v", len(m1.Bundle), len(m1.Bundle) == 2 && m1.Bundle[1].Equal(oldCA))
	}
	newCA := m1.Bundle[0]
	if !m1.Serving.Leaf.Equal(old.Serving.Leaf) {
		t.Fatal("new-ca changed the serving certificate")
	}
	if _, ok := c.secret(t).Annotations[RotateAnnotation]; ok {
		t.Error("the new-ca write did not remove the rotate annotation")
	}
	b := c.bundles(t)
	if !bundleHolds(b["v/a.example.com"], newCA) || !bundleHolds(b["crd/"+testCRD], newCA) || bundleHolds(b["m/c.example.com"], newCA) {
		t.Fatal("want v and the CRD to hold the new CA, m not")
	}

	// Phase 2 held: m lacks the new CA, so the leaf is not re-issued.
	for range 3 {
		if _, err := r.reconcileOnce(context.Background()); err == nil {
			t.Fatal("want the refused apply to fail the pass")
		}
		if m := c.material(t); !m.Serving.Leaf.Equal(old.Serving.Leaf) {
			t.Fatal("serving certificate re-issued while a live caBundle lacks the new CA")
		}
	}
	// m accepts again: this pass injects it (the gate is read before the
	// inject, so it still waits) ...
	refuse.Store(false)
	if w := pass(t, r); w == nil || !strings.Contains(w.Error(), "does not hold the new CA") {
		t.Fatalf("want the re-issue gate to wait on the missing CA, got %v", w)
	}
	// ... and the next re-issues from the new CA.
	w := pass(t, r)
	m2 := c.material(t)
	if !issuerIs(m2.Serving.Leaf, newCA) || len(m2.Bundle) != 2 {
		t.Fatalf("after re-issue: leaf from new CA %v, %d CAs", issuerIs(m2.Serving.Leaf, newCA), len(m2.Bundle))
	}
	// The overlap: the new chain verifies against the old bundle as well.
	if err := VerifyChain(m2.Serving, EncodeCertificates(oldCA), serverName, time.Now()); err != nil {
		t.Errorf("the re-issued chain does not verify against the old CA alone: %v", err)
	}
	if w == nil {
		t.Fatal("want the drop-old gate to wait")
	}

	// Phase 3 held: endpoints still serve the old leaf.
	for range 2 {
		w = pass(t, r)
		if w == nil || len(c.material(t).Bundle) != 2 {
			t.Fatal("old CA dropped while endpoints serve the old leaf")
		}
	}
	if !strings.Contains(w.Error(), "not the newest CA") {
		t.Errorf("gate reason %q does not say an endpoint serves an old leaf", w)
	}
	c.eps.set("10.0.0.1:9443", m2.Serving)
	if w = pass(t, r); w == nil || !strings.Contains(w.Error(), "10.0.0.2:9443") || len(c.material(t).Bundle) != 2 {
		t.Fatalf("old CA dropped while 10.0.0.2 serves the old leaf (gate: %v)", w)
	}
	c.eps.set("10.0.0.2:9443", m2.Serving)
	if w = pass(t, r); w != nil {
		t.Fatalf("gate still waits with every endpoint on the new CA: %v", w)
	}
	m3 := c.material(t)
	if len(m3.Bundle) != 1 || !m3.Bundle[0].Equal(newCA) || !m3.Serving.Leaf.Equal(m2.Serving.Leaf) {
		t.Fatal("drop-old did not leave the new CA alone with the same leaf")
	}
	for k, b := range c.bundles(t) {
		if string(b) != string(m3.BundlePEM()) {
			t.Errorf("%s caBundle is not the new CA alone", k)
		}
	}
	// One generation per write: create (1), new-ca, re-issue, drop (the
	// test's own annotation edit does not count).
	if g := secretGeneration(c.secret(t)); g != 4 {
		t.Errorf("generation = %d, want 4 (create, new-ca, re-issue, drop)", g)
	}
}

// Another replica's write lands between this replica's read and its write:
// the Update carries the stale resourceVersion, gets a Conflict, and the
// replica re-reads and re-decides rather than overwriting.
func TestConflictReReads(t *testing.T) {
	c := newCluster(t, world()...)
	a, b := c.rotator(t, testOptions()), c.rotator(t, testOptions())
	mustBootstrap(t, a)
	mustBootstrap(t, b)
	s := c.secret(t)
	s.Annotations[RotateAnnotation] = RotateServing
	stale, err := c.kube.CoreV1().Secrets(testNS).Update(context.Background(), s, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// b performs the forced rotation.
	pass(t, b)
	won := c.material(t)
	if _, ok := c.secret(t).Annotations[RotateAnnotation]; ok {
		t.Fatal("b did not consume the annotation")
	}
	// a still sees the annotated Secret in its cache.
	store := cache.NewStore(cache.MetaNamespaceKeyFunc)
	if err := store.Add(stale); err != nil {
		t.Fatal(err)
	}
	a.secretStore = store
	a.synced.Store(true)
	c.kube.ClearActions()
	if _, err := a.reconcileOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	var updates, conflicts int
	for _, act := range c.kube.Actions() {
		if act.GetVerb() == "update" && act.GetResource().Resource == "secrets" {
			updates++
			if act.(k8stesting.UpdateAction).GetObject().(*corev1.Secret).ResourceVersion == stale.ResourceVersion {
				conflicts++
			}
		}
	}
	if updates != 1 || conflicts != 1 {
		t.Fatalf("a sent %d updates (%d with the stale resourceVersion), want exactly 1 refused one", updates, conflicts)
	}
	if !c.material(t).Equal(won) {
		t.Fatal("a overwrote b's rotation")
	}
}

// A replica whose Secret is older (lower generation) than the bundle an
// owned object carries does not apply its older bundle.
func TestLaggingReplicaDoesNotRevert(t *testing.T) {
	c := newCluster(t, world()...)
	a, b := c.rotator(t, testOptions()), c.rotator(t, testOptions())
	mustBootstrap(t, a)
	mustBootstrap(t, b)
	lagging := c.secret(t)
	s := lagging.DeepCopy()
	s.Annotations[RotateAnnotation] = RotateCA
	if _, err := c.kube.CoreV1().Secrets(testNS).Update(context.Background(), s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	pass(t, b) // new CA, injected with b's generation
	newer := c.material(t)
	for k, bb := range c.bundles(t) {
		if string(bb) != string(newer.BundlePEM()) {
			t.Fatalf("%s not injected by b", k)
		}
	}
	// a's Secret cache lags at the pre-rotation Secret (generation 1, the
	// old bundle alone).
	store := cache.NewStore(cache.MetaNamespaceKeyFunc)
	if err := store.Add(lagging); err != nil {
		t.Fatal(err)
	}
	a.secretStore = store
	a.synced.Store(true)
	c.kube.ClearActions()
	c.dyn.ClearActions()
	pass(t, a)
	for _, act := range append(c.kube.Actions(), c.dyn.Actions()...) {
		if act.GetVerb() == "patch" || act.GetVerb() == "update" {
			t.Fatalf("lagging replica sent %s %s", act.GetVerb(), act.GetResource().Resource)
		}
	}
	for k, bb := range c.bundles(t) {
		if string(bb) != string(newer.BundlePEM()) {
			t.Fatalf("%s reverted", k)
		}
	}
}

// Start: informers feed the loop; a blanked caBundle is written back, and
// a Secret changed by another replica is served and written to CertDir
// without a restart.
func TestStartRepairsAndReloads(t *testing.T) {
	c := newCluster(t, world()...)
	opts := testOptions()
	opts.CertDir = t.TempDir()
	ready := make(chan struct{})
	opts.IsReady = ready
	r := c.rotator(t, opts)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Start(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Start: %v", err)
		}
	}()
	select {
	case <-ready:
	case <-time.After(20 * time.Second):
		t.Fatal("IsReady not closed")
	}
	eventually(t, "ReadyzCheck passes", func() error { return r.ReadyzCheck(nil) })

	// Blank a caBundle behind the Rotator's back.
	v, err := c.kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, "v", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	v.Webhooks[1].ClientConfig.CABundle = nil
	if _, err := c.kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Update(ctx, v, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	want := c.material(t).BundlePEM()
	eventually(t, "blanked caBundle written back", func() error {
		if got := c.bundles(t)["v/b.example.com"]; string(got) != string(want) {
			return errors.New("still blank")
		}
		return nil
	})

	// Another replica re-issues the serving certificate.
	s := c.secret(t)
	m, err := c.material(t).WithServing(r.spec, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	s.Data = m.SecretData()
	s.Annotations[GenerationAnnotation] = strconv.FormatInt(secretGeneration(s)+1, 10)
	if _, err := c.kube.CoreV1().Secrets(testNS).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "new certificate served and written", func() error {
		cur, _ := r.GetCertificate(nil)
		if !cur.Leaf.Equal(m.Serving.Leaf) {
			return errors.New("not served yet")
		}
		got, err := loadDir(opts.CertDir)
		if err != nil || !got.Leaf.Equal(m.Serving.Leaf) {
			return fmt.Errorf("CertDir not rewritten (%v)", err)
		}
		return nil
	})
}

func eventually(t *testing.T, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestBootstrapDeadlineLeavesIsReadyOpen(t *testing.T) {
	c := newCluster(t, world()...)
	c.kube.PrependReactor("patch", "validatingwebhookconfigurations", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "validatingwebhookconfigurations"}, "v", errors.New("RBAC"))
	})
	opts := testOptions()
	ready := make(chan struct{})
	opts.IsReady = ready
	r := c.rotator(t, opts)
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	err := r.Bootstrap(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || !apierrors.IsForbidden(err) {
		t.Fatalf("Bootstrap = %v, want the deadline and the Forbidden apply", err)
	}
	select {
	case <-ready:
		t.Fatal("IsReady closed although a caBundle could not be injected")
	default:
	}
}

// IsReady waits for the API server's bundles: while a configuration's
// caBundle, as the API server returns it, does not verify the served
// certificate (here an apply the server accepts but something reverts at
// once), Bootstrap does not complete and IsReady stays open.
func TestIsReadyWaitsForLiveBundles(t *testing.T) {
	c := newCluster(t, world()...)
	c.kube.PrependReactor("patch", "validatingwebhookconfigurations", func(a k8stesting.Action) (bool, runtime.Object, error) {
		obj, err := c.kube.Tracker().Get(admissionv1.SchemeGroupVersion.WithResource("validatingwebhookconfigurations"), "", a.(k8stesting.PatchAction).GetName())
		return true, obj, err // accepted, not changed
	})
	opts := testOptions()
	ready := make(chan struct{})
	opts.IsReady = ready
	r := c.rotator(t, opts)
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	if err := r.Bootstrap(ctx); err == nil || !strings.Contains(err.Error(), `ValidatingWebhookConfiguration "v" webhook "a.example.com"`) {
		t.Fatalf("Bootstrap = %v, want it to name the untrusting webhook", err)
	}
	select {
	case <-ready:
		t.Fatal("IsReady closed while a live caBundle does not verify the served certificate")
	default:
	}
}

// An owned object carries a generation no Secret has (the Secret was
// replaced with a lower one): the Secret's generation is raised above it
// and the bundle injected, rather than every replica deferring to it
// forever.
func TestStaleObjectGenerationRaised(t *testing.T) {
	m, err := NewMaterial(Spec{DNSNames: []string{"hook", "hook.sys", serverName, serverName + ".cluster.local"}, ServingValidity: DefaultServingValidity, CAValidity: DefaultCAValidity}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := NewMaterial(Spec{DNSNames: []string{serverName}, ServingValidity: time.Hour, CAValidity: 2 * time.Hour}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	objs := world()
	v := objs[2].(*admissionv1.ValidatingWebhookConfiguration)
	v.Annotations = map[string]string{GenerationAnnotation: "99"}
	for i := range v.Webhooks {
		v.Webhooks[i].ClientConfig.CABundle = foreign.BundlePEM()
	}
	objs = append(objs, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: testSecret, ResourceVersion: "1", Annotations: map[string]string{GenerationAnnotation: "1"}},
		Type:       corev1.SecretTypeTLS, Data: m.SecretData(),
	})
	c := newCluster(t, objs...)
	r := c.rotator(t, testOptions())
	mustBootstrap(t, r)
	if g := secretGeneration(c.secret(t)); g != 100 {
		t.Errorf("Secret generation %d, want 100", g)
	}
	if !c.material(t).Equal(m) {
		t.Error("raising the generation changed the material")
	}
	for k, b := range c.bundles(t) {
		if string(b) != string(m.BundlePEM()) {
			t.Errorf("%s not injected", k)
		}
	}
}
