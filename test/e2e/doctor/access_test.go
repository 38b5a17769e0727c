package doctor

import (
	"context"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kadmit/kadmit/internal/doctor"
	"github.com/kadmit/kadmit/test/e2e/e2eenv"
)

// readerWithout creates a ServiceAccount in ns with a ClusterRole that may
// read everything doctor reads except the given resources (by the real API
// server's RBAC), and returns a client impersonating it.
func readerWithout(t *testing.T, e *env, ns string, denied ...string) kubernetes.Interface {
	t.Helper()
	ctx := e2eenv.TestCtx(t, apiTimeout)
	name := "doctor-reader-" + suffix()
	if _, err := e.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ServiceAccount: %v", err)
	}
	skip := map[string]bool{}
	for _, d := range denied {
		skip[d] = true
	}
	read := []string{"get", "list"}
	var rules []rbacv1.PolicyRule
	for group, resources := range map[string][]string{
		"admissionregistration.k8s.io": {"mutatingwebhookconfigurations", "validatingwebhookconfigurations", "validatingadmissionpolicies",
			"validatingadmissionpolicybindings", "mutatingadmissionpolicies", "mutatingadmissionpolicybindings"},
		"":                 {"namespaces", "services", "pods", "configmaps"},
		"discovery.k8s.io": {"endpointslices"},
		"apps":             {"deployments", "replicasets", "statefulsets", "daemonsets"},
		"policy":           {"poddisruptionbudgets"},
	} {
		var allowed []string
		for _, r := range resources {
			if !skip[r] {
				allowed = append(allowed, r)
			}
		}
		if len(allowed) > 0 {
			rules = append(rules, rbacv1.PolicyRule{APIGroups: []string{group}, Resources: allowed, Verbs: read})
		}
	}
	rbac := e.Client.RbacV1()
	if _, err := rbac.ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ClusterRole: %v", err)
	}
	if _, err := rbac.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: name}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ClusterRoleBinding: %v", err)
	}
	t.Cleanup(func() {
		// t.Context() is done by now.
		ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
		defer cancel()
		_ = rbac.ClusterRoleBindings().Delete(ctx, name, metav1.DeleteOptions{})
		_ = rbac.ClusterRoles().Delete(ctx, name, metav1.DeleteOptions{})
	})
	cfg := rest.CopyConfig(e.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + ns + ":" + name,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The API server itself must refuse what the role leaves out.
	for _, d := range denied {
		if d == "replicasets" {
			if _, err := cs.AppsV1().ReplicaSets(ns).List(ctx, metav1.ListOptions{}); err == nil {
				t.Fatalf("%s may list replicasets: the RBAC setup is wrong", name)
			}
		}
	}
	return cs
}

// TestPartialAccessLeaderWorkerSetKueue is issue 15's report: in a
// LeaderWorkerSet/Kueue namespace, doctor run by a user who cannot read
// ReplicaSets raised KD301 for the healthy mjob.kb.io webhook, counting the
// Kueue pod (owned by an unreadable ReplicaSet) and the Kueue Deployment's
// template as two workloads. Now: no error for the Service that selects one
// Deployment's pods, KD001 naming what could not be read, and the real
// collision (lws-webhook-service selecting both controllers) still an
// error, proven by the Deployments doctor could read.
func TestPartialAccessLeaderWorkerSetKueue(t *testing.T) {
	e := world(t)
	sys := namespace(t, e, "lws-system", nil)
	work := namespace(t, e, "lws-work", nil)
	lwsLabels := map[string]string{"control-plane": "controller-manager", "app.kubernetes.io/name": "lws"}
	kueueLabels := map[string]string{"control-plane": "controller-manager", "app.kubernetes.io/name": "kueue"}
	lwsPods := workload(t, e, sys, "lws-controller-manager", lwsLabels, 1)
	kueuePods := workload(t, e, sys, "kueue-controller-manager", kueueLabels, 1)
	service(t, e, sys, "lws-webhook-service", map[string]string{"control-plane": "controller-manager"})
	service(t, e, sys, "kueue-webhook-service", kueueLabels)
	lwsIP, kueueIP := nextIP(t), nextIP(t)
	endpointSlice(t, e, sys, "lws-webhook-service", ep{IP: lwsIP, Pod: lwsPods[0], Ready: true}, ep{IP: kueueIP, Pod: kueuePods[0], Ready: true})
	endpointSlice(t, e, sys, "kueue-webhook-service", ep{IP: kueueIP, Pod: kueuePods[0], Ready: true})
	bundle := newCA(t).pem()
	jobs := rules("batch", "v1", "jobs")
	const kueueConfig, lwsConfig = "kueue-mutating-webhook-configuration", "lws-mutating-webhook-configuration"
	mutating(t, e, kueueConfig, hook{Name: "mjob.kb.io", Service: svcRef(sys, "kueue-webhook-service"), CABundle: bundle, Fail: true, Rules: jobs, NamespaceSelector: onlyNamespaces(work)})
	mutating(t, e, lwsConfig, hook{Name: "mleaderworkerset.kb.io", Service: svcRef(sys, "lws-webhook-service"), CABundle: bundle, Fail: true, Rules: jobs, NamespaceSelector: onlyNamespaces(work)})

	reader := readerWithout(t, e, sys, "replicasets")
	rep, err := doctor.Run(e2eenv.TestCtx(t, apiTimeout), reader, doctor.Options{Names: []string{kueueConfig, lwsConfig}, Dial: guardedDial})
	if err != nil {
		t.Fatalf("doctor as a user who cannot read ReplicaSets: %v", err)
	}
	mjob := hookReport(t, rep, kueueConfig, "mjob.kb.io")
	if mjob.Has(doctor.IDSelectorCollision) || mjob.Count(doctor.SeverityError) > 0 {
		t.Fatalf("mjob.kb.io selects one Deployment's pods, yet:\n%s", render(rep))
	}
	gap := need(t, rep, mjob, doctor.IDAccessGap, doctor.SeverityInfo)[0]
	contains(t, "KD001 what", gap.What, "list replicasets.apps in namespace "+sys, "forbidden")
	contains(t, "KD001 why", gap.Why, "pod-template-hash")
	lws := hookReport(t, rep, lwsConfig, "mleaderworkerset.kb.io")
	f := need(t, rep, lws, doctor.IDSelectorCollision, doctor.SeverityError)[0]
	contains(t, "KD301 what", f.What, "Deployment/lws-controller-manager", "Deployment/kueue-controller-manager")
	contains(t, "KD301 fix", f.Fix, `"app.kubernetes.io/name":"lws"`)

	// Without Deployments either, the collision rests on names alone: a
	// warning that says it cannot tell, and still no error anywhere.
	blind := readerWithout(t, e, sys, "replicasets", "deployments")
	rep, err = doctor.Run(e2eenv.TestCtx(t, apiTimeout), blind, doctor.Options{Names: []string{kueueConfig, lwsConfig}, Dial: guardedDial})
	if err != nil {
		t.Fatalf("doctor without ReplicaSets and Deployments: %v", err)
	}
	f = need(t, rep, hookReport(t, rep, lwsConfig, "mleaderworkerset.kb.io"), doctor.IDSelectorCollision, doctor.SeverityWarning)[0]
	contains(t, "KD301 what", f.What, "cannot tell for sure")
	if rep.Errors != 0 {
		t.Errorf("error-severity findings resting on objects doctor could not read:\n%s", render(rep))
	}

	// And the admin, who reads everything, gets the same verdicts without gaps.
	rep = runDoctor(t, e, doctor.Options{Names: []string{kueueConfig, lwsConfig}})
	if w := hookReport(t, rep, kueueConfig, "mjob.kb.io"); w.Has(doctor.IDSelectorCollision) || w.Has(doctor.IDAccessGap) {
		t.Errorf("admin view of mjob.kb.io:\n%s", render(rep))
	}
	need(t, rep, hookReport(t, rep, lwsConfig, "mleaderworkerset.kb.io"), doctor.IDSelectorCollision, doctor.SeverityError)
}

// TestReplicaSetsAbsent: the namespace was recreated from manifests, so
// the pods' ReplicaSets no longer exist (nothing is forbidden). The owner
// is inferred from pod-template-hash and confirmed by the Deployment.
func TestReplicaSetsAbsent(t *testing.T) {
	e := world(t)
	sys := namespace(t, e, "kueue-system", nil)
	kueueLabels := map[string]string{"control-plane": "controller-manager", "app.kubernetes.io/name": "kueue"}
	workload(t, e, sys, "kueue-controller-manager", kueueLabels, 2)
	ctx := e2eenv.TestCtx(t, apiTimeout)
	if err := e.Client.AppsV1().ReplicaSets(sys).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		t.Fatalf("delete ReplicaSets: %v", err)
	}
	service(t, e, sys, "kueue-webhook-service", kueueLabels)
	const config = "kueue-absent-rs"
	mutating(t, e, config, hook{Name: "mjob.kb.io", Service: svcRef(sys, "kueue-webhook-service"), CABundle: newCA(t).pem(), Fail: true,
		Rules: rules("batch", "v1", "jobs"), NamespaceSelector: onlyNamespaces("nowhere-" + suffix())})
	rep := runDoctor(t, e, doctor.Options{Names: []string{config}})
	w := hookReport(t, rep, config, "mjob.kb.io")
	if w.Has(doctor.IDSelectorCollision) || w.Has(doctor.IDAccessGap) {
		t.Fatalf("absent ReplicaSets:\n%s", render(rep))
	}
	if !strings.Contains(render(rep), "mjob.kb.io") {
		t.Fatal("no report")
	}
}

// rules is one rule for resource in group/version; ops default to CREATE.
func rules(group, version, resource string, ops ...admissionregistrationv1.OperationType) []admissionregistrationv1.RuleWithOperations {
	if len(ops) == 0 {
		ops = []admissionregistrationv1.OperationType{admissionregistrationv1.Create}
	}
	return []admissionregistrationv1.RuleWithOperations{{Operations: ops, Rule: admissionregistrationv1.Rule{APIGroups: []string{group}, APIVersions: []string{version}, Resources: []string{resource}}}}
}
