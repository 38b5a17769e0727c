package webhookcerts

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// fakeInjector holds two webhooks' caBundles in memory with the generation
// of the last write; refuse makes Inject fail without writing.
type fakeInjector struct {
	mu         sync.Mutex
	bundles    map[string][]byte
	generation int64
	injects    int
	refuse     bool
	onChange   []func()
}

func newFakeInjector() *fakeInjector {
	return &fakeInjector{bundles: map[string][]byte{"hook a": nil, "hook b": nil}}
}

func (f *fakeInjector) Inject(_ context.Context, bundle []byte, generation int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.refuse {
		return errors.New("refused")
	}
	if generation < f.generation {
		return nil
	}
	f.injects++
	for k := range f.bundles {
		f.bundles[k] = bytes.Clone(bundle)
	}
	f.generation = generation
	return nil
}

func (f *fakeInjector) Bundles(context.Context, bool) (map[string][]byte, int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string][]byte{}
	for k, v := range f.bundles {
		out[k] = bytes.Clone(v)
	}
	return out, f.generation, nil
}

func (f *fakeInjector) OnChange(fn func()) { f.onChange = append(f.onChange, fn) }

// observer records the Observer calls.
type observer struct {
	mu      sync.Mutex
	loads   int
	rotated []string
	errs    []error
}

func (o *observer) OnLoad(leaf, ca *x509.Certificate) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if leaf.CheckSignatureFrom(ca) == nil {
		o.loads++
	}
}
func (o *observer) OnRotate(kind string) {
	o.mu.Lock()
	o.rotated = append(o.rotated, kind)
	o.mu.Unlock()
}
func (o *observer) OnError(err error) { o.mu.Lock(); o.errs = append(o.errs, err); o.mu.Unlock() }

// An Injector replaces the server-side apply: it is registered for
// changes, given each Secret bundle with its generation, and its live
// bundles gate the re-issue from a new CA; a custom RotateAnnotation starts
// the rotation, and the Observer sees each issued certificate.
func TestInjectorObserverRotateAnnotation(t *testing.T) {
	c := newCluster(t, world()...)
	inj := newFakeInjector()
	var obs observer
	opts := testOptions()
	opts.Webhooks = nil
	opts.Injector = inj
	opts.Observer = &obs
	opts.RotateAnnotation = "example.com/rotate"
	r := c.rotator(t, opts)
	if len(inj.onChange) != 1 {
		t.Fatalf("OnChange registered %d functions, want 1", len(inj.onChange))
	}
	mustBootstrap(t, r)
	old := c.material(t)
	if b, g, _ := inj.Bundles(context.Background(), true); !bytes.Equal(b["hook a"], old.BundlePEM()) || g != 1 {
		t.Fatalf("bootstrap injected generation %d, want the Secret's bundle at 1", g)
	}
	if sb, sg := r.ServedBundle(); !bytes.Equal(sb, old.BundlePEM()) || sg != 1 {
		t.Errorf("ServedBundle = generation %d, want the Secret's bundle at 1", sg)
	}
	if !slices.Equal(obs.rotated, []string{RotateCA, RotateServing}) || obs.loads != 1 {
		t.Fatalf("after create: rotated %v, loads %d", obs.rotated, obs.loads)
	}
	if applies := applyPatches(append(c.kube.Actions(), c.dyn.Actions()...)); len(applies) != 0 {
		t.Fatalf("server-side applied with an Injector: %v", applies)
	}

	// kadmit.io-style annotation: the default one is ignored, the custom
	// one starts the CA rotation.
	s := c.secret(t)
	s.Annotations[RotateAnnotation] = RotateCA
	if _, err := c.kube.CoreV1().Secrets(testNS).Update(context.Background(), s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	pass(t, r)
	if len(c.material(t).Bundle) != 1 {
		t.Fatal("the default annotation rotated with RotateAnnotation set")
	}
	s = c.secret(t)
	delete(s.Annotations, RotateAnnotation)
	s.Annotations["example.com/rotate"] = RotateCA
	if _, err := c.kube.CoreV1().Secrets(testNS).Update(context.Background(), s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	inj.refuse = true
	if _, err := r.reconcileOnce(context.Background()); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("want the Injector's error, got %v", err)
	}
	m1 := c.material(t)
	if len(m1.Bundle) != 2 {
		t.Fatalf("custom annotation: %d CAs, want 2", len(m1.Bundle))
	}
	if _, ok := c.secret(t).Annotations["example.com/rotate"]; ok {
		t.Error("the custom annotation was not removed")
	}
	// The Injector's bundles lack the new CA: no re-issue.
	if _, err := r.reconcileOnce(context.Background()); err == nil {
		t.Fatal("want the refused inject to fail the pass")
	}
	if !c.material(t).Serving.Leaf.Equal(old.Serving.Leaf) {
		t.Fatal("re-issued while the Injector's bundles lack the new CA")
	}
	inj.refuse = false
	if w := pass(t, r); w == nil || !strings.Contains(w.Error(), `hook a: the caBundle does not hold the new CA`) {
		t.Fatalf("want the gate to name the Injector's webhook, got %v", w)
	}
	pass(t, r)
	if m2 := c.material(t); !issuerIs(m2.Serving.Leaf, m1.Bundle[0]) {
		t.Fatal("not re-issued once the Injector's bundles hold the new CA")
	}
	if !slices.Equal(obs.rotated, []string{RotateCA, RotateServing, RotateCA, RotateServing}) {
		t.Errorf("rotated %v, want ca serving ca serving", obs.rotated)
	}

	// An unusable Secret is an error for the Observer.
	r.loadSecret(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: testSecret, Namespace: testNS}})
	if len(obs.errs) != 1 {
		t.Errorf("OnError called %d times for an unusable Secret, want 1", len(obs.errs))
	}
}

// A URL-mode DNSName and extra names may be IP literals: IP SANs, and the
// verified name.
func TestIPSANs(t *testing.T) {
	o, err := Options{
		SecretKey:     types.NamespacedName{Namespace: "ns", Name: "s"},
		DNSName:       "127.0.0.1",
		ExtraDNSNames: []string{"::1", "dev.example.com", "127.0.0.1"},
	}.complete()
	if err != nil {
		t.Fatal(err)
	}
	sp := o.spec()
	if !slices.Equal(sp.DNSNames, []string{"dev.example.com"}) || len(sp.IPs) != 2 || !sp.IPs[0].Equal(net.ParseIP("127.0.0.1")) || !sp.IPs[1].Equal(net.ParseIP("::1")) {
		t.Fatalf("spec SANs %v %v", sp.DNSNames, sp.IPs)
	}
	if o.serverName() != "127.0.0.1" || o.Service != nil {
		t.Errorf("serverName %q, Service %v", o.serverName(), o.Service)
	}
	c := newCluster(t)
	r := c.rotator(t, Options{SecretKey: types.NamespacedName{Namespace: "ns", Name: "s"}, DNSName: "127.0.0.1"})
	if err := r.CertificateCheck(); !errors.Is(err, ErrNotStarted) {
		t.Errorf("CertificateCheck before Start = %v, want ErrNotStarted", err)
	}
	mustBootstrap(t, r)
	if leaf := r.Holder().Current().Leaf; leaf.VerifyHostname("127.0.0.1") != nil {
		t.Errorf("leaf SANs %v %v do not cover 127.0.0.1", leaf.DNSNames, leaf.IPAddresses)
	}
	if got := r.SANs(); !slices.Equal(got, []string{"127.0.0.1"}) {
		t.Errorf("SANs() = %v", got)
	}
}

// The Injector owns the caBundles: Webhooks beside it is a mistake.
func TestInjectorExcludesWebhooks(t *testing.T) {
	o := testOptions()
	o.Injector = newFakeInjector()
	if err := o.Validate(); !errors.Is(err, ErrInvalidOptions) || !strings.Contains(err.Error(), "Injector") {
		t.Fatalf("Validate = %v, want Webhooks and Injector refused", err)
	}
}
