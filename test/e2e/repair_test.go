package e2e

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kadmit/kadmit/test/e2e/e2eenv"
)

// filesRepairLimit is the bound on repairing a blanked caBundle
// with --tls=files --register (the cert-manager path).
const filesRepairLimit = time.Second

// TestFilesModeRepairsBlankedCABundle runs a second install (its own
// --webhook-config-name, so the shared kadmit's configurations are never
// touched) with a cert-manager style certificate: --tls=files --register.
// Both its configurations get their caBundle blanked, repeatedly; each time
// the registrar must write it back within filesRepairLimit, measured from
// the blanking write to the repaired object in a watch on the API server,
// and the replica must be ready again afterwards.
func TestFilesModeRepairsBlankedCABundle(t *testing.T) {
	e := world(t)
	ctx := e2eenv.TestCtx(t, 2*time.Minute)
	const name = "kadmit-files-repair"
	p, ca, _ := startFilesInstall(t, ctx, e, name)

	var worst time.Duration
	for round := range 5 {
		took, err := blankAndWaitRepair(ctx, e, name, ca)
		if err != nil {
			t.Fatalf("round %d: %v\n%s", round, err, p.Tail(20))
		}
		t.Logf("round %d: caBundle of both configurations repaired %s after blanking", round, took.Round(time.Millisecond))
		worst = max(worst, took)
		if err := p.WaitReady(ctx); err != nil {
			t.Fatalf("round %d: not ready after the repair: %v", round, err)
		}
	}
	t.Logf("worst repair: %s (limit %s)", worst.Round(time.Millisecond), filesRepairLimit)
	if worst > filesRepairLimit {
		t.Fatalf("a blanked caBundle took %s to repair, want <= %s", worst, filesRepairLimit)
	}
}

// blankAndWaitRepair removes the caBundle of the first webhook of both
// configurations and returns how long it took, from just before the first
// blanking write, until a watch shows both holding ca again.
func blankAndWaitRepair(ctx context.Context, e *env, name string, ca []byte) (time.Duration, error) {
	// A client of its own without client-side throttling: the shared
	// client's rate limit would otherwise sit between the two blanking
	// writes and count against kadmit.
	cfg := rest.CopyConfig(e.Config)
	cfg.QPS, cfg.Burst = 1000, 1000
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return 0, err
	}
	reg := client.AdmissionregistrationV1()
	m, err := reg.MutatingWebhookConfigurations().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return 0, err
	}
	v, err := reg.ValidatingWebhookConfigurations().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return 0, err
	}
	// Watch from the current versions, so no repair can slip by unseen.
	mw, err := reg.MutatingWebhookConfigurations().Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name, ResourceVersion: m.ResourceVersion})
	if err != nil {
		return 0, err
	}
	defer mw.Stop()
	vw, err := reg.ValidatingWebhookConfigurations().Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name, ResourceVersion: v.ResourceVersion})
	if err != nil {
		return 0, err
	}
	defer vw.Stop()
	blank := []byte(`[{"op":"remove","path":"/webhooks/0/clientConfig/caBundle"}]`)
	start := time.Now()
	if _, err := reg.MutatingWebhookConfigurations().Patch(ctx, name, types.JSONPatchType, blank, metav1.PatchOptions{}); err != nil {
		return 0, fmt.Errorf("blank MutatingWebhookConfiguration: %w", err)
	}
	if _, err := reg.ValidatingWebhookConfigurations().Patch(ctx, name, types.JSONPatchType, blank, metav1.PatchOptions{}); err != nil {
		return 0, fmt.Errorf("blank ValidatingWebhookConfiguration: %w", err)
	}
	mBlanked, vBlanked, mFixed, vFixed := false, false, false, false
	timeout := time.After(10 * time.Second)
	for !mFixed || !vFixed {
		select {
		case ev, ok := <-mw.ResultChan():
			if !ok {
				return 0, fmt.Errorf("mutating watch closed")
			}
			if obj, isM := ev.Object.(*admissionregistrationv1.MutatingWebhookConfiguration); isM && ev.Type == watch.Modified {
				full := allBundles(obj, nil, ca)
				mBlanked = mBlanked || !full
				mFixed = mBlanked && full
			}
		case ev, ok := <-vw.ResultChan():
			if !ok {
				return 0, fmt.Errorf("validating watch closed")
			}
			if obj, isV := ev.Object.(*admissionregistrationv1.ValidatingWebhookConfiguration); isV && ev.Type == watch.Modified {
				full := allBundles(nil, obj, ca)
				vBlanked = vBlanked || !full
				vFixed = vBlanked && full
			}
		case <-timeout:
			return 0, fmt.Errorf("caBundle not repaired within 10s (mutating blanked %t fixed %t, validating blanked %t fixed %t)", mBlanked, mFixed, vBlanked, vFixed)
		}
	}
	return time.Since(start), nil
}

// allBundles reports whether every webhook of the given configurations has
// caBundle ca.
func allBundles(m *admissionregistrationv1.MutatingWebhookConfiguration, v *admissionregistrationv1.ValidatingWebhookConfiguration, ca []byte) bool {
	var bundles [][]byte
	if m != nil {
		for _, w := range m.Webhooks {
			bundles = append(bundles, w.ClientConfig.CABundle)
		}
	}
	if v != nil {
		for _, w := range v.Webhooks {
			bundles = append(bundles, w.ClientConfig.CABundle)
		}
	}
	for _, b := range bundles {
		if !bytes.Equal(b, ca) {
			return false
		}
	}
	return len(bundles) > 0
}
