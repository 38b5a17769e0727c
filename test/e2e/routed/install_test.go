package routed

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kadmit/kadmit/test/e2e/e2eenv"
)

const configName = "kadmit"

// reset returns the cluster to "nothing installed": every replica stopped,
// no webhook configuration, Secret or EndpointSlice.
func (e *env) reset(t *testing.T) {
	t.Helper()
	ctx := e2eenv.TestCtx(t, time.Minute)
	c := e.cluster
	c.publish.Store(true)
	if err := c.stopAll(); err != nil {
		t.Fatalf("stop replicas: %v", err)
	}
	ar := e.Client.AdmissionregistrationV1()
	del := []func() error{
		func() error {
			return ar.MutatingWebhookConfigurations().Delete(ctx, configName, metav1.DeleteOptions{})
		},
		func() error {
			return ar.ValidatingWebhookConfigurations().Delete(ctx, configName, metav1.DeleteOptions{})
		},
		func() error {
			return e.Client.CoreV1().Secrets(systemNS).Delete(ctx, secretName, metav1.DeleteOptions{})
		},
		func() error { return c.deleteSlice(ctx) },
	}
	for _, d := range del {
		if err := d(); err != nil && !apierrors.IsNotFound(err) {
			t.Fatalf("reset: %v", err)
		}
	}
	eventually(t, 10*time.Second, "configurations gone", func() error {
		if e.configsExist(ctx) {
			return errors.New("still there")
		}
		return nil
	})
}

// configsExist reports whether both webhook configurations exist.
func (e *env) configsExist(ctx context.Context) bool {
	ar := e.Client.AdmissionregistrationV1()
	_, merr := ar.MutatingWebhookConfigurations().Get(ctx, configName, metav1.GetOptions{})
	_, verr := ar.ValidatingWebhookConfigurations().Get(ctx, configName, metav1.GetOptions{})
	return merr == nil && verr == nil
}

// anyConfigExists reports whether either webhook configuration exists.
func (e *env) anyConfigExists(ctx context.Context) bool {
	ar := e.Client.AdmissionregistrationV1()
	_, merr := ar.MutatingWebhookConfigurations().Get(ctx, configName, metav1.GetOptions{})
	_, verr := ar.ValidatingWebhookConfigurations().Get(ctx, configName, metav1.GetOptions{})
	return merr == nil || verr == nil
}

// allReady fails unless every live replica answers /readyz 200 and is
// listed ready in the EndpointSlice.
func (e *env) allReady(want int) error {
	live := e.cluster.live()
	if len(live) < want {
		return fmt.Errorf("%d live replicas, want %d", len(live), want)
	}
	for _, r := range live {
		if ok, answer := r.state(); !ok {
			return fmt.Errorf("%s not ready: %s", r.name, answer)
		}
		if e.cluster.publish.Load() && !e.cluster.published(r.name) {
			return fmt.Errorf("%s not yet listed ready in the EndpointSlice", r.name)
		}
	}
	return nil
}

// effective fails unless the API server calls kadmit's webhooks: an
// offensive pod name is denied and a plain pod gets lifespan's toleration.
func (e *env) effective() error {
	r := createPod(e.Client, loadNS, "probe-offensive", nil)
	if r.err == nil || !strings.Contains(r.err.Error(), `pod name contains "offensive"`) {
		return fmt.Errorf("offensive pod: %v", r.err)
	}
	r = createPod(e.Client, loadNS, "probe", nil)
	if r.err != nil || !r.mutated {
		return fmt.Errorf("plain pod: mutated=%v err=%v", r.mutated, r.err)
	}
	return nil
}

// ensureInstalled makes sure three self-managed replicas serve behind the
// Service with their configurations in effect; a test that breaks this state
// leaves it to the next one to install afresh.
func (e *env) ensureInstalled(t *testing.T) {
	t.Helper()
	ctx := e2eenv.TestCtx(t, 2*time.Minute)
	if e.allReady(3) == nil && e.configsExist(ctx) && e.effective() == nil {
		return
	}
	t.Log("installing afresh: three replicas")
	e.reset(t)
	for range 3 {
		e.cluster.startReplica(t, nil)
	}
	eventually(t, 90*time.Second, "replicas ready", func() error { return e.allReady(3) })
	eventually(t, 30*time.Second, "configurations written", func() error {
		if !e.configsExist(ctx) {
			return errors.New("missing")
		}
		return nil
	})
	eventually(t, 30*time.Second, "webhooks in effect", e.effective)
}

// annotateRotate asks the replicas for a rotation.
func (e *env) annotateRotate(ctx context.Context, kind string) error {
	patch := fmt.Appendf(nil, `{"metadata":{"annotations":{"kadmit.io/rotate":%q}}}`, kind)
	_, err := e.Client.CoreV1().Secrets(systemNS).Patch(ctx, secretName, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}

// everyReplicaServes fails unless every live, running replica serves a
// certificate that check accepts.
func (e *env) everyReplicaServes(check func(leaf *x509.Certificate) error) error {
	for _, r := range e.cluster.live() {
		if !r.running() {
			continue
		}
		leaf, err := servedLeaf(r.addr)
		if err != nil {
			return fmt.Errorf("%s: %w", r.name, err)
		}
		if err := check(leaf); err != nil {
			return fmt.Errorf("%s serves serial %s from %q: %w", r.name, leaf.SerialNumber.Text(16), leaf.Issuer.CommonName, err)
		}
	}
	return nil
}

// sleepUntil sleeps until t (no-op when past).
func sleepUntil(t time.Time) { time.Sleep(time.Until(t)) }
