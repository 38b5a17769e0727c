package builtin

import (
	"slices"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/config"
	"github.com/kadmit/kadmit/internal/policy"
	"github.com/kadmit/kadmit/internal/policy/seed/lifespan"
)

type hookKey struct {
	policy, path string
	typ          admission.Type
	fp           admissionregistrationv1.FailurePolicyType
}

func keys(hooks []admission.Hook) []hookKey {
	out := make([]hookKey, 0, len(hooks))
	for _, h := range hooks {
		out = append(out, hookKey{h.Policy, h.Path, h.Type, h.FailurePolicy})
	}
	return out
}

func TestSeedHooks(t *testing.T) {
	hooks, err := Hooks(Config.Default(), policy.Env{})
	if err != nil {
		t.Fatal(err)
	}
	want := []hookKey{
		{"pod-name", "/validate-pod", admission.Validating, admissionregistrationv1.Fail},
		{"lifespan", "/mutate-pod", admission.Mutating, admissionregistrationv1.Fail},
		{"node-overcommit", "/mutate-node-status", admission.Mutating, admissionregistrationv1.Ignore},
		{"node-overcommit", "/validate-node", admission.Validating, admissionregistrationv1.Ignore},
	}
	if got := keys(hooks); !slices.Equal(got, want) {
		t.Fatalf("hooks = %+v, want %+v", got, want)
	}
	for _, h := range hooks {
		if len(h.Rules) == 0 || (h.Validator == nil) == (h.Mutator == nil) {
			t.Errorf("hook %s %s: rules %v, validator %v, mutator %v", h.Policy, h.Path, h.Rules, h.Validator, h.Mutator)
		}
	}

	whs, err := Webhooks(Config.Default(), policy.Env{})
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, wh := range whs {
		paths = append(paths, wh.Path+" "+string(wh.Type))
	}
	wantPaths := []string{"/validate-pod Validating", "/mutate-pod Mutating", "/mutate-node-status Mutating", "/validate-node Validating"}
	if !slices.Equal(paths, wantPaths) {
		t.Fatalf("webhooks = %v, want %v", paths, wantPaths)
	}
}

func parse(t *testing.T, policies string) *config.Configuration {
	t.Helper()
	cfg, err := Config.Parse([]byte("apiVersion: kadmit.io/v1alpha1\nkind: Configuration\npolicies:\n" + policies))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestRegistryValid(t *testing.T) {
	if err := Registry.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := append(Registry, lifespan.Definition).Validate(); err == nil {
		t.Fatal("a registry listing lifespan twice validated")
	}
}

func TestDisabledPolicyHasNoHooks(t *testing.T) {
	for _, tc := range []struct {
		section string
		gone    string
		left    int
	}{
		{"  podName: {enabled: false}\n", "pod-name", 3},
		{"  lifespan: {enabled: false}\n", "lifespan", 3},
		{"  nodeOvercommit: {enabled: false}\n", "node-overcommit", 2},
	} {
		hooks, err := Hooks(parse(t, tc.section), policy.Env{})
		if err != nil {
			t.Fatal(err)
		}
		if len(hooks) != tc.left {
			t.Errorf("%s disabled: %d hooks, want %d: %+v", tc.gone, len(hooks), tc.left, keys(hooks))
		}
		for _, h := range hooks {
			if h.Policy == tc.gone {
				t.Errorf("%s disabled but registers %s", tc.gone, h.Path)
			}
		}
	}
	cfg := parse(t, "  podName: {enabled: false}\n  lifespan: {enabled: false}\n  nodeOvercommit: {enabled: false}\n")
	hooks, err := Hooks(cfg, policy.Env{})
	if err != nil || len(hooks) != 0 {
		t.Fatalf("all disabled: %v, %+v", err, keys(hooks))
	}
	// A disabled section is still validated: a typo surfaces before the
	// policy is switched on.
	if _, err := Config.Parse([]byte("apiVersion: kadmit.io/v1alpha1\nkind: Configuration\npolicies:\n  lifespan: {enabled: false, max: -1}\n")); err == nil {
		t.Fatal("disabled invalid section parsed")
	}
}

func TestFailurePolicyOverride(t *testing.T) {
	cfg := parse(t, "  podName: {failurePolicy: Ignore}\n  nodeOvercommit: {failurePolicy: Fail}\n")
	hooks, err := Hooks(cfg, policy.Env{})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]admissionregistrationv1.FailurePolicyType{
		"/validate-pod":       admissionregistrationv1.Ignore,
		"/mutate-pod":         admissionregistrationv1.Fail, // not configured: the default
		"/mutate-node-status": admissionregistrationv1.Fail,
		"/validate-node":      admissionregistrationv1.Fail,
	}
	for _, h := range hooks {
		if h.FailurePolicy != want[h.Path] {
			t.Errorf("%s: failurePolicy %s, want %s", h.Path, h.FailurePolicy, want[h.Path])
		}
	}
}
