package deploy

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"

	"github.com/kadmit/kadmit/internal/builtin"
	"github.com/kadmit/kadmit/test/deploy/internal/audit"
)

// TestRBACCoversPolicyCaches: for configurations that turn on every cache a
// built-in policy can declare (policy.Definition.Caches), the chart grants
// its ServiceAccount list and watch on exactly those resources, at the
// declared scope (a namespace-limited cache gets a Role in that namespace),
// and nothing more. The chart's rules are generated from the Go definitions
// (templates/_policycaches.tpl, `make generate`, internal/served); this test
// renders them, so a generator that grants too much or too little, or a
// generated file not regenerated after a policy adds a cache, fails here.
func TestRBACCoversPolicyCaches(t *testing.T) {
	profile := map[string]any{"name": "batch", "selector": map[string]any{"matchLabels": map[string]any{"qos": "be"}},
		"namespaceSelector": map[string]any{"matchLabels": map[string]any{"colocation": "on"}}, "priorityClassName": "koord-batch"}
	for _, tc := range []struct {
		name     string
		policies map[string]any
	}{
		{"none", map[string]any{}},
		{"job-queue", map[string]any{"jobQueue": map[string]any{"enabled": true}}},
		{"job-queue without queue names", map[string]any{"jobQueue": map[string]any{"enabled": true, "manageJobsWithoutQueueName": true}}},
		{"elastic-quota", map[string]any{"elasticQuota": map[string]any{"enabled": true}}},
		{"colocation", map[string]any{"colocation": map[string]any{"enabled": true, "profiles": []any{profile}}}},
		{"reservation", map[string]any{"reservation": map[string]any{"enabled": true, "checkAllocations": true, "profiles": []any{profile}}}},
		{"slo-config", map[string]any{"sloConfig": map[string]any{"enabled": true}}},
		{"slo-config elsewhere", map[string]any{"sloConfig": map[string]any{"enabled": true, "namespace": "koord"}}},
		{"slo-config without node check", map[string]any{"sloConfig": map[string]any{"enabled": true, "nodeCheck": false}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfgMap := map[string]any{"apiVersion": "kadmit.io/v1alpha1", "kind": "Configuration", "policies": tc.policies}
			raw, err := json.Marshal(cfgMap)
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := builtin.Config.Parse(raw)
			if err != nil {
				t.Fatalf("configuration: %v", err)
			}
			var want []string
			for _, r := range builtin.Caches(cfg) {
				for _, verb := range []string{"list", "watch"} {
					want = append(want, scoped(verb, r.Group, r.GroupVersionResource.Resource, r.Namespace))
				}
			}
			slices.Sort(want)
			want = slices.Compact(want)

			rendered := render(t, "kadmit", "kadmit-system", map[string]any{"config": cfgMap})
			var dep appsv1.Deployment
			toTyped(t, mustFind(t, rendered, "Deployment", "kadmit"), &dep)
			user := "system:serviceaccount:" + dep.Namespace + ":" + dep.Spec.Template.Spec.ServiceAccountName
			gs, err := audit.BoundGrants(user, rendered.Objects...)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, g := range gs {
				if !cacheRole(g.Role) {
					continue
				}
				got = append(got, scoped(g.Verb, g.Group, g.Resource, g.Namespace))
			}
			slices.Sort(got)
			got = slices.Compact(got)
			if !slices.Equal(got, want) {
				t.Errorf("chart grants for the policies' caches\n%v\nwant (builtin.Caches)\n%v", got, want)
			}
		})
	}
}

func scoped(verb, group, resource, ns string) string {
	if group == "" {
		group = "core"
	}
	if ns == "" {
		return fmt.Sprintf("%s %s/%s", verb, group, resource)
	}
	return fmt.Sprintf("%s %s/%s in %s", verb, group, resource, ns)
}

// cacheRole reports whether role ("Kind/name") is one the chart renders
// only for policy caches (templates/rbac.yaml).
func cacheRole(role string) bool {
	return strings.HasSuffix(role, "-cluster-reads") || strings.HasSuffix(role, "-slo-config-reads")
}
