package celdiff

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kadmit/kadmit/test/controlplane/kadmitproc"
)

// TestServed runs `kadmit serve --policies` registered with the API server
// (no in-tree policies): a declared VAP denies through kadmit's webhook
// with the in-tree message, and a declared MAP's patch is applied (and
// defaulted) by the API server. It runs after TestCorpus.
func TestServed(t *testing.T) {
	requireWorld(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	root, err := kadmitproc.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	// A copy kadmit follows live, edited below.
	policyDir := filepath.Join(tmp, "policies")
	if err := os.Mkdir(policyDir, 0o755); err != nil {
		t.Fatal(err)
	}
	basic, err := os.ReadFile(filepath.Join(root, "examples", "cel", "docs-basic", "policy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(policyDir, "basic.yaml"), basic, 0o644); err != nil {
		t.Fatal(err)
	}
	serveKadmit(ctx, t,
		"--policies", policyDir,
		"--policies", filepath.Join(root, "examples", "cel", "docs-map-jsonpatch", "policy.yaml"))
	cs := world.cp.Client
	// The MutatingAdmissionPolicy's reinvocationPolicy: IfNeeded reached
	// the webhook kadmit registered for /mutate-policies.
	mwc, err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "kadmit", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, w := range mwc.Webhooks {
		if w.ClientConfig.URL == nil || !strings.HasSuffix(*w.ClientConfig.URL, "/mutate-policies") {
			continue
		}
		found = true
		if w.ReinvocationPolicy == nil || *w.ReinvocationPolicy != admissionregistrationv1.IfNeededReinvocationPolicy {
			t.Errorf("webhook %s: reinvocationPolicy %v, want IfNeeded", w.Name, w.ReinvocationPolicy)
		}
	}
	if !found {
		t.Errorf("no webhook on /mutate-policies: %+v", mwc.Webhooks)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "cel-served", Labels: map[string]string{"environment": "test"}}}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}

	dep := deploymentObject("web", "cel-served", 6)
	want := `admission webhook "vap-demo-policy.example.com.kadmit.io" denied the request: ValidatingAdmissionPolicy 'demo-policy.example.com' with binding 'demo-binding-test.example.com' denied request: failed expression: object.spec.replicas <= 5`
	waitFor(ctx, t, "kadmit's webhook in effect", func() bool {
		_, err := cs.AppsV1().Deployments("cel-served").Create(ctx, dep, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil && strings.Contains(err.Error(), want) {
			if se, ok := err.(apierrors.APIStatus); !ok || se.Status().Code != 422 {
				t.Fatalf("code: %v", err)
			}
			return true
		}
		t.Logf("deployment: %v", err)
		return false
	})

	// An edit of the policy files is swapped in live; an invalid one is
	// refused and the running policies kept.
	if err := os.WriteFile(filepath.Join(policyDir, "broken.yaml"), []byte("kind: ValidatingAdmissionPolicyBinding\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	relaxed := strings.Replace(string(basic), "object.spec.replicas <= 5", "object.spec.replicas <= 7", 1)
	if err := os.WriteFile(filepath.Join(policyDir, "basic.yaml"), []byte(relaxed), 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	if _, err := cs.AppsV1().Deployments("cel-served").Create(ctx, dep, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("after an invalid edit: %v, want the running policy's denial", err)
	}
	if err := os.Remove(filepath.Join(policyDir, "broken.yaml")); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, "the edited policy in effect", func() bool {
		_, err := cs.AppsV1().Deployments("cel-served").Create(ctx, dep, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil
	})

	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "cel-served"}, Spec: corev1.PodSpec{
		InitContainers: []corev1.Container{{Name: "init", Image: "busybox"}},
		Containers:     []corev1.Container{{Name: "c", Image: "nginx"}},
	}}
	got, err := cs.CoreV1().Pods("cel-served").Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		t.Fatal(err)
	}
	ic := got.Spec.InitContainers
	if len(ic) != 2 || ic[1].Name != "mesh-proxy" || ic[1].Image != "mesh-proxy/v1.0.0" || ic[1].RestartPolicy == nil || *ic[1].RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Fatalf("init containers: %+v", ic)
	}
	// The API server defaulted what the patch added.
	if ic[1].TerminationMessagePath == "" || ic[1].ImagePullPolicy == "" {
		t.Errorf("the added init container was not defaulted: %+v", ic[1])
	}
}

func deploymentObject(name, ns string, replicas int32) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "nginx"}}},
			},
		},
	}
}

// serveKadmit builds kadmit, starts `kadmit serve` registered with the test's
// API server with extraArgs (its policy sources), waits until it is ready and
// registered, and stops it at the end of the test, removing the
// configurations it wrote (its webhooks fail closed).
func serveKadmit(ctx context.Context, t *testing.T, extraArgs ...string) *kadmitproc.Process {
	t.Helper()
	root, err := kadmitproc.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	bin := filepath.Join(tmp, "kadmit")
	if err := kadmitproc.Build(ctx, root, bin); err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(tmp, "kubeconfig")
	if err := world.cp.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	addr, metricsAddr, err := kadmitproc.FreeAddrs()
	if err != nil {
		t.Fatal(err)
	}
	logFile, err := os.Create(filepath.Join(tmp, "kadmit.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = logFile.Close() })
	p, err := kadmitproc.Start(kadmitproc.Options{
		Binary: bin, Addr: addr, MetricsAddr: metricsAddr, CAFile: filepath.Join(tmp, "ca.crt"), Kubeconfig: kubeconfig, Log: logFile,
		ExtraArgs: extraArgs,
	})
	if err != nil {
		t.Fatal(err)
	}
	cs := world.cp.Client
	t.Cleanup(func() {
		_, _, _ = p.Terminate(30 * time.Second)
		_ = cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(context.Background(), "kadmit", metav1.DeleteOptions{})
		_ = cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(context.Background(), "kadmit", metav1.DeleteOptions{})
		if t.Failed() {
			t.Logf("kadmit log:\n%s", p.Tail(40))
		}
	})
	if err := p.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if _, _, err := p.WaitRegistered(ctx, cs); err != nil {
		t.Fatal(err)
	}
	return p
}
