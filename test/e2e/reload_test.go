package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kadmit/kadmit/test/controlplane/kadmitproc"
	"github.com/kadmit/kadmit/test/e2e/e2eenv"
	"github.com/kadmit/kadmit/test/poll"
)

const reloadConfig = `apiVersion: kadmit.io/v1alpha1
kind: Configuration
policies:
  podName: {enabled: true, words: [%s]}
`

// TestConfigMapReloadsLive runs a kadmit that reads its configuration from a
// ConfigMap and checks that a valid edit changes its decisions without a
// restart, while an invalid edit is refused and the running policies stay.
func TestConfigMapReloadsLive(t *testing.T) {
	e := world(t)
	ctx := e2eenv.TestCtx(t, 2*time.Minute)
	cms := e.Client.CoreV1().ConfigMaps(e.namespace)
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "kadmit-reload"},
		Data:       map[string]string{"config.yaml": fmt.Sprintf(reloadConfig, "offensive")},
	}
	if _, err := cms.Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cms.Delete(context.WithoutCancel(ctx), cm.Name, metav1.DeleteOptions{}) })

	addr, metricsAddr, err := e2eenv.FreeAddrs()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	kubeconfig, caFile := filepath.Join(dir, "kubeconfig"), filepath.Join(dir, "ca.crt")
	if err := e.CP.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	p, err := kadmitproc.Start(kadmitproc.Options{
		Binary: e.Binary, Addr: addr, MetricsAddr: metricsAddr, CAFile: caFile,
		ExtraArgs: []string{"--config-map", e.namespace + "/" + cm.Name, "--kubeconfig", kubeconfig},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _, _ = p.Terminate(10 * time.Second) })
	if err := p.WaitReady(ctx); err != nil {
		t.Fatalf("%v\n%s", err, p.Tail(20))
	}
	review := reviewClient(t, caFile, "https://"+addr+"/validate-pod")

	if allowed, msg := review(ctx, "forbidden-pod"); !allowed {
		t.Fatalf("forbidden-pod denied before the edit: %s", msg)
	}
	if allowed, _ := review(ctx, "offensive-pod"); allowed {
		t.Fatal("offensive-pod allowed with words [offensive]")
	}

	setConfig(ctx, t, e, cm.Name, fmt.Sprintf(reloadConfig, "forbidden"))
	if err := poll.Until(ctx, 10*time.Second, func(ctx context.Context) error {
		if allowed, msg := review(ctx, "forbidden-pod"); allowed || msg != `pod name contains "forbidden"` {
			return fmt.Errorf("forbidden-pod: allowed %v, message %q", allowed, msg)
		}
		return nil
	}); err != nil {
		t.Fatalf("words [forbidden] not applied after the ConfigMap edit: %v\n%s", err, p.Tail(20))
	}
	if allowed, msg := review(ctx, "offensive-pod"); !allowed {
		t.Fatalf("offensive-pod still denied after words became [forbidden]: %s", msg)
	}

	// An edit that does not validate is refused; the running policies stay.
	setConfig(ctx, t, e, cm.Name, "apiVersion: kadmit.io/v1alpha1\nkind: Configuration\npolicies:\n  lifespan: {max: -1}\n")
	if err := poll.Until(ctx, 10*time.Second, func(context.Context) error {
		if !strings.Contains(strings.Join(p.Logs(), "\n"), "configuration not applied") {
			return errors.New(`no "configuration not applied" in kadmit's log`)
		}
		return nil
	}); err != nil {
		t.Fatalf("the invalid edit was not reported: %v\n%s", err, p.Tail(20))
	}
	if allowed, _ := review(ctx, "forbidden-pod"); allowed {
		t.Fatal("an invalid edit took the running pod-name policy away")
	}
	logs := strings.Join(p.Logs(), "\n")
	if !strings.Contains(logs, "policies.lifespan.max") {
		t.Fatalf("the refusal does not name the field:\n%s", p.Tail(5))
	}
}

func setConfig(ctx context.Context, t *testing.T, e *env, name, data string) {
	t.Helper()
	cms := e.Client.CoreV1().ConfigMaps(e.namespace)
	cm, err := cms.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data["config.yaml"] = data
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// reviewClient returns a function that sends kadmit a pod CREATE review,
// as the API server would, and reports the decision.
func reviewClient(t *testing.T, caFile, url string) func(context.Context, string) (bool, string) {
	t.Helper()
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: caPool(t, caFile)}}}
	t.Cleanup(hc.CloseIdleConnections)
	return func(ctx context.Context, podName string) (bool, string) {
		body := fmt.Sprintf(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u-%d",
			"kind":{"group":"","version":"v1","kind":"Pod"},"resource":{"group":"","version":"v1","resource":"pods"},
			"namespace":"default","name":%q,"operation":"CREATE","userInfo":{},
			"object":{"apiVersion":"v1","kind":"Pod","metadata":{"name":%q}}}}`, time.Now().UnixNano(), podName, podName)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewBufferString(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("POST %s: %v", url, err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		var out struct {
			Response struct {
				Allowed bool `json:"allowed"`
				Status  struct {
					Message string `json:"message"`
				} `json:"status"`
			} `json:"response"`
		}
		if resp.StatusCode != http.StatusOK || json.Unmarshal(raw, &out) != nil {
			t.Fatalf("POST %s: %d %s", url, resp.StatusCode, raw)
		}
		return out.Response.Allowed, out.Response.Status.Message
	}
}
