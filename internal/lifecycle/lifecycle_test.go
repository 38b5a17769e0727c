package lifecycle

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kadmit/kadmit/pkg/webhookcerts"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/registration"
)

const (
	ns         = "kadmit-system"
	secretName = "kadmit-tls"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// clock is a settable test clock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func spec() webhookcerts.Spec {
	return webhookcerts.Spec{IPs: []net.IP{net.ParseIP("127.0.0.1")}, KeyType: webhookcerts.ECDSAP256, ServingValidity: 3 * time.Hour, CAValidity: 30 * time.Hour}
}

func newManager(t *testing.T, cs *fake.Clientset, clk *clock, mutate func(*Options)) *Manager {
	t.Helper()
	o := Options{Client: cs, Namespace: ns, SecretName: secretName, Spec: spec(), Logger: quiet, Now: clk.Now, SettleDelay: 3 * time.Second}
	if mutate != nil {
		mutate(&o)
	}
	m, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return ctx
}

func secret(t *testing.T, cs *fake.Clientset) (*corev1.Secret, *webhookcerts.Material) {
	t.Helper()
	s, err := cs.CoreV1().Secrets(ns).Get(context.Background(), secretName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mat, err := webhookcerts.ParseSecretData(s.Data)
	if err != nil {
		t.Fatal(err)
	}
	return s, mat
}

func eventually(t *testing.T, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// serves waits until the replica's informer has loaded the Secret's serving
// certificate.
func serves(t *testing.T, m *Manager, cs *fake.Clientset) {
	t.Helper()
	_, mat := secret(t, cs)
	eventually(t, "serving the Secret's certificate", func() bool {
		cur := m.Holder().Current()
		return cur != nil && cur.Leaf.Equal(mat.Serving.Leaf)
	})
}

func annotate(t *testing.T, cs *fake.Clientset, value string) {
	t.Helper()
	s, _ := secret(t, cs)
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations[RotateAnnotation] = value
	if _, err := cs.CoreV1().Secrets(ns).Update(context.Background(), s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func TestBootstrapRaceUsesTheWinnersSecret(t *testing.T) {
	cs := fake.NewClientset()
	clk := &clock{now: time.Now()}
	winner := newManager(t, cs, clk, nil)
	if err := winner.startCaches(ctxFor(t)); err != nil {
		t.Fatal(err)
	}
	_, won := secret(t, cs)
	// The loser's GET ran before the winner's Create: NotFound, so it
	// creates too and gets AlreadyExists.
	loserCS := fake.NewClientset(mustGet(t, cs))
	var answered atomic.Bool
	loserCS.PrependReactor("get", "secrets", func(k8stesting.Action) (bool, runtime.Object, error) {
		if answered.Swap(true) { // only the first GET
			return false, nil, nil
		}
		return true, nil, apierrors.NewNotFound(corev1.Resource("secrets"), secretName)
	})
	loser := newManager(t, loserCS, clk, nil)
	if err := loser.startCaches(ctxFor(t)); err != nil {
		t.Fatalf("loser: %v", err)
	}
	creates := 0
	for _, a := range loserCS.Actions() {
		if a.GetVerb() == "create" && a.GetResource().Resource == "secrets" {
			creates++
		}
	}
	if creates != 1 {
		t.Fatalf("loser made %d creates, want 1 (answered AlreadyExists)", creates)
	}
	if !loser.Holder().Current().Leaf.Equal(won.Serving.Leaf) {
		t.Fatal("loser serves its own certificate, not the winner's: two CAs in play")
	}
	if string(loser.CABundle()) != string(won.BundlePEM()) {
		t.Fatal("loser's caBundle differs from the winner's")
	}
	if err := loser.Ready(); err != nil {
		t.Fatalf("loser not ready: %v", err)
	}
}

func mustGet(t *testing.T, cs *fake.Clientset) *corev1.Secret {
	s, _ := secret(t, cs)
	return s
}

func TestRenewalAtTwoThirds(t *testing.T) {
	cs := fake.NewClientset()
	clk := &clock{now: time.Now()}
	m := newManager(t, cs, clk, nil)
	ctx := ctxFor(t)
	if err := m.startCaches(ctx); err != nil {
		t.Fatal(err)
	}
	_, first := secret(t, cs)
	renewAt := webhookcerts.RenewAt(first.Serving.Leaf)
	clk.Add(renewAt.Sub(clk.Now()) - time.Minute)
	next, err := m.reconcile(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, mat := secret(t, cs); !mat.Equal(first) {
		t.Fatal("renewed before 2/3 of the lifetime")
	}
	if next <= 0 || next > 30*time.Second {
		t.Fatalf("next look in %s, want (0, 30s]", next)
	}
	clk.Add(2 * time.Minute)
	if _, err := m.reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	_, renewed := secret(t, cs)
	if renewed.Serving.Leaf.Equal(first.Serving.Leaf) {
		t.Fatal("not renewed after 2/3 of the lifetime")
	}
	if !renewed.Bundle[0].Equal(first.Bundle[0]) || len(renewed.Bundle) != 1 {
		t.Fatal("a serving renewal changed the CA")
	}
	if renewed.Serving.Leaf.CheckSignatureFrom(first.Bundle[0]) != nil {
		t.Fatal("renewed certificate not signed by the CA")
	}
	serves(t, m, cs)
}

func TestForcedServingRotation(t *testing.T) {
	cs := fake.NewClientset()
	clk := &clock{now: time.Now()}
	m := newManager(t, cs, clk, nil)
	ctx := ctxFor(t)
	if err := m.startCaches(ctx); err != nil {
		t.Fatal(err)
	}
	_, first := secret(t, cs)
	annotate(t, cs, "serving")
	if _, err := m.reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	s, mat := secret(t, cs)
	if mat.Serving.Leaf.Equal(first.Serving.Leaf) || !mat.Bundle[0].Equal(first.Bundle[0]) {
		t.Fatal("forced serving rotation did not re-issue from the same CA")
	}
	if _, ok := s.Annotations[RotateAnnotation]; ok {
		t.Fatal("rotate annotation left in place")
	}
}

func TestRestoreDeletedSecretFromServedMaterial(t *testing.T) {
	cs := fake.NewClientset()
	clk := &clock{now: time.Now()}
	m := newManager(t, cs, clk, nil)
	ctx := ctxFor(t)
	if err := m.startCaches(ctx); err != nil {
		t.Fatal(err)
	}
	_, before := secret(t, cs)
	if err := cs.CoreV1().Secrets(ns).Delete(ctx, secretName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	s, after := secret(t, cs)
	if !after.Equal(before) {
		t.Fatal("recreated Secret differs from the material in use: the API server would see a new CA")
	}
	if s.Type != corev1.SecretTypeTLS || s.Labels["app.kubernetes.io/managed-by"] != "kadmit" {
		t.Fatalf("recreated Secret type %q labels %v", s.Type, s.Labels)
	}
}

func TestRestoreDeletedSecretWithoutMaterialIssuesNew(t *testing.T) {
	cs := fake.NewClientset()
	m := newManager(t, cs, &clock{now: time.Now()}, nil)
	if _, err := m.reconcile(ctxFor(t)); err != nil {
		t.Fatal(err)
	}
	if _, mat := secret(t, cs); len(mat.Bundle) != 1 {
		t.Fatal("no usable Secret issued")
	}
}

func TestRepairCorruptSecret(t *testing.T) {
	cs := fake.NewClientset()
	clk := &clock{now: time.Now()}
	m := newManager(t, cs, clk, nil)
	ctx := ctxFor(t)
	if err := m.startCaches(ctx); err != nil {
		t.Fatal(err)
	}
	s, before := secret(t, cs)
	for _, corrupt := range []func(*corev1.Secret){
		func(s *corev1.Secret) { delete(s.Data, webhookcerts.SecretCAPrivateKey) },
		func(s *corev1.Secret) {
			s.Data[webhookcerts.SecretCertKey] = []byte("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
		},
		func(s *corev1.Secret) { s.Type = corev1.SecretTypeOpaque; s.Data = map[string][]byte{} },
	} {
		s = s.DeepCopy()
		corrupt(s)
		if _, err := cs.CoreV1().Secrets(ns).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		// Replicas keep serving what they have meanwhile.
		eventually(t, "informer saw the corruption", func() bool {
			got, err := m.secrets.Secrets(ns).Get(secretName)
			return err == nil && got.ResourceVersion == s.ResourceVersion || err == nil && len(got.Data) == len(s.Data) && got.Type == s.Type
		})
		if !m.Holder().Current().Leaf.Equal(before.Serving.Leaf) {
			t.Fatal("replica dropped its certificate for a corrupt Secret")
		}
		if _, err := m.reconcile(ctx); err != nil {
			t.Fatal(err)
		}
		var after *webhookcerts.Material
		s, after = secret(t, cs)
		if !after.Equal(before) || s.Type != corev1.SecretTypeTLS {
			t.Fatal("corrupt Secret not repaired from the material in use")
		}
	}
}

// withRegistrar connects m to a registrar on the same fake API server (URL
// mode: the API server calls 127.0.0.1, no Service to probe).
func withRegistrar(t *testing.T, ctx context.Context, cs *fake.Clientset, m *Manager, clk *clock) *registration.Registrar {
	t.Helper()
	v := admission.ValidatorFunc(func(context.Context, *admission.Request) admission.Verdict { return admission.Allow() })
	hooks := []admission.Hook{{Policy: "pod-name", Path: "/validate-pod", Type: admission.Validating, Validator: v,
		FailurePolicy: admissionregistrationv1.Fail,
		Rules: []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
			Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}}}}}}
	reg, err := registration.NewRegistrar(registration.RegistrarOptions{Client: cs, Registration: registration.Options{Name: "kadmit", URL: "https://127.0.0.1:9443"},
		Hooks: hooks, ServerName: "127.0.0.1", Holder: m.Holder(), Bundle: m.CABundle, Logger: quiet, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	m.SetRegistrar(reg)
	if err := reg.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return reg
}

func registeredBundle(t *testing.T, cs *fake.Clientset) []byte {
	v, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(context.Background(), "kadmit", metav1.GetOptions{})
	if err != nil {
		return nil
	}
	return v.Webhooks[0].ClientConfig.CABundle
}

// TestCARotationSteps walks a CA rotation step by step and checks after
// every step that the certificate served verifies against the registered
// caBundle: there is never an unknown-authority window.
func TestCARotationSteps(t *testing.T) {
	cs := fake.NewClientset()
	clk := &clock{now: time.Now()}
	m := newManager(t, cs, clk, nil)
	ctx := ctxFor(t)
	reg := withRegistrar(t, ctx, cs, m, clk)
	if err := m.startCaches(ctx); err != nil {
		t.Fatal(err)
	}
	step := func(what string) time.Duration {
		t.Helper()
		next, err := m.reconcile(ctx)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		// what the API server would check, once the informers caught up
		eventually(t, what+": served certificate trusted by the registered caBundle", func() bool { return reg.Ready() == nil })
		return next
	}
	step("registration")
	_, orig := secret(t, cs)
	if string(registeredBundle(t, cs)) != string(orig.BundlePEM()) {
		t.Fatal("caBundle not registered")
	}

	annotate(t, cs, "ca")
	step("new CA")
	s, mat := secret(t, cs)
	if len(mat.Bundle) != 2 || mat.Bundle[1].Equal(orig.Bundle[0]) == false || !mat.Serving.Leaf.Equal(orig.Serving.Leaf) {
		t.Fatalf("step 1: bundle %d CAs (want new+old), serving unchanged %t", len(mat.Bundle), mat.Serving.Leaf.Equal(orig.Serving.Leaf))
	}
	if _, ok := s.Annotations[RotateAnnotation]; ok {
		t.Fatal("rotate annotation left in place")
	}
	newCA := mat.Bundle[0]
	eventually(t, "replica sees the two-CA bundle", func() bool { return string(m.CABundle()) == string(mat.BundlePEM()) })

	// Step 2: the bundle goes into the configurations first; the serving
	// certificate moves only after it settled.
	step("inject new+old")
	if string(registeredBundle(t, cs)) != string(mat.BundlePEM()) {
		t.Fatal("step 2: two-CA bundle not injected")
	}
	if wait := step("settle starts"); wait != m.o.SettleDelay {
		t.Fatalf("settle wait %s, want %s", wait, m.o.SettleDelay)
	}
	if _, cur := secret(t, cs); !cur.Serving.Leaf.Equal(orig.Serving.Leaf) {
		t.Fatal("serving certificate moved to the new CA before the bundle settled")
	}
	clk.Add(m.o.SettleDelay)
	step("re-issue from the new CA")
	_, mat = secret(t, cs)
	if mat.Serving.Leaf.CheckSignatureFrom(newCA) != nil || len(mat.Bundle) != 2 {
		t.Fatal("step 2: serving certificate not re-issued from the new CA with both CAs kept")
	}
	serves(t, m, cs)

	// Step 3: the old CA leaves only after everything serves from the new
	// one, for SettleDelay.
	step("all serve from the new CA")
	if _, cur := secret(t, cs); len(cur.Bundle) != 2 {
		t.Fatal("old CA dropped without waiting")
	}
	clk.Add(m.o.SettleDelay)
	step("drop old CAs")
	_, mat = secret(t, cs)
	if len(mat.Bundle) != 1 || !mat.Bundle[0].Equal(newCA) {
		t.Fatal("step 3: bundle is not the new CA alone")
	}
	eventually(t, "replica sees the one-CA bundle", func() bool { return string(m.CABundle()) == string(mat.BundlePEM()) })
	step("inject new CA alone")
	if string(registeredBundle(t, cs)) != string(mat.BundlePEM()) {
		t.Fatal("caBundle still holds the old CA")
	}
}

// TestLeaderRepairsBlankedCABundle: the leader re-injects as soon as the
// registrar's informer sees a blanked caBundle.
func TestLeaderRepairsBlankedCABundle(t *testing.T) {
	cs := fake.NewClientset()
	clk := &clock{now: time.Now()}
	m := newManager(t, cs, clk, func(o *Options) {
		o.LeaseDuration, o.RenewDeadline, o.RetryPeriod = 2*time.Second, time.Second, 200*time.Millisecond
		o.Identity = "a"
	})
	ctx := ctxFor(t)
	withRegistrar(t, ctx, cs, m, clk)
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	_, mat := secret(t, cs)
	eventually(t, "registered by the leader", func() bool { return string(registeredBundle(t, cs)) == string(mat.BundlePEM()) })
	v, _ := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, "kadmit", metav1.GetOptions{})
	v.Webhooks[0].ClientConfig.CABundle = nil
	if _, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Update(ctx, v, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	eventually(t, "blanked caBundle repaired", func() bool { return string(registeredBundle(t, cs)) == string(mat.BundlePEM()) })
	t.Logf("repaired in %s", time.Since(start))
}

// TestLeaderElection: of two replicas exactly one writes; when it stops
// (releasing the Lease), the other takes over.
func TestLeaderElection(t *testing.T) {
	cs := fake.NewClientset()
	clk := &clock{now: time.Now()}
	fast := func(id string) func(*Options) {
		return func(o *Options) {
			o.LeaseDuration, o.RenewDeadline, o.RetryPeriod = 2*time.Second, time.Second, 200*time.Millisecond
			o.Identity = id
		}
	}
	a, b := newManager(t, cs, clk, fast("a")), newManager(t, cs, clk, fast("b"))
	actx, stopA := context.WithCancel(context.Background())
	defer stopA()
	if err := a.Start(actx); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a leads", a.IsLeader)
	if err := b.Start(ctxFor(t)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if b.IsLeader() {
		t.Fatal("two leaders")
	}
	stopA()
	eventually(t, "b takes over", b.IsLeader)
	lease, err := cs.CoordinationV1().Leases(ns).Get(context.Background(), secretName+"-leader", metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != "b" {
		t.Fatalf("Lease %v, %v: want held by b", lease, err)
	}
	// As leader, b acts on a forced rotation.
	_, before := secret(t, cs)
	annotate(t, cs, "serving")
	eventually(t, "b rotated", func() bool {
		_, mat := secret(t, cs)
		return !mat.Serving.Leaf.Equal(before.Serving.Leaf)
	})
}

func TestNewRejectsIncompleteOptions(t *testing.T) {
	if _, err := New(Options{Client: fake.NewClientset(), Namespace: ns, SecretName: secretName}); !errors.Is(err, webhookcerts.ErrNoSANs) {
		t.Fatalf("no SANs: %v", err)
	}
	if _, err := New(Options{Namespace: ns, SecretName: secretName, Spec: spec()}); err == nil {
		t.Fatal("no client accepted")
	}
}
