package registration

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kadmit/kadmit/pkg/webhookcerts"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/certs"
	"github.com/kadmit/kadmit/internal/testkit"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// pki is a CA and a serving certificate for 127.0.0.1 it signed.
type pki struct {
	ca   []byte
	cert *tls.Certificate
}

func newPKI(t *testing.T) pki {
	t.Helper()
	b, err := certs.NewSelfSigned(certs.SelfSignedOptions{IPs: []net.IP{net.ParseIP("127.0.0.1")}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := b.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	return pki{ca: b.CACert, cert: c}
}

type harness struct {
	cs     *fake.Clientset
	holder *webhookcerts.Holder
	bundle atomic.Pointer[[]byte]
	reg    *Registrar
	ctx    context.Context
}

func newHarness(t *testing.T, cs *fake.Clientset, name string, p pki, mutate func(*RegistrarOptions)) *harness {
	t.Helper()
	h := &harness{cs: cs, holder: &webhookcerts.Holder{}}
	h.holder.Set(p.cert)
	h.setBundle(p.ca)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	h.ctx = ctx
	o := RegistrarOptions{
		Client: cs, Registration: Options{Name: name, URL: "https://127.0.0.1:9443"}, Hooks: testHooks(),
		ServerName: "127.0.0.1", Holder: h.holder, Bundle: func() ([]byte, int64) { return *h.bundle.Load(), 0 }, Logger: quiet,
	}
	if mutate != nil {
		mutate(&o)
	}
	reg, err := NewRegistrar(o)
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.Start(ctx); err != nil {
		t.Fatal(err)
	}
	h.reg = reg
	return h
}

func (h *harness) setBundle(b []byte) { h.bundle.Store(&b) }

// bundles returns every webhook's caBundle of both configurations named
// name, as the API server (here: the fake tracker) stores them.
func bundles(t *testing.T, cs kubernetes.Interface, name string) []string {
	t.Helper()
	var out []string
	m, err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(context.Background(), name, metav1.GetOptions{})
	if err == nil {
		for _, w := range m.Webhooks {
			out = append(out, string(w.ClientConfig.CABundle))
		}
	}
	v, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(context.Background(), name, metav1.GetOptions{})
	if err == nil {
		for _, w := range v.Webhooks {
			out = append(out, string(w.ClientConfig.CABundle))
		}
	}
	return out
}

// allEqual reports whether all four webhooks of testHooks (two mutating,
// two validating) are registered with caBundle want.
func allEqual(bs []string, want []byte) bool {
	if len(bs) != 4 {
		return false
	}
	for _, b := range bs {
		if b != string(want) {
			return false
		}
	}
	return true
}

// settled waits until r's cache shows its configurations exactly as it
// would write them with bundle.
func settled(t *testing.T, r *Registrar, bundle []byte) {
	t.Helper()
	testkit.Eventually(t, 10*time.Second, r.Name()+" cache up to date", func() bool {
		m, v, err := r.build(bundle)
		if err != nil {
			return false
		}
		mu, vu := r.upToDate(m, v)
		return mu && vu
	})
}

func countPatches(cs *fake.Clientset) int {
	n := 0
	for _, a := range cs.Actions() {
		if a.GetVerb() == "patch" {
			n++
		}
	}
	return n
}

func TestRegistrarRunRepairsBlankedCABundle(t *testing.T) {
	p := newPKI(t)
	cs := fake.NewClientset()
	h := newHarness(t, cs, "kadmit", p, nil)
	go h.reg.Run(h.ctx)
	testkit.Eventually(t, 10*time.Second, "first registration", func() bool { return allEqual(bundles(t, cs, "kadmit"), p.ca) })
	if err := h.reg.Ready(); err != nil {
		t.Fatalf("ready after registration: %v", err)
	}

	// Blank the validating configuration's caBundle, as a stray apply or a
	// hand edit would; the informer event must bring the registrar back.
	v, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(h.ctx, "kadmit", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range v.Webhooks {
		v.Webhooks[i].ClientConfig.CABundle = nil
	}
	if _, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Update(h.ctx, v, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "blanked caBundle repaired", func() bool { return allEqual(bundles(t, cs, "kadmit"), p.ca) })

	// A deleted configuration is written back too.
	if err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(h.ctx, "kadmit", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "deleted configuration re-created", func() bool {
		_, err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(h.ctx, "kadmit", metav1.GetOptions{})
		return err == nil
	})
	testkit.Eventually(t, 10*time.Second, "cache caught up", func() bool { return h.reg.Ready() == nil })

	// Up to date: kicks write nothing.
	settled(t, h.reg, p.ca)
	before := countPatches(cs)
	for range 5 {
		h.reg.Kick()
	}
	time.Sleep(200 * time.Millisecond)
	if n := countPatches(cs) - before; n != 0 {
		t.Fatalf("%d patches while the configurations were up to date", n)
	}
}

func TestRegistrarRunFollowsBundleChange(t *testing.T) {
	p := newPKI(t)
	cs := fake.NewClientset()
	h := newHarness(t, cs, "kadmit", p, nil)
	go h.reg.Run(h.ctx)
	testkit.Eventually(t, 10*time.Second, "first registration", func() bool { return allEqual(bundles(t, cs, "kadmit"), p.ca) })
	// The source's bundle grows (a new CA ahead of the old, as cert-manager's
	// ca.crt or trust-manager would roll it): written within a tick.
	grown := append(append([]byte(nil), newPKI(t).ca...), p.ca...)
	h.setBundle(grown)
	testkit.Eventually(t, 10*time.Second, "new bundle written", func() bool { return allEqual(bundles(t, cs, "kadmit"), grown) })
}

func TestRegistrarStaleBundleMakesReplicaUnready(t *testing.T) {
	p, foreign := newPKI(t), newPKI(t)
	cs := fake.NewClientset()
	h := newHarness(t, cs, "kadmit", p, nil)
	// Before any configuration exists, readiness checks the source's bundle.
	if err := h.reg.Ready(); err != nil {
		t.Fatalf("ready against the source's own bundle: %v", err)
	}
	h.setBundle(foreign.ca)
	if err := h.reg.Ready(); err == nil || !strings.Contains(err.Error(), "the certificate source") {
		t.Fatalf("ready with a source bundle that does not verify: %v", err)
	}
	// Registered with a foreign CA (stale): not ready, naming the webhook.
	mwc, vwc, err := Build(testHooks(), Options{Name: "kadmit", URL: "https://127.0.0.1:9443", CABundle: foreign.ca})
	if err != nil {
		t.Fatal(err)
	}
	if err := Apply(h.ctx, cs, mwc, vwc); err != nil {
		t.Fatal(err)
	}
	h.setBundle(p.ca)
	testkit.Eventually(t, 10*time.Second, "stale bundle seen", func() bool {
		err := h.reg.Ready()
		return err != nil && strings.Contains(err.Error(), "WebhookConfiguration/") && strings.Contains(err.Error(), "unknown authority")
	})
	// Inject repairs it, and readiness follows the cache.
	if held, err := h.reg.write(h.ctx, p.ca, 0); held || err != nil {
		t.Fatalf("Inject = held %t, %v", held, err)
	}
	testkit.Eventually(t, 10*time.Second, "ready after the repair", func() bool { return h.reg.Ready() == nil })
	if got := h.reg.staleBundles(p.ca); len(got) != 0 {
		t.Fatalf("stale webhooks after the repair: %v", got)
	}
}

func TestRegistrarGuards(t *testing.T) {
	p := newPKI(t)
	var listening atomic.Pointer[error]
	var probed atomic.Int32
	var probeLeaves atomic.Pointer[[]*x509.Certificate]
	cs := fake.NewClientset()
	clk := newFakeClock()
	h := newHarness(t, cs, "kadmit", p, func(o *RegistrarOptions) {
		o.Now = clk.Now
		o.Listening = func() error {
			if e := listening.Load(); e != nil {
				return *e
			}
			return nil
		}
		o.Probe = func(context.Context) ([]*x509.Certificate, error) {
			probed.Add(1)
			return *probeLeaves.Load(), nil
		}
	})
	none := []*x509.Certificate{}
	probeLeaves.Store(&none)
	notServing := errors.New("admission listener not serving")
	listening.Store(&notServing)
	if held, err := h.reg.write(h.ctx, p.ca, 0); !held || err != nil {
		t.Fatalf("not listening: held %t, %v", held, err)
	}
	listening.Store(nil)
	if held, err := h.reg.write(h.ctx, newPKI(t).ca, 0); !held || err != nil {
		t.Fatalf("own certificate outside the bundle: held %t, %v", held, err)
	}
	// First registration: no ready endpoint serves a verifying certificate.
	if held, err := h.reg.write(h.ctx, p.ca, 0); !held || err != nil || probed.Load() == 0 {
		t.Fatalf("no endpoint: held %t, %v, probed %d", held, err, probed.Load())
	}
	if n := countPatches(cs); n != 0 {
		t.Fatalf("%d writes while held", n)
	}
	leaves := []*x509.Certificate{p.cert.Leaf}
	probeLeaves.Store(&leaves)
	if held, err := h.reg.write(h.ctx, p.ca, 0); !held || err != nil {
		t.Fatalf("endpoint verifies, not yet for ProxySettle: held %t, %v", held, err)
	}
	clk.Add(DefaultProxySettle)
	if held, err := h.reg.write(h.ctx, p.ca, 0); held || err != nil {
		t.Fatalf("endpoint verifies for ProxySettle: held %t, %v", held, err)
	}
	testkit.Eventually(t, 10*time.Second, "registered in the cache", func() bool { return len(cachedBundles(h.reg)) == len(bundles(t, cs, "kadmit")) })
	// A repair of existing configurations does not wait for an endpoint:
	// after a blank no endpoint is ready, by construction.
	probeLeaves.Store(&none)
	probed.Store(0)
	v, _ := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(h.ctx, "kadmit", metav1.GetOptions{})
	v.Webhooks[0].ClientConfig.CABundle = nil
	if _, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Update(h.ctx, v, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "blank seen", func() bool { return h.reg.Ready() != nil })
	if held, err := h.reg.write(h.ctx, p.ca, 0); held || err != nil || probed.Load() != 0 {
		t.Fatalf("repair: held %t, %v, probed %d", held, err, probed.Load())
	}
	if _, err := h.reg.write(h.ctx, nil, 0); err == nil {
		t.Fatal("Inject without a bundle succeeded")
	}
}

func TestRegistrarPerInstallNames(t *testing.T) {
	a, b := newPKI(t), newPKI(t)
	cs := fake.NewClientset()
	ha := newHarness(t, cs, "team-a-kadmit", a, nil)
	hb := newHarness(t, cs, "team-b-kadmit", b, nil)
	go ha.reg.Run(ha.ctx)
	go hb.reg.Run(hb.ctx)
	testkit.Eventually(t, 10*time.Second, "both registered", func() bool {
		return allEqual(bundles(t, cs, "team-a-kadmit"), a.ca) && allEqual(bundles(t, cs, "team-b-kadmit"), b.ca)
	})
	testkit.Eventually(t, 10*time.Second, "both ready", func() bool { return ha.reg.Ready() == nil && hb.reg.Ready() == nil })
	// Each watches and writes only its own; neither fights the other.
	settled(t, ha.reg, a.ca)
	settled(t, hb.reg, b.ca)
	time.Sleep(300 * time.Millisecond)
	before := countPatches(cs)
	time.Sleep(1500 * time.Millisecond)
	if n := countPatches(cs) - before; n != 0 {
		t.Fatalf("%d writes between two settled installs: they fight", n)
	}
	if err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(ha.ctx, "team-a-kadmit", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "a repaired", func() bool { return allEqual(bundles(t, cs, "team-a-kadmit"), a.ca) })
	if !allEqual(bundles(t, cs, "team-b-kadmit"), b.ca) {
		t.Fatal("b's configurations changed")
	}
	if _, err := NewRegistrar(RegistrarOptions{Client: cs, Registration: Options{Name: "Not_A_Name", URL: "https://x"}, Hooks: testHooks(),
		ServerName: "x", Holder: ha.holder}); err == nil {
		t.Fatal("invalid configuration name accepted")
	}
}

func TestBundlesReadsTheAPIServer(t *testing.T) {
	p := newPKI(t)
	cs := fake.NewClientset()
	h := newHarness(t, cs, "kadmit", p, nil)
	got, gen, err := h.reg.Bundles(h.ctx, true)
	if err != nil || len(got) != 0 || gen != 0 {
		t.Fatalf("before registration: %v, %d, %v", got, gen, err)
	}
	if err := h.reg.Inject(h.ctx, p.ca, 7); err != nil {
		t.Fatal(err)
	}
	got, gen, err = h.reg.Bundles(h.ctx, true)
	if err != nil || len(got) != 4 || gen != 7 {
		t.Fatalf("after registration: %d bundles, generation %d, %v", len(got), gen, err)
	}
	for k, b := range got {
		if !bytes.Equal(b, p.ca) {
			t.Errorf("%s: caBundle is not the injected bundle", k)
		}
	}
	cs.PrependReactor("get", "mutatingwebhookconfigurations", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("etcd unavailable")
	})
	if _, _, err := h.reg.Bundles(h.ctx, true); err == nil || !strings.Contains(err.Error(), "etcd unavailable") {
		t.Fatalf("API error not returned: %v", err)
	}
}

// A replica whose certificate Secret lags does not revert the bundle a
// replica with a newer Secret registered (webhookcerts.GenerationAnnotation),
// and Run writes the newest bundle Inject was given while the source's
// Bundle lags behind it.
func TestLaggingGenerationDoesNotRevert(t *testing.T) {
	p, newer := newPKI(t), newPKI(t)
	cs := fake.NewClientset()
	h := newHarness(t, cs, "kadmit", p, nil)
	both := append(bytes.Clone(newer.ca), p.ca...)
	h.holder.Set(p.cert)
	if err := h.reg.Inject(h.ctx, both, 5); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "generation 5 in the cache", func() bool { m, v := h.reg.newerThan(4); return m && v })
	before := countPatches(cs)
	if err := h.reg.Inject(h.ctx, p.ca, 4); err != nil {
		t.Fatal(err)
	}
	if countPatches(cs) != before {
		t.Fatal("a lagging generation wrote")
	}
	for k, b := range cachedBundles(h.reg) {
		if !bytes.Equal(b, both) {
			t.Errorf("%s reverted", k)
		}
	}
	if b, g := h.reg.current(); !bytes.Equal(b, both) || g != 5 {
		t.Errorf("Run would write generation %d, want the injected 5", g)
	}
	// Generation 0 (files, self-signed) is never held back.
	if held, err := h.reg.write(h.ctx, p.ca, 0); held || err != nil {
		t.Fatal(held, err)
	}
	if countPatches(cs) == before {
		t.Error("a generation-less write was held back")
	}
}

func cachedBundles(r *Registrar) map[string][]byte {
	b, _ := r.cachedBundles()
	return b
}

// TestEndpointProber handshakes with a real TLS listener on loopback that
// an EndpointSlice of the Service names, as the API server would reach it.
func TestEndpointProber(t *testing.T) {
	p := newPKI(t)
	srv := httptest.NewUnstartedServer(http.NotFoundHandler())
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{*p.cert}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	_, portStr, _ := net.SplitHostPort(srv.Listener.Addr().String())
	port, _ := strconv.Atoi(portStr)
	target, name, ready, notReady := int32(port), "https", true, false
	cs := fake.NewClientset(
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "kadmit", Namespace: "kadmit-system"},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "https", Port: 443}}}},
		&discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Name: "kadmit-abc", Namespace: "kadmit-system", Labels: map[string]string{discoveryv1.LabelServiceName: "kadmit"}},
			Ports:      []discoveryv1.EndpointPort{{Name: &name, Port: &target}},
			Endpoints: []discoveryv1.Endpoint{
				{Addresses: []string{"127.0.0.1"}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}},
				// not ready: never dialled (nothing listens there)
				{Addresses: []string{"127.0.0.2"}, Conditions: discoveryv1.EndpointConditions{Ready: &notReady}},
			},
		})
	leaves, err := EndpointProber{Client: cs, Namespace: "kadmit-system", Service: "kadmit", ServerName: "kadmit.kadmit-system.svc"}.Probe(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(leaves) != 1 || !leaves[0].Equal(p.cert.Leaf) {
		t.Fatalf("probed %d leaves, want the listener's", len(leaves))
	}
	if _, err := (EndpointProber{Client: cs, Namespace: "kadmit-system", Service: "missing"}).Probe(context.Background()); err == nil {
		t.Fatal("missing Service: no error")
	}
}

// hooksOf returns the hooks of testHooks of type typ.
func hooksOf(typ admission.Type) []admission.Hook {
	var out []admission.Hook
	for _, h := range testHooks() {
		if h.Type == typ {
			out = append(out, h)
		}
	}
	return out
}

func configExists(t *testing.T, cs kubernetes.Interface, typ admission.Type, name string) bool {
	t.Helper()
	var err error
	if typ == admission.Mutating {
		_, err = cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(context.Background(), name, metav1.GetOptions{})
	} else {
		_, err = cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(context.Background(), name, metav1.GetOptions{})
	}
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	return err == nil
}

// TestRegistrarDeletesConfigurationWithoutHooks: turning off the last hook of
// a type deletes that configuration (its webhooks would call paths no longer
// served, failurePolicy Fail); turning one on again writes it back; a
// webhook whose hook is gone leaves its configuration; and the paths the
// registered webhooks called stay "called" for UnregisterGrace.
func TestRegistrarDeletesConfigurationWithoutHooks(t *testing.T) {
	p := newPKI(t)
	cs := fake.NewClientset()
	var now atomic.Pointer[time.Time]
	start := time.Now()
	now.Store(&start)
	h := newHarness(t, cs, "kadmit", p, func(o *RegistrarOptions) { o.Now = func() time.Time { return *now.Load() } })
	go h.reg.Run(h.ctx)
	testkit.Eventually(t, 10*time.Second, "first registration", func() bool { return allEqual(bundles(t, cs, "kadmit"), p.ca) })
	testkit.Eventually(t, 10*time.Second, "paths called", func() bool { return h.reg.Calls("/mutate-pod") && h.reg.Calls("/validate-node") })
	if h.reg.Calls("/not-registered") {
		t.Fatal("Calls(/not-registered) = true")
	}

	h.reg.SetHooks(hooksOf(admission.Validating))
	testkit.Eventually(t, 10*time.Second, "mutating configuration deleted", func() bool { return !configExists(t, cs, admission.Mutating, "kadmit") })
	if !configExists(t, cs, admission.Validating, "kadmit") {
		t.Fatal("the validating configuration went with the mutating one")
	}
	// The API server may still call the mutating paths until its own
	// informer catches up: they stay called for the grace, then not.
	testkit.Eventually(t, 10*time.Second, "informer saw the delete", func() bool { return len(cachedBundles(h.reg)) == 2 })
	if !h.reg.Calls("/mutate-pod") {
		t.Fatal("Calls(/mutate-pod) = false right after the delete; want true for UnregisterGrace")
	}
	later := start.Add(UnregisterGrace + time.Second)
	now.Store(&later)
	if h.reg.Calls("/mutate-pod") {
		t.Fatal("Calls(/mutate-pod) = true after UnregisterGrace")
	}
	if !h.reg.Calls("/validate-pod") {
		t.Fatal("Calls(/validate-pod) = false while registered")
	}

	// One webhook of a configuration goes: the configuration stays, without it.
	h.reg.SetHooks(hooksOf(admission.Validating)[:1])
	testkit.Eventually(t, 10*time.Second, "validate-node webhook removed", func() bool { return len(bundles(t, cs, "kadmit")) == 1 })
	// The tracked paths are bounded: a path gone for longer than the grace
	// is forgotten at the next event, not kept.
	testkit.Eventually(t, 10*time.Second, "paths gone past the grace forgotten", func() bool {
		h.reg.mu.Lock()
		defer h.reg.mu.Unlock()
		_, kept := h.reg.called["/mutate-pod"]
		return !kept && len(h.reg.called) == 2
	})
	if !h.reg.Calls("/validate-node") {
		t.Fatal("Calls(/validate-node) = false right after its webhook was removed")
	}

	h.reg.SetHooks(hooksOf(admission.Mutating))
	testkit.Eventually(t, 10*time.Second, "validating configuration deleted, mutating written back", func() bool {
		return !configExists(t, cs, admission.Validating, "kadmit") && configExists(t, cs, admission.Mutating, "kadmit")
	})
}

// TestRegistrarDeletesStaleConfigurationOnStart: a kadmit restarted with a
// configuration that no longer has hooks of a type finds the old
// configuration registered and deletes it, before anything else is
// servable (no Listening needed: a delete sends no call anywhere).
func TestRegistrarDeletesStaleConfigurationOnStart(t *testing.T) {
	p := newPKI(t)
	cs := fake.NewClientset()
	mwc, vwc, err := Build(testHooks(), Options{Name: "kadmit", URL: "https://127.0.0.1:9443", CABundle: p.ca})
	if err != nil {
		t.Fatal(err)
	}
	if err := Apply(context.Background(), cs, mwc, vwc); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, cs, "kadmit", p, func(o *RegistrarOptions) {
		o.Hooks = hooksOf(admission.Validating)
		o.Listening = func() error { return errors.New("not yet") }
	})
	go h.reg.Run(h.ctx)
	testkit.Eventually(t, 10*time.Second, "stale mutating configuration deleted", func() bool { return !configExists(t, cs, admission.Mutating, "kadmit") })
	if !configExists(t, cs, admission.Validating, "kadmit") {
		t.Fatal("validating configuration deleted")
	}
}

// TestRegistrarLeavesForeignConfiguration: an object of the install's name
// that kadmit's field manager never wrote is not deleted.
func TestRegistrarLeavesForeignConfiguration(t *testing.T) {
	p := newPKI(t)
	cs := fake.NewClientset()
	foreign := &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "kadmit"}}
	if _, err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(context.Background(), foreign, metav1.CreateOptions{FieldManager: "kubectl"}); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, cs, "kadmit", p, func(o *RegistrarOptions) { o.Hooks = hooksOf(admission.Validating) })
	go h.reg.Run(h.ctx)
	testkit.Eventually(t, 10*time.Second, "validating configuration written", func() bool { return configExists(t, cs, admission.Validating, "kadmit") })
	settled(t, h.reg, p.ca)
	for _, a := range cs.Actions() {
		if a.GetVerb() == "delete" {
			t.Fatalf("deleted %v, which kadmit never wrote", a.GetResource())
		}
	}
	if !configExists(t, cs, admission.Mutating, "kadmit") {
		t.Fatal("foreign mutating configuration deleted")
	}
}

// TestCalledPath: the path the API server calls, for a URL (query and
// host ignored) and for a Service (unset path: "/", the API server's
// default).
func TestCalledPath(t *testing.T) {
	u := func(s string) admissionregistrationv1.WebhookClientConfig {
		return admissionregistrationv1.WebhookClientConfig{URL: &s}
	}
	svc := func(p *string) admissionregistrationv1.WebhookClientConfig {
		return admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{Namespace: "ns", Name: "kadmit", Path: p}}
	}
	path := "/validate-pod"
	for _, c := range []struct {
		cc   admissionregistrationv1.WebhookClientConfig
		want string
		ok   bool
	}{
		{u("https://127.0.0.1:9443/validate-pod"), "/validate-pod", true},
		{u("https://kadmit.example:443/mutate-pod?x=1"), "/mutate-pod", true},
		{u("https://127.0.0.1:9443"), "/", true},
		{u("://bad"), "", false},
		{svc(&path), "/validate-pod", true},
		{svc(nil), "/", true},
		{admissionregistrationv1.WebhookClientConfig{}, "", false},
	} {
		got, ok := calledPath(c.cc)
		if got != c.want || ok != c.ok {
			t.Errorf("calledPath(%+v) = %q, %t; want %q, %t", c.cc, got, ok, c.want, c.ok)
		}
	}
}

// fakeClock is a settable clock for RegistrarOptions.Now.
type fakeClock struct{ t atomic.Pointer[time.Time] }

func newFakeClock() *fakeClock {
	c := &fakeClock{}
	now := time.Now()
	c.t.Store(&now)
	return c
}

func (c *fakeClock) Now() time.Time { return *c.t.Load() }

func (c *fakeClock) Add(d time.Duration) {
	t := c.Now().Add(d)
	c.t.Store(&t)
}

// syncBuffer is a log sink safe to read while slog writes to it.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestRegistrarFirstRegistrationSettles: in Service mode the first
// registration waits until a ready endpoint has verified at every probe for
// ProxySettle (the probe dials the pod; the API server calls the ClusterIP,
// which kube-proxy routes to it only after its next rule sync). A probe that
// finds none, or fails, restarts the wait; a repair does not wait; a
// configuration deleted later is a first registration again.
func TestRegistrarFirstRegistrationSettles(t *testing.T) {
	p := newPKI(t)
	var probed atomic.Int32
	var probeErr atomic.Pointer[error]
	var probeLeaves atomic.Pointer[[]*x509.Certificate]
	none, verifying := []*x509.Certificate{}, []*x509.Certificate{p.cert.Leaf}
	probeLeaves.Store(&verifying)
	cs := fake.NewClientset()
	clk := newFakeClock()
	var logs syncBuffer
	h := newHarness(t, cs, "kadmit", p, func(o *RegistrarOptions) {
		o.Now = clk.Now
		o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		o.Probe = func(context.Context) ([]*x509.Certificate, error) {
			probed.Add(1)
			if e := probeErr.Load(); e != nil {
				return nil, *e
			}
			return *probeLeaves.Load(), nil
		}
	})
	inject := func(wantHeld bool, what string) {
		t.Helper()
		held, err := h.reg.write(h.ctx, p.ca, 0)
		if held != wantHeld || err != nil {
			t.Fatalf("%s: held %t, %v; want held %t", what, held, err, wantHeld)
		}
		if n := countPatches(cs); wantHeld && n != 0 {
			t.Fatalf("%s: %d writes while held", what, n)
		}
	}

	inject(true, "endpoint first seen")
	if !strings.Contains(logs.String(), "a ready endpoint verifies; waiting 3s for kube-proxy on every node to route the Service to it") {
		t.Fatalf("hold reason not logged:\n%s", logs.String())
	}
	clk.Add(2 * time.Second)
	inject(true, "2s of 3s")
	if left := h.reg.settleLeft(); left != time.Second {
		t.Fatalf("settleLeft = %v, want 1s", left)
	}
	// The endpoint goes (not ready, or no longer verifies): the settle
	// restarts from the next probe that finds one.
	probeLeaves.Store(&none)
	inject(true, "no endpoint")
	if left := h.reg.settleLeft(); left != 0 {
		t.Fatalf("settleLeft after a probe found none = %v, want 0", left)
	}
	probeLeaves.Store(&verifying)
	clk.Add(2 * time.Second)
	inject(true, "seen again")
	clk.Add(2 * time.Second)
	inject(true, "2s since seen again, 6s since first seen")
	// A failed probe restarts it too.
	failed := errors.New("probe endpoint 10.244.1.5: connection refused")
	probeErr.Store(&failed)
	inject(true, "probe failed")
	probeErr.Store(nil)
	inject(true, "seen after the failure")
	clk.Add(DefaultProxySettle - time.Millisecond)
	inject(true, "1ms short of the settle")
	clk.Add(time.Millisecond)
	inject(false, "settled")
	if !allEqual(bundles(t, cs, "kadmit"), p.ca) {
		t.Fatal("not registered after the settle")
	}
	testkit.Eventually(t, 10*time.Second, "registered in the cache", func() bool { return len(cachedBundles(h.reg)) == 4 })

	// A repair waits neither for an endpoint nor for the settle.
	probeLeaves.Store(&none)
	probed.Store(0)
	v, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(h.ctx, "kadmit", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	v.Webhooks[0].ClientConfig.CABundle = nil
	if _, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Update(h.ctx, v, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "blank seen", func() bool { return h.reg.Ready() != nil })
	if held, err := h.reg.write(h.ctx, p.ca, 0); held || err != nil || probed.Load() != 0 {
		t.Fatalf("repair: held %t, %v, probed %d", held, err, probed.Load())
	}

	// A deleted configuration is written back only after a settle of its
	// own: the earlier one says nothing about the endpoints now.
	probeLeaves.Store(&verifying)
	if err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(h.ctx, "kadmit", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "delete seen", func() bool { return len(cachedBundles(h.reg)) == 2 })
	before := countPatches(cs)
	if held, err := h.reg.write(h.ctx, p.ca, 0); !held || err != nil || countPatches(cs) != before {
		t.Fatalf("re-creation right away: held %t, %v, %d writes", held, err, countPatches(cs)-before)
	}
	clk.Add(DefaultProxySettle)
	if held, err := h.reg.write(h.ctx, p.ca, 0); held || err != nil {
		t.Fatalf("re-creation after the settle: held %t, %v", held, err)
	}
	if !configExists(t, cs, admission.Mutating, "kadmit") {
		t.Fatal("mutating configuration not re-created")
	}
}

// TestRegistrarRunEndsSettleOnTime: Run retries when the settle ends, not
// at the next RetryInterval tick, when the settle is the shorter.
func TestRegistrarRunEndsSettleOnTime(t *testing.T) {
	p := newPKI(t)
	cs := fake.NewClientset()
	const settle = 100 * time.Millisecond
	h := newHarness(t, cs, "kadmit", p, func(o *RegistrarOptions) {
		o.ProxySettle = settle
		o.Probe = func(context.Context) ([]*x509.Certificate, error) { return []*x509.Certificate{p.cert.Leaf}, nil }
	})
	start := time.Now()
	go h.reg.Run(h.ctx)
	testkit.Eventually(t, 10*time.Second, "first registration", func() bool { return allEqual(bundles(t, cs, "kadmit"), p.ca) })
	if took := time.Since(start); took < settle || took >= RetryInterval {
		t.Fatalf("registered after %v; want the settle (%v), before the first tick (%v)", took, settle, RetryInterval)
	}
}
