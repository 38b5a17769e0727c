package uninstall

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

const ns = "kadmit-system"

var sel = map[string]string{"app.kubernetes.io/name": "kadmit", "app.kubernetes.io/instance": "kadmit"}

func objects(replicas int32, pods ...string) []runtime.Object {
	out := []runtime.Object{
		&appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: "kadmit", Namespace: ns},
			Spec:       appsv1.DeploymentSpec{Replicas: &replicas, Selector: &metav1.LabelSelector{MatchLabels: sel}},
		},
		&admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "kadmit"}},
		&admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "kadmit"}},
		// Another workload's pod in the namespace: must not be waited for.
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "other", Namespace: ns, Labels: map[string]string{"app.kubernetes.io/name": "other"}}},
	}
	for _, p := range pods {
		out = append(out, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p, Namespace: ns, Labels: sel}})
	}
	return out
}

// TestRunScalesWaitsDeletes plays the Deployment controller: once the scale
// patch lands, kadmit's pods go away after a few polls. The configurations
// must be deleted only after the last pod is gone.
func TestRunScalesWaitsDeletes(t *testing.T) {
	cs := fake.NewClientset(objects(3, "kadmit-a", "kadmit-b")...)
	var scaled atomic.Bool
	var listsAfterScale atomic.Int32
	cs.PrependReactor("patch", "deployments", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "scale" {
			t.Errorf("patched Deployment without the scale subresource: %q", a.GetSubresource())
		}
		if p := string(a.(k8stesting.PatchAction).GetPatch()); p != `{"spec":{"replicas":0}}` {
			t.Errorf("scale patch %s", p)
		}
		scaled.Store(true)
		return true, &appsv1.Deployment{}, nil
	})
	cs.PrependReactor("list", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if !scaled.Load() {
			t.Error("pods listed before the Deployment was scaled to 0")
		}
		if listsAfterScale.Add(1) == 3 {
			for _, p := range []string{"kadmit-a", "kadmit-b"} {
				if err := cs.Tracker().Delete(corev1.SchemeGroupVersion.WithResource("pods"), ns, p); err != nil {
					t.Error(err)
				}
			}
		}
		return false, nil, nil
	})
	var deletes atomic.Int32
	for _, r := range []string{"mutatingwebhookconfigurations", "validatingwebhookconfigurations"} {
		cs.PrependReactor("delete", r, func(k8stesting.Action) (bool, runtime.Object, error) {
			deletes.Add(1)
			// The third list is the first to come back empty.
			if listsAfterScale.Load() < 3 {
				t.Error("webhook configuration deleted while kadmit's pods were still listed")
			}
			return false, nil, nil
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := Run(ctx, Options{Client: cs, Namespace: ns, Deployment: "kadmit", Poll: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if !res.ScaledDown || len(res.Deleted) != 2 || deletes.Load() != 2 {
		t.Fatalf("result %+v (%d deletes), want scaled down and both configurations deleted", res, deletes.Load())
	}
	for _, get := range []func() error{
		func() error {
			_, err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "kadmit", metav1.GetOptions{})
			return err
		},
		func() error {
			_, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, "kadmit", metav1.GetOptions{})
			return err
		},
	} {
		if err := get(); !apierrors.IsNotFound(err) {
			t.Fatalf("configuration still there: %v", err)
		}
	}
}

// TestRunTimesOutNamingPods: pods that never end make Run fail with their
// names, and nothing is deleted (a live leader would write it back anyway).
func TestRunTimesOutNamingPods(t *testing.T) {
	cs := fake.NewClientset(objects(3, "kadmit-stuck")...)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := Run(ctx, Options{Client: cs, Namespace: ns, Deployment: "kadmit", Poll: 10 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "kadmit-stuck") {
		t.Fatalf("err = %v, want a timeout naming kadmit-stuck", err)
	}
	if _, err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(context.Background(), "kadmit", metav1.GetOptions{}); err != nil {
		t.Fatalf("configuration deleted although kadmit still ran: %v", err)
	}
}

// TestRunDeploymentGone: with the Deployment already deleted, the pod
// selector finds kadmit's pods; none left means delete at once.
func TestRunDeploymentGone(t *testing.T) {
	objs := objects(0)[1:] // no Deployment
	cs := fake.NewClientset(objs...)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	res, err := Run(ctx, Options{Client: cs, Namespace: ns, Deployment: "kadmit", PodSelector: "app.kubernetes.io/name=kadmit", Poll: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if res.ScaledDown || len(res.Deleted) != 2 {
		t.Fatalf("result %+v", res)
	}
	// Running again finds nothing to do and still succeeds.
	if res, err = Run(ctx, Options{Client: cs, Namespace: ns}); err != nil || len(res.Deleted) != 0 {
		t.Fatalf("second run: %+v, %v", res, err)
	}
}

// TestRunDetectsRewriter: a configuration that is back after deletion means
// some kadmit still writes it; Run must say so rather than report success.
func TestRunDetectsRewriter(t *testing.T) {
	cs := fake.NewClientset(objects(0)...)
	cs.PrependReactor("delete", "validatingwebhookconfigurations", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, nil // "deleted", but it stays: as if re-created at once
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := Run(ctx, Options{Client: cs, Namespace: ns, Deployment: "kadmit", Poll: 10 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "exists again") {
		t.Fatalf("err = %v, want 'exists again'", err)
	}
}
