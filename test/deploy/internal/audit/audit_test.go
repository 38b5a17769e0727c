package audit

import (
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

func objs(t *testing.T, docs ...string) []*unstructured.Unstructured {
	t.Helper()
	var out []*unstructured.Unstructured
	for _, d := range docs {
		var m map[string]any
		if err := yaml.Unmarshal([]byte(d), &m); err != nil {
			t.Fatal(err)
		}
		out = append(out, &unstructured.Unstructured{Object: m})
	}
	return out
}

const (
	sa       = "{kind: ServiceAccount, apiVersion: v1, metadata: {name: app, namespace: ns}}"
	role     = `{kind: Role, apiVersion: rbac.authorization.k8s.io/v1, metadata: {name: app, namespace: ns}, rules: [{apiGroups: [""], resources: [secrets], verbs: [get]}]}`
	roleBind = `{kind: RoleBinding, apiVersion: rbac.authorization.k8s.io/v1, metadata: {name: app, namespace: ns}, roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: app}, subjects: [{kind: ServiceAccount, name: app, namespace: ns}]}`
	cr       = `{kind: ClusterRole, apiVersion: rbac.authorization.k8s.io/v1, metadata: {name: reads}, rules: [{apiGroups: [""], resources: [pods], verbs: [list]}]}`
	user     = "system:serviceaccount:ns:app"
)

func grantStrings(gs []Grant) []string {
	var out []string
	for _, g := range gs {
		out = append(out, g.String()+" ns="+g.Namespace)
	}
	slices.Sort(out)
	return out
}

func TestBoundGrantsFollowBindings(t *testing.T) {
	crb := `{kind: ClusterRoleBinding, apiVersion: rbac.authorization.k8s.io/v1, metadata: {name: reads}, roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: reads}, subjects: [{kind: ServiceAccount, name: app, namespace: ns}]}`
	gs, err := BoundGrants(user, objs(t, sa, role, roleBind, cr, crb)...)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := grantStrings(gs), []string{"get core/secrets (Role/app) ns=ns", "list core/pods (ClusterRole/reads) ns="}; !slices.Equal(got, want) {
		t.Errorf("grants %q, want %q", got, want)
	}
	// A role nobody binds to user grants user nothing.
	if gs, err := BoundGrants(user, objs(t, sa, role, cr)...); err != nil || len(gs) != 0 {
		t.Errorf("unbound roles: grants %v, err %v; want none", gs, err)
	}
	if gs, err := BoundGrants("system:serviceaccount:ns:other", objs(t, sa, role, roleBind)...); err != nil || len(gs) != 0 {
		t.Errorf("another user: grants %v, err %v; want none", gs, err)
	}
	// A RoleBinding to a ClusterRole grants it in the binding's namespace only.
	rbToCR := `{kind: RoleBinding, apiVersion: rbac.authorization.k8s.io/v1, metadata: {name: reads, namespace: ns}, roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: reads}, subjects: [{kind: ServiceAccount, name: app, namespace: ns}]}`
	gs, err = BoundGrants(user, objs(t, cr, rbToCR)...)
	if err != nil || len(gs) != 1 || gs[0].Namespace != "ns" {
		t.Errorf("RoleBinding to a ClusterRole: %v, %v; want list pods in ns only", gs, err)
	}
	// A binding to a role objs do not hold is an error, not an empty grant.
	stray := `{kind: ClusterRoleBinding, apiVersion: rbac.authorization.k8s.io/v1, metadata: {name: stray}, roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}, subjects: [{kind: ServiceAccount, name: app, namespace: ns}]}`
	if _, err := BoundGrants(user, objs(t, sa, stray)...); err == nil || !strings.Contains(err.Error(), "cluster-admin") {
		t.Errorf("stray binding: err %v; want one naming cluster-admin", err)
	}
}

func TestCheckBindings(t *testing.T) {
	if p := CheckBindings(objs(t, sa, role, roleBind, cr), map[string]string{"ClusterRole/reads": "for users"}); len(p) != 0 {
		t.Errorf("clean chart: %q", p)
	}
	for name, c := range map[string]struct {
		docs []string
		want string
	}{
		"binding to a role outside the chart":        {[]string{sa, role, roleBind, `{kind: ClusterRoleBinding, apiVersion: rbac.authorization.k8s.io/v1, metadata: {name: stray}, roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}, subjects: [{kind: ServiceAccount, name: app, namespace: ns}]}`}, `"cluster-admin", which the chart does not render`},
		"RoleBinding to a Role of another namespace": {[]string{sa, role, `{kind: RoleBinding, apiVersion: rbac.authorization.k8s.io/v1, metadata: {name: app, namespace: other}, roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: app}, subjects: [{kind: ServiceAccount, name: app, namespace: ns}]}`}, "which the chart does not render"},
		"subject outside the chart":                  {[]string{sa, role, `{kind: RoleBinding, apiVersion: rbac.authorization.k8s.io/v1, metadata: {name: app, namespace: ns}, roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: app}, subjects: [{kind: ServiceAccount, name: default, namespace: ns}]}`}, "not a ServiceAccount the chart renders"},
		"group subject":                              {[]string{sa, role, `{kind: RoleBinding, apiVersion: rbac.authorization.k8s.io/v1, metadata: {name: app, namespace: ns}, roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: app}, subjects: [{kind: Group, name: "system:authenticated"}]}`}, "not a ServiceAccount the chart renders"},
		"unbound role not named an exception":        {[]string{sa, role, roleBind, cr}, "ClusterRole/reads is rendered but bound to nobody"},
	} {
		p := CheckBindings(objs(t, c.docs...), nil)
		if !slices.ContainsFunc(p, func(s string) bool { return strings.Contains(s, c.want) }) {
			t.Errorf("%s: problems %q; want one containing %q", name, p, c.want)
		}
	}
}
