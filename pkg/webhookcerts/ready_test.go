package webhookcerts

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ReadyzCheck follows the informers' caBundles without the reconcile loop
// (which would repair them at once): false while a live bundle lacks the
// CA, naming the configuration and webhook; false on a SAN mismatch; true
// otherwise.
func TestReadyzCheck(t *testing.T) {
	c := newCluster(t, world()...)
	r := c.rotator(t, testOptions())
	if err := r.ReadyzCheck(nil); !errors.Is(err, ErrNotStarted) {
		t.Fatalf("before Start: %v, want ErrNotStarted", err)
	}
	mustBootstrap(t, r)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := r.startInformers(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r.ReadyzCheck(nil); err != nil {
		t.Fatalf("ready state: %v", err)
	}

	// Another CA in one webhook's caBundle.
	other, err := NewMaterial(r.spec, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	m, err := c.kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "m", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	good := m.Webhooks[0].ClientConfig.CABundle
	m.Webhooks[0].ClientConfig.CABundle = other.BundlePEM()
	if m, err = c.kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Update(ctx, m, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "readiness fails on the foreign caBundle", func() error {
		err := r.ReadyzCheck(nil)
		if err == nil {
			return errors.New("still ready")
		}
		if !strings.Contains(err.Error(), `MutatingWebhookConfiguration "m" webhook "c.example.com"`) || !strings.Contains(err.Error(), "unknown authority") {
			t.Fatalf("error does not name the webhook and the reason: %v", err)
		}
		return nil
	})
	m.Webhooks[0].ClientConfig.CABundle = good
	if _, err = c.kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Update(ctx, m, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "ready again", func() error { return r.ReadyzCheck(nil) })

	// A blanked CRD caBundle.
	u, err := c.dyn.Resource(crdGVR).Get(ctx, testCRD, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	orig := u.DeepCopy()
	if err := setNested(u.Object, "", "spec", "conversion", "webhook", "clientConfig", "caBundle"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.dyn.Resource(crdGVR).Update(ctx, u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "readiness fails on the blank CRD caBundle", func() error {
		if err := r.ReadyzCheck(nil); err == nil || !strings.Contains(err.Error(), testCRD) {
			return errors.New("still ready")
		}
		return nil
	})
	if _, err := c.dyn.Resource(crdGVR).Update(ctx, orig, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "ready again", func() error { return r.ReadyzCheck(nil) })

	// A served certificate (from the right CA) without svc.ns.svc.
	mat := r.served()
	spec := r.spec
	spec.DNSNames = []string{"elsewhere.example.com"}
	wrong, err := mat.WithServing(spec, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	r.holder.Set(wrong.Serving)
	if err := r.ReadyzCheck(nil); err == nil || !strings.Contains(err.Error(), "do not cover hook.sys.svc") {
		t.Fatalf("SAN mismatch: %v", err)
	}
	r.holder.Set(mat.Serving)
	if err := r.ReadyzCheck(nil); err != nil {
		t.Fatal(err)
	}
	// An expired one.
	r.now = func() time.Time { return mat.Serving.Leaf.NotAfter.Add(time.Minute) }
	if err := r.ReadyzCheck(nil); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("expired: %v", err)
	}
}

func setNested(obj map[string]any, v any, path ...string) error {
	for _, p := range path[:len(path)-1] {
		next, ok := obj[p].(map[string]any)
		if !ok {
			return errors.New("no " + p)
		}
		obj = next
	}
	obj[path[len(path)-1]] = v
	return nil
}
