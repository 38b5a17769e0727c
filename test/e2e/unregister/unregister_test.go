// Package unregister checks, against a real kube-apiserver and etcd, that
// kadmit's registration follows what it serves in both directions (issue 20,
// point 2): a policy turned off or on through the --config-map ConfigMap,
// while pods are being created, never makes the API server fail a call to
// kadmit; the configuration whose last hook is gone is deleted, also by a
// kadmit restarted after the edit; and the registrar's delete carries
// preconditions, so it never deletes an object it did not see. Nothing is
// mocked. Like test/e2e it skips without the control plane binaries unless
// KADMIT_E2E_REQUIRED=1; KADMIT_E2E_KEEP=1 keeps the temporary directory.
package unregister

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/registration"
	"github.com/kadmit/kadmit/test/controlplane/kadmitproc"
	"github.com/kadmit/kadmit/test/e2e/e2eenv"
	"github.com/kadmit/kadmit/test/poll"
)

var suite = &e2eenv.Suite{Name: "unregister e2e", QPS: 500, Burst: 1000}

func TestMain(m *testing.M) { os.Exit(suite.Main(m)) }

// Bounds of the load: workers creating pods (dry-run) in parallel, at most
// loadMax creates in all, and the whole test within testLimit.
const (
	workers   = 4
	loadMax   = 20000
	testLimit = 110 * time.Second
	// takeEffect bounds how long a ConfigMap edit may take until the API
	// server acts on the new registration: kadmit's ConfigMap watch, the
	// registrar's write, the API server's webhook informer.
	takeEffect = 20 * time.Second
)

// config is kadmit's configuration with pod-name (the only validating
// policy here) and lifespan (the only mutating one) on or off.
func config(podName, lifespan bool) string {
	return fmt.Sprintf(`apiVersion: kadmit.io/v1alpha1
kind: Configuration
policies:
  podName: {enabled: %t, words: [offensive]}
  lifespan: {enabled: %t}
  nodeOvercommit: {enabled: false}
`, podName, lifespan)
}

type world struct {
	*e2eenv.Env
	ns, cm      string
	addr, maddr string
}

func (w *world) start(t *testing.T) *kadmitproc.Process {
	t.Helper()
	log, err := os.OpenFile(filepath.Join(w.Tmp, "kadmit.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = log.Close() })
	p, err := kadmitproc.Start(kadmitproc.Options{
		Binary: w.Binary, Addr: w.addr, MetricsAddr: w.maddr, CAFile: filepath.Join(w.Tmp, "ca.crt"),
		Kubeconfig: w.Kubeconfig, ShutdownGrace: 2 * time.Second, Log: log,
		ExtraArgs: []string{"--config-map", w.ns + "/" + w.cm},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _, _ = p.Terminate(10 * time.Second) })
	return p
}

func (w *world) setConfig(ctx context.Context, t *testing.T, podName, lifespan bool) {
	t.Helper()
	cms := w.Client.CoreV1().ConfigMaps(w.ns)
	cm, err := cms.Get(ctx, w.cm, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data["config.yaml"] = config(podName, lifespan)
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// exists reports whether kadmit's configuration of typ is registered.
func (w *world) exists(ctx context.Context, typ admission.Type) (bool, error) {
	ar := w.Client.AdmissionregistrationV1()
	var err error
	if typ == admission.Mutating {
		_, err = ar.MutatingWebhookConfigurations().Get(ctx, kadmitproc.ConfigName, metav1.GetOptions{})
	} else {
		_, err = ar.ValidatingWebhookConfigurations().Get(ctx, kadmitproc.ConfigName, metav1.GetOptions{})
	}
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	return err == nil, err
}

func pod(name string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "pause", Image: "registry.k8s.io/pause:3.10"}}},
	}
}

var dryRun = metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}

// policyDenial is the one denial a create may get here: pod-name's own
// verdict on a name with "offensive".
const policyDenial = `denied the request: pod name contains "offensive"`

// decide dry-runs the creation of a pod named name and reports whether it
// was admitted, whether it got lifespan's toleration, and an error for
// anything but admission or pod-name's own denial.
func (w *world) decide(ctx context.Context, name string) (admitted, tolerated bool, err error) {
	got, err := w.Client.CoreV1().Pods(w.ns).Create(ctx, pod(name), dryRun)
	switch {
	case err == nil:
		for _, tol := range got.Spec.Tolerations {
			if tol.Key == "acme.com/lifespan-remaining" {
				tolerated = true
			}
		}
		return true, tolerated, nil
	case strings.Contains(name, "offensive") && strings.Contains(err.Error(), policyDenial):
		return false, false, nil
	}
	return false, false, err
}

// load creates pods (dry-run) from workers goroutines until stop is closed
// or loadMax creates were made, every fourth named so that pod-name denies
// it when on, and counts every outcome that is neither an admission nor
// pod-name's own denial: a failed admission (failurePolicy Fail after a
// failed call, "could not find the requested resource", a timeout).
type load struct {
	total, denied, failed atomic.Int64
	mu                    sync.Mutex
	failures              []string
	stop                  chan struct{}
	wg                    sync.WaitGroup
}

func (w *world) startLoad(ctx context.Context) *load {
	l := &load{stop: make(chan struct{})}
	for i := range workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for n := 0; ; n++ {
				select {
				case <-l.stop:
					return
				case <-ctx.Done():
					return
				default:
				}
				if l.total.Add(1) > loadMax {
					return
				}
				name := fmt.Sprintf("load-%d-%d", i, n)
				if n%4 == 0 {
					name = fmt.Sprintf("offensive-%d-%d", i, n)
				}
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
				admitted, _, err := w.decide(rctx, name)
				cancel()
				switch {
				case err != nil:
					l.failed.Add(1)
					l.mu.Lock()
					if len(l.failures) < 10 {
						l.failures = append(l.failures, time.Now().Format("15:04:05.000")+" "+name+": "+err.Error())
					}
					l.mu.Unlock()
				case !admitted:
					l.denied.Add(1)
				}
			}
		}()
	}
	return l
}

func (l *load) end() {
	close(l.stop)
	l.wg.Wait()
}

// TestPoliciesOffAndOnUnderLoad turns pod-name (the last validating policy)
// and lifespan (the last mutating one) off and on again through the
// ConfigMap while 4 workers create pods, and counts the creates the API
// server failed: 0. Each configuration whose last hook went must be
// deleted, and be back when the policy is. Then kadmit is stopped, pod-name
// turned off while it is down, and kadmit started again: the stale
// validating configuration must be gone and pods admitted.
//
// Before the fix, turning pod-name off left its configuration registered
// with failurePolicy Fail while kadmit answered 404 on /validate-pod: 102
// of 120 creates failed, also after a restart.
func TestPoliciesOffAndOnUnderLoad(t *testing.T) {
	e := suite.Env(t)
	ctx := e2eenv.TestCtx(t, testLimit)
	w := &world{Env: e, cm: "kadmit-config"}
	w.ns = fmt.Sprintf("unregister-%06d", rand.IntN(1_000_000))
	if _, err := e.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: w.ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: w.cm}, Data: map[string]string{"config.yaml": config(true, true)}}
	if _, err := e.Client.CoreV1().ConfigMaps(w.ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var err error
	if w.addr, w.maddr, err = e2eenv.FreeAddrs(); err != nil {
		t.Fatal(err)
	}
	p := w.start(t)
	if err := p.WaitReady(ctx); err != nil {
		t.Fatalf("%v\n%s", err, p.Tail(20))
	}
	if err := p.WaitEffective(ctx, e.Client, w.ns); err != nil {
		t.Fatalf("%v\n%s", err, p.Tail(20))
	}

	var l *load
	// state waits until the registration and the API server's decisions
	// follow podName and lifespan.
	state := func(what string, podName, lifespan bool) {
		t.Helper()
		var mismatch error // the last state seen, not a transport error
		err := poll.Until(ctx, takeEffect, func(ctx context.Context) error {
			for typ, want := range map[admission.Type]bool{admission.Validating: podName, admission.Mutating: lifespan} {
				ok, err := w.exists(ctx, typ)
				if err != nil {
					return err
				}
				if ok != want {
					mismatch = fmt.Errorf("%s configuration registered: %t, want %t", typ, ok, want)
					return mismatch
				}
			}
			admitted, _, err := w.decide(ctx, "probe-offensive")
			if err != nil {
				return err
			}
			if admitted == podName {
				mismatch = fmt.Errorf("offensive pod admitted: %t with pod-name on: %t", admitted, podName)
				return mismatch
			}
			_, tolerated, err := w.decide(ctx, "probe")
			if err != nil {
				return err
			}
			if tolerated != lifespan {
				mismatch = fmt.Errorf("lifespan toleration added: %t with lifespan on: %t", tolerated, lifespan)
				return mismatch
			}
			return nil
		})
		if err != nil {
			if l != nil {
				l.end()
				t.Errorf("load so far: %d creates, %d failed; first failures:\n%s", l.total.Load(), l.failed.Load(), strings.Join(l.failures, "\n"))
			}
			t.Fatalf("%s: %v (last state seen: %v)\n%s", what, err, mismatch, p.Tail(20))
		}
	}

	l = w.startLoad(ctx)
	hold := func() { time.Sleep(2 * time.Second) } // load on the settled state too
	hold()
	for _, step := range []struct {
		what              string
		podName, lifespan bool
	}{
		{"pod-name off", false, true},
		{"pod-name on", true, true},
		{"lifespan off", true, false},
		{"lifespan on", true, true},
		{"both off", false, false},
		{"both on", true, true},
	} {
		w.setConfig(ctx, t, step.podName, step.lifespan)
		state(step.what, step.podName, step.lifespan)
		hold()
	}
	l.end()
	done := l
	l = nil
	t.Logf("%d creates under load: %d denied by pod-name's own verdict, %d failed", done.total.Load(), done.denied.Load(), done.failed.Load())
	if n := done.failed.Load(); n > 0 {
		t.Fatalf("%d creates failed while policies were turned off and on; first ones:\n%s\nkadmit:\n%s",
			n, strings.Join(done.failures, "\n"), p.Tail(20))
	}
	if done.total.Load() < 100 || done.denied.Load() == 0 {
		t.Fatalf("load too small to show anything: %d creates, %d denied", done.total.Load(), done.denied.Load())
	}

	// Restart with pod-name turned off while kadmit was down: the validating
	// configuration it left is stale, and the new kadmit deletes it.
	if code, _, err := p.Terminate(15 * time.Second); err != nil || code != 0 {
		t.Fatalf("kadmit exit %d: %v", code, err)
	}
	w.setConfig(ctx, t, false, true)
	if ok, err := w.exists(ctx, admission.Validating); err != nil || !ok {
		t.Fatalf("validating configuration before the restart: registered %t, %v; want it left by the stopped kadmit", ok, err)
	}
	p = w.start(t)
	if err := p.WaitReady(ctx); err != nil {
		t.Fatalf("%v\n%s", err, p.Tail(20))
	}
	state("restart with pod-name off", false, true)
}

// TestDeleteObservedPreconditions: the registrar's delete, against the real
// API server, deletes only the object exactly as observed (UID and
// resourceVersion preconditions) and only one kadmit's field manager wrote.
func TestDeleteObservedPreconditions(t *testing.T) {
	e := suite.Env(t)
	ctx := e2eenv.TestCtx(t, 30*time.Second)
	vwcs := e.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	name := fmt.Sprintf("kadmit-precondition-%06d", rand.IntN(1_000_000))
	t.Cleanup(func() { _ = vwcs.Delete(context.WithoutCancel(ctx), name, metav1.DeleteOptions{}) })
	own := &admissionregistrationv1.ValidatingWebhookConfiguration{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingWebhookConfiguration"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app.kubernetes.io/managed-by": "kadmit"}},
	}
	if err := registration.Apply(ctx, e.Client, nil, own); err != nil {
		t.Fatal(err)
	}
	seen, err := vwcs.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Someone changes it after the registrar looked.
	changed := seen.DeepCopy()
	changed.Labels = map[string]string{"changed": "true"}
	if changed, err = vwcs.Update(ctx, changed, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if deleted, err := registration.DeleteObserved(ctx, e.Client, admission.Validating, seen.ObjectMeta); deleted || !apierrors.IsConflict(err) {
		t.Fatalf("delete of a stale look: deleted %t, err %v; want a Conflict", deleted, err)
	}
	if _, err := vwcs.Get(ctx, name, metav1.GetOptions{}); err != nil {
		t.Fatalf("the object changed since the look is gone: %v", err)
	}
	// Replaced by an object of the same name (a new UID), written by kadmit.
	if err := vwcs.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := registration.Apply(ctx, e.Client, nil, own); err != nil {
		t.Fatal(err)
	}
	if deleted, err := registration.DeleteObserved(ctx, e.Client, admission.Validating, changed.ObjectMeta); deleted || err == nil {
		t.Fatalf("delete of a replaced object: deleted %t, err %v; want a precondition failure", deleted, err)
	}
	fresh, err := vwcs.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the replacement is gone: %v", err)
	}
	if deleted, err := registration.DeleteObserved(ctx, e.Client, admission.Validating, fresh.ObjectMeta); !deleted || err != nil {
		t.Fatalf("delete as observed: deleted %t, %v", deleted, err)
	}
	if _, err := vwcs.Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("after the delete: %v, want NotFound", err)
	}

	// An object of the name kadmit never wrote is left alone.
	foreign := &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if foreign, err = vwcs.Create(ctx, foreign, metav1.CreateOptions{FieldManager: "someone-else"}); err != nil {
		t.Fatal(err)
	}
	if deleted, err := registration.DeleteObserved(ctx, e.Client, admission.Validating, foreign.ObjectMeta); deleted || !errors.Is(err, registration.ErrNotWrittenByKadmit) {
		t.Fatalf("delete of a foreign object: deleted %t, err %v; want ErrNotWrittenByKadmit", deleted, err)
	}
	if _, err := vwcs.Get(ctx, name, metav1.GetOptions{}); err != nil {
		t.Fatalf("the foreign object is gone: %v", err)
	}
}
