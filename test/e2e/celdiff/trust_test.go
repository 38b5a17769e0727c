package celdiff

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kadmit/kadmit/test/controlplane/kadmitproc"
)

// escalation is the red-team edit of issue 20 (point 6): a user who may
// only update the policies ConfigMap adds a MutatingAdmissionPolicy on
// clusterrolebindings that puts them into every new binding.
const escalation = `apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicy
metadata: {name: escalate}
spec:
  reinvocationPolicy: Never
  matchConstraints:
    resourceRules:
    - apiGroups: ["rbac.authorization.k8s.io"]
      apiVersions: ["v1"]
      operations: ["CREATE"]
      resources: ["clusterrolebindings"]
  mutations:
  - patchType: JSONPatch
    jsonPatch:
      expression: '[JSONPatch{op: "add", path: "/subjects/-", value: {"kind": "User", "name": "mallory", "apiGroup": "rbac.authorization.k8s.io"}}]'
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicyBinding
metadata: {name: escalate}
spec:
  policyName: escalate
`

// TestConfigMapCannotReachRBAC: with kadmit serving a policies ConfigMap,
// an edit adding the escalation is refused (kadmit logs why, keeps the
// running policy, registers nothing on clusterrolebindings), and the
// administrator's next cluster-admin binding is stored as written. The
// same ConfigMap with --policies-allow-sensitive-groups shows the attack
// the default stops: mallory is added to the binding.
func TestConfigMapCannotReachRBAC(t *testing.T) {
	requireWorld(t)
	root, err := kadmitproc.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	basic, err := os.ReadFile(filepath.Join(root, "examples", "cel", "docs-basic", "policy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cs := world.cp.Client
	const ns = "cel-trust"
	if _, err := cs.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"environment": "test"}}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	dep := deploymentObject("web", ns, 6)
	denied := `ValidatingAdmissionPolicy 'demo-policy.example.com' with binding 'demo-binding-test.example.com' denied request`
	basicDenies := func(ctx context.Context) bool {
		_, err := cs.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil && strings.Contains(err.Error(), denied)
	}
	// bind creates a cluster-admin binding for admin, as an administrator
	// would, and returns the subjects the API server stored.
	bind := func(ctx context.Context, t *testing.T, name string) []rbacv1.Subject {
		t.Helper()
		crb := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "cluster-admin"},
			Subjects: []rbacv1.Subject{{Kind: "User", Name: "admin", APIGroup: "rbac.authorization.k8s.io"}}}
		got, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create ClusterRoleBinding: %v", err)
		}
		if err := cs.RbacV1().ClusterRoleBindings().Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("delete ClusterRoleBinding: %v", err)
		}
		return got.Subjects
	}
	hasMallory := func(subjects []rbacv1.Subject) bool {
		return slices.ContainsFunc(subjects, func(s rbacv1.Subject) bool { return s.Name == "mallory" })
	}
	newConfigMap := func(ctx context.Context, t *testing.T, name string, data map[string]string) {
		t.Helper()
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: name}, Data: data}
		if _, err := cs.CoreV1().ConfigMaps("kube-system").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cs.CoreV1().ConfigMaps("kube-system").Delete(context.Background(), name, metav1.DeleteOptions{})
		})
	}

	t.Run("refused by default", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		const name = "kadmit-trust-policies"
		newConfigMap(ctx, t, name, map[string]string{"basic.yaml": string(basic)})
		p := serveKadmit(ctx, t, "--policies-configmap", "kube-system/"+name)
		waitFor(ctx, t, "the ConfigMap's policy in effect", func() bool { return basicDenies(ctx) })

		cur, err := cs.CoreV1().ConfigMaps("kube-system").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cur.Data["escalate.yaml"] = escalation
		if _, err := cs.CoreV1().ConfigMaps("kube-system").Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		const why = `MutatingAdmissionPolicy escalate: spec.matchConstraints.resourceRules[0].apiGroups: \"rbac.authorization.k8s.io\": declared policies may not match`
		waitFor(ctx, t, "the escalation refused", func() bool {
			for _, l := range p.Logs() {
				if strings.Contains(l, "declared policies not applied") && strings.Contains(l, why) {
					return true
				}
			}
			return false
		})
		if !basicDenies(ctx) {
			t.Error("the running policy no longer denies after the refused edit")
		}
		mwc, err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "kadmit", metav1.GetOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		if mwc != nil {
			for _, w := range mwc.Webhooks {
				for _, r := range w.Rules {
					if slices.Contains(r.APIGroups, "rbac.authorization.k8s.io") || slices.Contains(r.APIGroups, "*") {
						t.Errorf("kadmit registered webhook %s on %v", w.Name, r)
					}
				}
			}
		}
		if subjects := bind(ctx, t, "kadmit-trust-admin"); len(subjects) != 1 || hasMallory(subjects) {
			t.Errorf("the administrator's binding was changed: subjects %+v", subjects)
		}
	})

	// The control: the test can see the attack when it is let through.
	t.Run("let through by the flag", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		const name = "kadmit-trust-policies-allowed"
		newConfigMap(ctx, t, name, map[string]string{"basic.yaml": string(basic), "escalate.yaml": escalation})
		serveKadmit(ctx, t, "--policies-configmap", "kube-system/"+name, "--policies-allow-sensitive-groups")
		waitFor(ctx, t, "the escalation in effect", func() bool {
			return hasMallory(bind(ctx, t, "kadmit-trust-admin-allowed"))
		})
	})
}
