package deploy

import (
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"

	"github.com/kadmit/kadmit/test/deploy/chart"
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
