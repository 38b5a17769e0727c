package celdiff

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kadmit/kadmit/test/controlplane/kadmitproc"
)

// TestServedFromConfigMap runs `kadmit serve --policies-configmap`
// registered with the API server: the policy in the ConfigMap denies
// through kadmit's webhook; an invalid edit of the ConfigMap is refused
// (the running policy still decides); a valid edit is swapped in live.
func TestServedFromConfigMap(t *testing.T) {
	requireWorld(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	root, err := kadmitproc.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	basic, err := os.ReadFile(filepath.Join(root, "examples", "cel", "docs-basic", "policy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cs := world.cp.Client
	const ns = "cel-configmap"
	for _, n := range []*corev1.Namespace{
		{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"environment": "test"}}},
	} {
		if _, err := cs.CoreV1().Namespaces().Create(ctx, n, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	// The ConfigMap lives in kube-system: kadmit's webhooks never
	// intercept it, so an edit can always be written.
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "kadmit-celdiff-policies"},
		Data: map[string]string{"basic.yaml": string(basic)}}
	if _, err := cs.CoreV1().ConfigMaps("kube-system").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cs.CoreV1().ConfigMaps("kube-system").Delete(context.Background(), cm.Name, metav1.DeleteOptions{})
	}()

	p := serveKadmit(ctx, t, "--policies-configmap", "kube-system/"+cm.Name)

	dep := deploymentObject("web", ns, 6)
	create := func() error {
		_, err := cs.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	want := `admission webhook "vap-demo-policy.example.com.kadmit.io" denied the request: ValidatingAdmissionPolicy 'demo-policy.example.com' with binding 'demo-binding-test.example.com' denied request: failed expression: object.spec.replicas <= 5`
	waitFor(ctx, t, "the ConfigMap's policy in effect", func() bool {
		err := create()
		t.Logf("deployment: %v", err)
		return err != nil && strings.Contains(err.Error(), want)
	})

	edit := func(data map[string]string) {
		t.Helper()
		cur, err := cs.CoreV1().ConfigMaps("kube-system").Get(ctx, cm.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cur.Data = data
		if _, err := cs.CoreV1().ConfigMaps("kube-system").Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	refusals := func() int {
		n := 0
		for _, l := range p.Logs() {
			if strings.Contains(l, "declared policies not applied") {
				n++
			}
		}
		return n
	}

	// An invalid edit (a relaxed policy next to a binding to a policy
	// that does not exist) is refused: the running policy still denies.
	relaxed := strings.Replace(string(basic), "object.spec.replicas <= 5", "object.spec.replicas <= 7", 1)
	before := refusals()
	edit(map[string]string{"basic.yaml": relaxed, "broken.yaml": "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicyBinding\nmetadata: {name: broken}\nspec: {policyName: none, validationActions: [Deny]}\n"})
	waitFor(ctx, t, "the invalid edit refused", func() bool { return refusals() > before })
	if err := create(); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("after an invalid edit: %v, want the running policy's denial", err)
	}

	// A valid edit is swapped in.
	edit(map[string]string{"basic.yaml": relaxed})
	waitFor(ctx, t, "the edited policy in effect", func() bool { return create() == nil })
}
