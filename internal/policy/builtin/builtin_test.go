package builtin

import (
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/config"
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
	hooks, err := Hooks(config.Default(), nil)
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

	whs, err := Webhooks(config.Default(), nil)
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

func TestDisabledPolicyHasNoHooks(t *testing.T) {
	for _, tc := range []struct {
		disable func(*config.Configuration)
		gone    string
		left    int
	}{
		{func(c *config.Configuration) { c.Policies.PodName.Enabled = false }, "pod-name", 3},
		{func(c *config.Configuration) { c.Policies.Lifespan.Enabled = false }, "lifespan", 3},
		{func(c *config.Configuration) { c.Policies.NodeOvercommit.Enabled = false }, "node-overcommit", 2},
	} {
		cfg := config.Default()
		tc.disable(cfg)
		hooks, err := Hooks(cfg, nil)
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
	cfg := config.Default()
	cfg.Policies.PodName.Enabled = false
	cfg.Policies.Lifespan.Enabled = false
	cfg.Policies.NodeOvercommit.Enabled = false
	hooks, err := Hooks(cfg, nil)
	if err != nil || len(hooks) != 0 {
		t.Fatalf("all disabled: %v, %+v", err, keys(hooks))
	}
	// A disabled policy is not built, so its invalid settings do not matter.
	cfg.Policies.Lifespan.Max = -1
	if _, err := Hooks(cfg, nil); err != nil {
		t.Fatalf("disabled invalid policy: %v", err)
	}
}

func TestFailurePolicyOverride(t *testing.T) {
	ignore, fail := admissionregistrationv1.Ignore, admissionregistrationv1.Fail
	cfg := config.Default()
	cfg.Policies.PodName.FailurePolicy = &ignore
	cfg.Policies.NodeOvercommit.FailurePolicy = &fail
	hooks, err := Hooks(cfg, nil)
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

func TestInvalidPolicyNamed(t *testing.T) {
	cfg := config.Default()
	cfg.Policies.Lifespan.Max = -1
	_, err := Hooks(cfg, nil)
	if err == nil || !strings.HasPrefix(err.Error(), "policy lifespan: max: ") {
		t.Fatalf("err = %v", err)
	}
	cfg = config.Default()
	cfg.Policies.NodeOvercommit.Ratios = nil
	if _, err := Webhooks(cfg, nil); err == nil || !strings.HasPrefix(err.Error(), "policy node-overcommit: ratios: ") {
		t.Fatalf("err = %v", err)
	}
}
