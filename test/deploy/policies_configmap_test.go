package deploy

import (
	"maps"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/kadmit/kadmit/test/deploy/chart"
	"github.com/kadmit/kadmit/test/deploy/internal/audit"
)

// policies.configMap passes --policies-configmap RELEASE-NAMESPACE/NAME
// and grants get, list and watch on that one ConfigMap, plus the
// namespaces read declared policies' namespaceSelector needs.
func TestRBACPoliciesConfigMap(t *testing.T) {
	plain := map[string]any{"tls": map[string]any{"mode": "files"}, "register": false, "metrics": map[string]any{"secure": false}}
	if gs := grantsOf(t, render(t, "kadmit", chart.Namespace, plain)); len(gs) != 0 {
		t.Fatalf("baseline grants %v", gs)
	}
	vals := map[string]any{"tls": map[string]any{"mode": "files"}, "register": false, "metrics": map[string]any{"secure": false},
		"policies": map[string]any{"configMap": "my-policies"}}
	r := render(t, "kadmit", chart.Namespace, vals)
	gs := grantsOf(t, r)
	want := []string{
		"get core/configmaps name=my-policies",
		"list core/configmaps name=my-policies",
		"list core/namespaces",
		"watch core/configmaps name=my-policies",
		"watch core/namespaces",
	}
	var got []string
	for _, g := range gs {
		// Namespaced grants name their namespace; compare without it.
		got = append(got, strings.Replace(g, " in "+chart.Namespace, "", 1))
	}
	if !slices.Equal(got, want) {
		t.Errorf("grants\n%s\nwant\n%s", strings.Join(gs, "\n"), strings.Join(want, "\n"))
	}
	var dep appsv1.Deployment
	toTyped(t, mustFind(t, r, "Deployment", "kadmit"), &dep)
	if args := dep.Spec.Template.Spec.Containers[0].Args; !slices.Contains(args, "--policies-configmap="+chart.Namespace+"/my-policies") {
		t.Errorf("args %v", args)
	}
}

// The policies ConfigMap is a trust root (docs/security.md): the chart
// renders the Role RELEASE-policies-writers granting get, update and patch
// on exactly that ConfigMap, binds it to policies.writers only (none by
// default), never grants kadmit's ServiceAccount or any other chart role
// write on ConfigMaps, and passes --policies-allow-sensitive-groups only
// when policies.allowSensitiveGroups is set.
func TestRBACPoliciesConfigMapWriters(t *testing.T) {
	base := map[string]any{"tls": map[string]any{"mode": "files"}, "register": false, "metrics": map[string]any{"secure": false}}
	with := func(policies map[string]any) map[string]any {
		v := maps.Clone(base)
		v["policies"] = policies
		return v
	}
	writeVerbs := []string{"create", "update", "patch", "delete", "deletecollection", "*"}

	// Without writers: the Role exists, unbound; nobody the chart binds can
	// write a ConfigMap.
	r := render(t, "kadmit", chart.Namespace, with(map[string]any{"configMap": "my-policies"}))
	role := mustFind(t, r, "Role", "kadmit-policies-writers")
	gs, err := audit.Grants(role)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, g := range gs {
		got = append(got, g.String())
	}
	want := []string{
		"get core/configmaps name=my-policies (Role/kadmit-policies-writers)",
		"update core/configmaps name=my-policies (Role/kadmit-policies-writers)",
		"patch core/configmaps name=my-policies (Role/kadmit-policies-writers)",
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) || role.GetNamespace() != chart.Namespace {
		t.Errorf("writers Role in %q grants\n%s\nwant\n%s", role.GetNamespace(), strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if b := r.Find("RoleBinding", "kadmit-policies-writers"); b != nil {
		t.Errorf("writers RoleBinding rendered without policies.writers: %v", b.Object)
	}
	allRoles, err := audit.Grants(rolesOf(r)...)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range allRoles {
		if g.Resource == "configmaps" && slices.Contains(writeVerbs, g.Verb) && g.Role != "Role/kadmit-policies-writers" {
			t.Errorf("chart grants ConfigMap write outside the writers Role: %s", g)
		}
	}
	for _, g := range grantsOf(t, r) {
		if strings.Contains(g, "configmaps") && !strings.HasPrefix(g, "get ") && !strings.HasPrefix(g, "list ") && !strings.HasPrefix(g, "watch ") {
			t.Errorf("kadmit's ServiceAccount may write ConfigMaps: %s", g)
		}
	}
	var dep appsv1.Deployment
	toTyped(t, mustFind(t, r, "Deployment", "kadmit"), &dep)
	if args := dep.Spec.Template.Spec.Containers[0].Args; slices.Contains(args, "--policies-allow-sensitive-groups") {
		t.Errorf("--policies-allow-sensitive-groups passed by default: %v", args)
	}

	// With writers: exactly those subjects get exactly that Role.
	writers := []any{
		map[string]any{"kind": "Group", "name": "platform-admins", "apiGroup": "rbac.authorization.k8s.io"},
		map[string]any{"kind": "User", "name": "alice", "apiGroup": "rbac.authorization.k8s.io"},
	}
	r = render(t, "kadmit", chart.Namespace, with(map[string]any{"configMap": "my-policies", "writers": writers, "allowSensitiveGroups": true}))
	b := mustFind(t, r, "RoleBinding", "kadmit-policies-writers")
	subjects, _, _ := unstructured.NestedSlice(b.Object, "subjects")
	if len(subjects) != 2 || b.GetNamespace() != chart.Namespace {
		t.Fatalf("writers RoleBinding in %q binds %v", b.GetNamespace(), subjects)
	}
	for _, user := range []string{"group:platform-admins", "alice"} {
		gs, err := audit.BoundGrants(user, r.Objects...)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, g := range gs {
			got = append(got, strings.Replace(g.String(), " in "+chart.Namespace, "", 1)+" ns="+g.Namespace)
		}
		slices.Sort(got)
		want := []string{
			"get core/configmaps name=my-policies (Role/kadmit-policies-writers) ns=" + chart.Namespace,
			"patch core/configmaps name=my-policies (Role/kadmit-policies-writers) ns=" + chart.Namespace,
			"update core/configmaps name=my-policies (Role/kadmit-policies-writers) ns=" + chart.Namespace,
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s is granted\n%s\nwant\n%s", user, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	}
	// The only binding problem is the one the value asks for: subjects
	// that are not the chart's ServiceAccounts, on the writers binding.
	for _, p := range audit.CheckBindings(r.Objects, unboundRoles(r)) {
		if !strings.HasPrefix(p, "RoleBinding/kadmit-policies-writers binds ") {
			t.Errorf("chart RBAC: %s", p)
		}
	}
	toTyped(t, mustFind(t, r, "Deployment", "kadmit"), &dep)
	if args := dep.Spec.Template.Spec.Containers[0].Args; !slices.Contains(args, "--policies-allow-sensitive-groups") {
		t.Errorf("policies.allowSensitiveGroups: args %v", args)
	}
}

func rolesOf(r *chart.Rendered) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range append(append([]*unstructured.Unstructured{}, r.Objects...), r.Hooks...) {
		if k := o.GetKind(); k == "Role" || k == "ClusterRole" {
			out = append(out, o)
		}
	}
	return out
}
