package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kadmit/kadmit/internal/certs"
	"github.com/kadmit/kadmit/test/controlplane/kadmitproc"
	"github.com/kadmit/kadmit/test/e2e/e2eenv"
	"github.com/kadmit/kadmit/test/poll"
)

// guardVAP is a declared policy on deployments (so it never decides the
// pods this test creates), its expression given.
func guardVAP(expr string) string {
	return `apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: guard-max-replicas}
spec:
  matchConstraints:
    resourceRules:
    - {apiGroups: [apps], apiVersions: [v1], operations: [CREATE], resources: [deployments]}
  validations:
  - expression: ` + expr + `
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: guard-max-replicas}
spec: {policyName: guard-max-replicas, validationActions: [Deny]}
`
}

const (
	guardGood   = "object.spec.replicas <= 5"
	guardBroken = "object.spec.replicas <= ("
)

// TestPoliciesConfigMapGuarded runs a second install (its own
// --webhook-config-name and namespace) with --policies-configmap:
//  1. the API server refuses an update of the policies ConfigMap whose
//     policy does not compile, through kadmit's kadmit-policies webhook,
//     with the compile error;
//  2. a replica started on a broken ConfigMap (written while no guard was
//     registered) stays up and ready, registers and serves the built-in
//     webhooks (0 of guardPods pod creates denied), and reports the
//     declaredPolicies condition on /readyz and in
//     kadmit_declared_policies_unserved;
//  3. a repairing edit loads the declared set without a restart.
func TestPoliciesConfigMapGuarded(t *testing.T) {
	const guardPods = 20
	e := world(t)
	ctx := e2eenv.TestCtx(t, 3*time.Minute)
	const name = "kadmit-guard"
	ns := fmt.Sprintf("kadmit-guard-%06d", rand.IntN(1_000_000))
	if _, err := e.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cms := e.Client.CoreV1().ConfigMaps(ns)
	if _, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "policies"}, Data: map[string]string{"p.yaml": guardVAP(guardGood)}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	b, err := certs.NewSelfSigned(certs.SelfSignedOptions{DNSNames: []string{"localhost"}})
	if err != nil {
		t.Fatal(err)
	}
	for file, data := range map[string][]byte{"tls.crt": b.ServerCert, "tls.key": b.ServerKey, "ca.crt": b.CACert} {
		if err := os.WriteFile(filepath.Join(dir, file), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	reg := e.Client.AdmissionregistrationV1()
	unregister := func() {
		bg := context.Background()
		_ = reg.MutatingWebhookConfigurations().Delete(bg, name, metav1.DeleteOptions{})
		_ = reg.ValidatingWebhookConfigurations().Delete(bg, name, metav1.DeleteOptions{})
	}
	// Cleanups run last-first: each replica stops before its
	// configurations are deleted, then the namespace goes.
	t.Cleanup(func() { _ = e.Client.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	t.Cleanup(unregister)
	start := func() (*kadmitproc.Process, string) {
		t.Helper()
		addr, metricsAddr, err := e2eenv.FreeAddrs()
		if err != nil {
			t.Fatal(err)
		}
		p, err := kadmitproc.Start(kadmitproc.Options{
			Binary: e.Binary, Addr: addr, MetricsAddr: metricsAddr,
			Args: []string{"serve", "--tls=files", "--cert-dir", dir, "--ca-bundle-file", filepath.Join(dir, "ca.crt"),
				"--register", "--webhook-config-name", name, "--webhook-url", "https://localhost:" + strings.Split(addr, ":")[1],
				"--policies-configmap", ns + "/policies",
				"--kubeconfig", e.Kubeconfig, "--addr", addr, "--metrics-addr", metricsAddr, "--log-format", "json",
				// Every allowed decision logged: the test counts the
				// reviews a replica answered from its decision lines.
				"--log-allowed-sample=1"},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _, _ = p.Terminate(10 * time.Second) })
		if err := p.WaitReady(ctx); err != nil {
			t.Fatalf("%v\n%s", err, p.Tail(20))
		}
		return p, metricsAddr
	}
	// guarded waits until the API server calls the guard: a dry-run
	// update with a broken policy is denied by kadmit-policies.kadmit.io.
	update := func(data string, dry bool) error {
		cm, err := cms.Get(ctx, "policies", metav1.GetOptions{})
		if err != nil {
			return poll.Stop(err)
		}
		cm.Data = map[string]string{"p.yaml": data}
		var opts metav1.UpdateOptions
		if dry {
			opts.DryRun = []string{metav1.DryRunAll}
		}
		_, err = cms.Update(ctx, cm, opts)
		return err
	}
	guarded := func(p *kadmitproc.Process) error {
		return poll.Until(ctx, 30*time.Second, func(context.Context) error {
			err := update(guardVAP(guardBroken), true)
			if err == nil {
				return errors.New("a policy that does not compile was accepted")
			}
			if !strings.Contains(err.Error(), `"kadmit-policies.kadmit.io" denied the request`) {
				return err
			}
			return poll.Stop(err)
		})
	}

	// 1. The guard refuses, with the compile error.
	p1, _ := start()
	err = guarded(p1)
	msg := err.Error()
	if !strings.Contains(msg, `"kadmit-policies.kadmit.io" denied the request`) {
		t.Fatalf("the guard did not answer: %v\n%s", err, p1.Tail(20))
	}
	for _, want := range []string{"ConfigMap " + ns + "/policies data[p.yaml]", "guard-max-replicas", "compil"} {
		if !strings.Contains(msg, want) {
			t.Errorf("refusal %q does not carry %q", msg, want)
		}
	}
	t.Logf("refused by the API server: %s", msg)
	if err := update(guardVAP(guardBroken), false); err == nil {
		t.Fatal("a real update with a policy that does not compile was stored")
	}

	// 2. Broken at start: write it with no guard registered.
	if _, _, err := p1.Terminate(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	unregister()
	if err := poll.Until(ctx, 30*time.Second, func(context.Context) error { return update(guardVAP(guardBroken), false) }); err != nil {
		t.Fatalf("writing the broken ConfigMap without the guard: %v", err)
	}
	p2, metricsAddr := start()
	if err := p2.WaitEffective(ctx, e.Client, ns); err != nil {
		t.Fatalf("built-in webhooks not in effect on a replica started with a broken set: %v\n%s", err, p2.Tail(20))
	}
	ready, metrics := scrape(ctx, t, metricsAddr, "/readyz"), scrape(ctx, t, metricsAddr, "/metrics")
	if !strings.HasPrefix(ready, "ok\ndegraded: declaredPolicies: ") || !strings.Contains(ready, "compil") {
		t.Fatalf("/readyz = %q, want ok with the declaredPolicies condition and the compile error", ready)
	}
	t.Logf("/readyz: %s", strings.TrimSpace(ready))
	if !strings.Contains(metrics, "\nkadmit_declared_policies_unserved 1\n") {
		t.Fatal("kadmit_declared_policies_unserved is not 1")
	}
	before := len(p2.Decisions())
	denied := 0
	for i := range guardPods {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("guard-%d", i)},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "pause", Image: "registry.k8s.io/pause:3.10"}}}}
		if _, err := e.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
			denied++
			t.Logf("pod %d: %v", i, err)
		}
	}
	// Decision lines reach the log through kadmit's buffered writer
	// (flushed every 100 ms): wait for them, bounded.
	answered := 0
	_ = poll.Until(ctx, 5*time.Second, func(context.Context) error {
		if answered = len(p2.Decisions()) - before; answered < guardPods {
			return fmt.Errorf("%d reviews logged", answered)
		}
		return nil
	})
	t.Logf("%d pod creates through the API server: %d denied; this replica answered %d reviews", guardPods, denied, answered)
	if denied != 0 || answered < guardPods {
		t.Fatalf("%d of %d pods denied, %d reviews answered by the replica with a broken set", denied, guardPods, answered)
	}
	select {
	case <-p2.Exited():
		t.Fatalf("the replica exited\n%s", p2.Tail(20))
	default:
	}

	// 3. A repairing edit (the guard, served by this replica, lets it
	// through) loads the declared set without a restart.
	if err := update(guardVAP(guardGood), false); err != nil {
		t.Fatalf("repairing edit refused: %v", err)
	}
	if err := poll.Until(ctx, 10*time.Second, func(ctx context.Context) error {
		if r := scrape(ctx, t, metricsAddr, "/readyz"); r != "ok\n" {
			return fmt.Errorf("/readyz %q", r)
		}
		if !strings.Contains(scrape(ctx, t, metricsAddr, "/metrics"), "\nkadmit_declared_policies_unserved 0\n") {
			return errors.New("kadmit_declared_policies_unserved is not 0")
		}
		return nil
	}); err != nil {
		t.Fatalf("after the repair: %v\n%s", err, p2.Tail(20))
	}
}

// scrape GETs path on the metrics listener and returns the body.
func scrape(ctx context.Context, t *testing.T, metricsAddr, path string) string {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+metricsAddr+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	return string(b)
}
