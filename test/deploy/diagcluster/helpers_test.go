package diagcluster

// Unit tests of the harness's own logic (no cluster needed; they run in
// the re-executed test binary like the rest).

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kadmit/kadmit/pkg/webhookcerts"
)

// TestManifestOfLeavesTheInjectedStateOut: Argo's manifest of a
// configuration holds no caBundle and no generation annotation, keeps the
// rest (cert-manager's annotation included) and no server-set metadata.
func TestManifestOfLeavesTheInjectedStateOut(t *testing.T) {
	cfg := lwsConfig()
	cfg.Webhooks[0].ClientConfig.CABundle = []byte("ca")
	cfg.Annotations[webhookcerts.GenerationAnnotation] = "7"
	cfg.ResourceVersion, cfg.UID = "42", "u"
	cfg.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "x"}}
	m, err := manifestOf(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if m.kind != "ValidatingWebhookConfiguration" || m.name != lwsVCfg {
		t.Errorf("kind %s name %s", m.kind, m.name)
	}
	body := string(m.body)
	for _, gone := range []string{"caBundle", webhookcerts.GenerationAnnotation, "resourceVersion", "uid", "managedFields", "creationTimestamp"} {
		if strings.Contains(body, gone) {
			t.Errorf("manifest holds %s: %s", gone, body)
		}
	}
	var back admissionregistrationv1.ValidatingWebhookConfiguration
	if err := json.Unmarshal(m.body, &back); err != nil {
		t.Fatal(err)
	}
	if back.Annotations["cert-manager.io/inject-ca-from"] != lwsNS+"/"+lwsCert || back.Webhooks[0].Name != cfg.Webhooks[0].Name {
		t.Errorf("manifest lost what Git holds: %s", body)
	}
}

func TestArgs(t *testing.T) {
	args := []string{"--cert-dir=/certs", "--port=9443", "--health-port=8081"}
	got := setArg(args, "--port=9444", "--port=")
	if !slices.Contains(got, "--port=9444") || slices.Contains(got, "--port=9443") || !slices.Contains(got, "--health-port=8081") {
		t.Errorf("setArg: %v", got)
	}
	if got := dropArg(setArg(args, "--stall", "--stall"), "--stall"); !slices.Equal(got, args) {
		t.Errorf("setArg then dropArg: %v", got)
	}
}

func TestCABundleOwners(t *testing.T) {
	mf := []metav1.ManagedFieldsEntry{
		{Manager: "argocd-controller", FieldsV1: &metav1.FieldsV1{}},
		{Manager: "cert-manager-cainjector", FieldsV1: &metav1.FieldsV1{}},
	}
	mf[0].FieldsV1.SetRawString(`{"f:webhooks":{"k:{\"name\":\"w\"}":{"f:rules":{}}}}`)
	mf[1].FieldsV1.SetRawString(`{"f:webhooks":{"k:{\"name\":\"w\"}":{"f:clientConfig":{"f:caBundle":{}}}}}`)
	if got := caBundleOwners(mf); got["argocd-controller"] || !got["cert-manager-cainjector"] {
		t.Errorf("owners %v", got)
	}
}

// TestLoopBounds: a loop runs at most its bound, counts what its function
// reports, keeps the first error, and stop ends it.
func TestLoopBounds(t *testing.T) {
	calls := 0
	l := startLoopN(t, "bounded", time.Millisecond, 3, func(context.Context) (int, error) {
		calls++
		if calls == 2 {
			return 0, errors.New("second")
		}
		return 1, nil
	})
	select {
	case <-l.done:
	case <-time.After(5 * time.Second):
		t.Fatal("a loop bounded to 3 runs still runs after 5s")
	}
	if l.runs.Load() != 3 || l.writes.Load() != 2 || l.errs.Load() != 1 || l.firstErr() == nil {
		t.Errorf("%s; want 3 runs, 2 writes, 1 error", l)
	}
	endless := startLoopN(t, "stopped", time.Millisecond, maxLoopRuns, func(context.Context) (int, error) { return 0, nil })
	endless.stop()
	select {
	case <-endless.done:
	default:
		t.Error("stop returned with the loop running")
	}
}
