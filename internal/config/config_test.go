package config_test

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/kadmit/kadmit/internal/builtin"
	. "github.com/kadmit/kadmit/internal/config"
	"github.com/kadmit/kadmit/internal/policy"
	"github.com/kadmit/kadmit/internal/policy/seed/lifespan"
	"github.com/kadmit/kadmit/internal/policy/seed/nodeovercommit"
	"github.com/kadmit/kadmit/internal/policy/seed/podname"
)

// The loader under test is the built-in registry's.
var (
	Parse    = builtin.Config.Parse
	Default  = builtin.Config.Default
	LoadFile = builtin.Config.LoadFile
)

func section(t *testing.T, c *Configuration, key string) policy.Section {
	t.Helper()
	s, ok := c.Section(key)
	if !ok {
		t.Fatalf("no section %s", key)
	}
	return s
}

func fp(s policy.Section) string {
	if s.FailurePolicy() == nil {
		return ""
	}
	return string(*s.FailurePolicy())
}

// seedYAML is the seed profile as the README documents it.
const seedYAML = `apiVersion: kadmit.io/v1alpha1
kind: Configuration
policies:
  podName: {enabled: true, words: [offensive], caseInsensitive: false}
  lifespan: {enabled: true, max: 14}
  nodeOvercommit: {enabled: true, ratios: {cpu: "2"}, maxRatio: "4"}
`

const header = "apiVersion: kadmit.io/v1alpha1\nkind: Configuration\n"

func TestParseSeedDefault(t *testing.T) {
	c, err := Parse([]byte(seedYAML))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c, Default()) {
		t.Fatalf("seed file parsed to %+v, want Default() %+v", c, Default())
	}
	// The envelope alone keeps every default.
	c, err = Parse([]byte(header))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c, Default()) {
		t.Fatalf("envelope-only file parsed to %+v", c)
	}
}

func TestParseEmpty(t *testing.T) {
	for _, in := range []string{"", "  \n\t\n"} {
		_, err := Parse([]byte(in))
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "empty") {
			t.Fatalf("Parse(%q) = %v, want ErrInvalid about an empty file", in, err)
		}
	}
}

func TestParseFullFile(t *testing.T) {
	c, err := Parse([]byte(header + `policies:
  podName:
    enabled: false
    words: [bad, worse]
    caseInsensitive: true
    failurePolicy: Ignore
  lifespan:
    enabled: true
    max: 30
    failurePolicy: Ignore
  nodeOvercommit:
    enabled: true
    ratios: {cpu: "1.5", memory: "1.25"}
    maxRatio: "3"
    failurePolicy: Fail
`))
	if err != nil {
		t.Fatal(err)
	}
	pn, pnOn := policy.ConfigOf(c.Policies, podname.Definition)
	if pnOn || !reflect.DeepEqual(pn.Words, []string{"bad", "worse"}) || !pn.CaseInsensitive ||
		fp(section(t, c, "podName")) != string(admissionregistrationv1.Ignore) {
		t.Errorf("podName = %+v", pn)
	}
	ls, lsOn := policy.ConfigOf(c.Policies, lifespan.Definition)
	if !lsOn || ls.Max != 30 || fp(section(t, c, "lifespan")) != string(admissionregistrationv1.Ignore) {
		t.Errorf("lifespan = %+v", ls)
	}
	no, noOn := policy.ConfigOf(c.Policies, nodeovercommit.Definition)
	wantRatios := map[corev1.ResourceName]string{corev1.ResourceCPU: "1.5", corev1.ResourceMemory: "1.25"}
	if !noOn || !reflect.DeepEqual(no.Ratios, wantRatios) || no.MaxRatio != "3" ||
		fp(section(t, c, "nodeOvercommit")) != string(admissionregistrationv1.Fail) {
		t.Errorf("nodeOvercommit = %+v", no)
	}
	// failurePolicy replaces each hook's default.
	hooks, err := builtin.Hooks(c, policy.Env{})
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hooks {
		want := map[string]admissionregistrationv1.FailurePolicyType{"lifespan": admissionregistrationv1.Ignore, "node-overcommit": admissionregistrationv1.Fail}[h.Policy]
		if h.FailurePolicy != want {
			t.Errorf("hook %s %s: failurePolicy %s, want %s", h.Policy, h.Path, h.FailurePolicy, want)
		}
	}
}

func TestParsePartialKeepsDefaults(t *testing.T) {
	c, err := Parse([]byte(header + "policies:\n  lifespan: {max: 7}\n  nodeOvercommit: {maxRatio: \"8\"}\n"))
	if err != nil {
		t.Fatal(err)
	}
	ls, _ := policy.ConfigOf(c.Policies, lifespan.Definition)
	no, _ := policy.ConfigOf(c.Policies, nodeovercommit.Definition)
	wantNO := nodeovercommit.DefaultConfig()
	wantNO.MaxRatio = "8"
	if ls != (lifespan.Config{Max: 7}) || !reflect.DeepEqual(no, wantNO) {
		t.Fatalf("got lifespan %+v, nodeOvercommit %+v", ls, no)
	}
	// A section that says only enabled: false keeps its other defaults.
	c, err = Parse([]byte(header + "policies:\n  podName: {enabled: false}\n"))
	if err != nil {
		t.Fatal(err)
	}
	pn, pnOn := policy.ConfigOf(c.Policies, podname.Definition)
	if pnOn || !reflect.DeepEqual(pn.Words, []string{"offensive"}) ||
		!section(t, c, "lifespan").Enabled() || !section(t, c, "nodeOvercommit").Enabled() {
		t.Fatalf("got %+v", c.Policies)
	}
}

func TestParseRatiosReplacedWhole(t *testing.T) {
	c, err := Parse([]byte(header + "policies:\n  nodeOvercommit:\n    ratios: {memory: \"1.5\"}\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := map[corev1.ResourceName]string{corev1.ResourceMemory: "1.5"}
	no, on := policy.ConfigOf(c.Policies, nodeovercommit.Definition)
	if !reflect.DeepEqual(no.Ratios, want) {
		t.Fatalf("ratios = %v, want %v (the cpu default must not survive)", no.Ratios, want)
	}
	if no.MaxRatio != "4" || !on {
		t.Fatalf("other nodeOvercommit defaults lost: %+v", no)
	}
	// Parsing must not have altered the defaults it started from.
	if got := nodeovercommit.DefaultConfig().Ratios; !reflect.DeepEqual(got, map[corev1.ResourceName]string{corev1.ResourceCPU: "2"}) {
		t.Fatalf("Default() ratios changed to %v", got)
	}
	// An empty map replaces the defaults too, and is then refused.
	_, err = Parse([]byte(header + "policies:\n  nodeOvercommit:\n    ratios: {}\n"))
	if err == nil || !strings.HasPrefix(err.Error(), "invalid kadmit configuration: policies.nodeOvercommit.ratios: ") {
		t.Fatalf("empty ratios: %v", err)
	}
}

func TestParseUnknownField(t *testing.T) {
	// The error lists every registered section key in registry order.
	var known []string
	for _, k := range builtin.Registry {
		known = append(known, k.Key())
	}
	if known[0] != "podName" || known[len(known)-1] == "" {
		t.Fatalf("registry keys %v", known)
	}
	for _, tc := range []struct{ in, want string }{
		{header + "policies:\n  podName: {enabled: true, wrods: [x]}\n", `invalid kadmit configuration: policies.podName: unknown field "wrods"`},
		{header + "extra: 1\n", `invalid kadmit configuration: unknown field "extra"`},
		// Field names are case-sensitive, as in Kubernetes objects.
		{header + "policies:\n  podname: {enabled: false}\n", `invalid kadmit configuration: policies.podname: unknown policy (known: ` + strings.Join(known, ", ") + `)`},
		{header + "policies:\n  lifespan: {Max: 3}\n", `invalid kadmit configuration: policies.lifespan: unknown field "Max"`},
	} {
		_, err := Parse([]byte(tc.in))
		if !errors.Is(err, ErrInvalid) || err.Error() != tc.want {
			t.Errorf("Parse(%q) = %v, want %q", tc.in, err, tc.want)
		}
	}
	for _, in := range []string{
		header + "policies:\n  lifespan: {max: 3}\n  lifespan: {max: 4}\n",
		header + "kind: Configuration\n",
	} {
		_, err := Parse([]byte(in))
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "already set") {
			t.Errorf("duplicate field in %q: %v", in, err)
		}
	}
	_, err := Parse([]byte(header + "policies:\n  lifespan: {max: seven}\n"))
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "policies.lifespan: ") || !strings.Contains(err.Error(), ".max") {
		t.Errorf("wrong type: %v", err)
	}
}

func TestParseEnvelope(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"apiVersion: kadmit.io/v1\nkind: Configuration\n", `invalid kadmit configuration: apiVersion: must be kadmit.io/v1alpha1, got "kadmit.io/v1"`},
		{"kind: Configuration\n", `invalid kadmit configuration: apiVersion: must be kadmit.io/v1alpha1, got ""`},
		{"apiVersion: kadmit.io/v1alpha1\nkind: Config\n", `invalid kadmit configuration: kind: must be Configuration, got "Config"`},
		{"apiVersion: kadmit.io/v1alpha1\n", `invalid kadmit configuration: kind: must be Configuration, got ""`},
	} {
		_, err := Parse([]byte(tc.in))
		if err == nil || err.Error() != tc.want || !errors.Is(err, ErrInvalid) {
			t.Errorf("Parse(%q) = %v, want %q", tc.in, err, tc.want)
		}
	}
}

func TestParsePolicyErrors(t *testing.T) {
	for _, tc := range []struct{ section, prefix string }{
		{"podName: {words: []}", "policies.podName.words: "},
		{`podName: {words: [a, ""]}`, "policies.podName.words[1]: "},
		{"podName: {failurePolicy: Maybe}", "policies.podName.failurePolicy: "},
		{"lifespan: {max: -1}", "policies.lifespan.max: "},
		{"lifespan: {max: 1001}", "policies.lifespan.max: "},
		{"lifespan: {failurePolicy: fail}", "policies.lifespan.failurePolicy: "},
		{`nodeOvercommit: {maxRatio: "0.5"}`, "policies.nodeOvercommit.maxRatio: "},
		{`nodeOvercommit: {maxRatio: "2x"}`, "policies.nodeOvercommit.maxRatio: "},
		{"nodeOvercommit: {ratios: {}}", "policies.nodeOvercommit.ratios: "},
		{`nodeOvercommit: {ratios: {cpu: "0.5"}}`, "policies.nodeOvercommit.ratios.cpu: "},
		{`nodeOvercommit: {ratios: {memory: "5"}}`, "policies.nodeOvercommit.ratios.memory: "},
		{`nodeOvercommit: {ratios: {"": "2"}}`, "policies.nodeOvercommit.ratios: "},
		{"nodeOvercommit: {failurePolicy: Never}", "policies.nodeOvercommit.failurePolicy: "},
	} {
		_, err := Parse([]byte(header + "policies:\n  " + tc.section + "\n"))
		want := "invalid kadmit configuration: " + tc.prefix
		if err == nil || !strings.HasPrefix(err.Error(), want) || !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: err = %v, want prefix %q", tc.section, err, want)
		}
	}
	// The range appears in the ratio message.
	_, err := Parse([]byte(header + "policies:\n  nodeOvercommit: {ratios: {cpu: \"0.5\"}}\n"))
	if want := `invalid kadmit configuration: policies.nodeOvercommit.ratios.cpu: must be a decimal in [1, 4], got "0.5"`; err == nil || err.Error() != want {
		t.Errorf("err = %v, want %q", err, want)
	}
}

func TestLoadFile(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	if err := os.WriteFile(good, []byte(header+"policies:\n  lifespan: {max: 3}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := LoadFile(good)
	if ls, _ := policy.ConfigOf(c.Policies, lifespan.Definition); err != nil || ls.Max != 3 {
		t.Fatalf("LoadFile: %v, %+v", err, c)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte(header+"policies:\n  lifespan: {max: -3}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = LoadFile(bad)
	if err == nil || !strings.HasPrefix(err.Error(), bad+": invalid kadmit configuration: policies.lifespan.max: ") || !errors.Is(err, ErrInvalid) {
		t.Fatalf("LoadFile(bad) = %v", err)
	}
	missing := filepath.Join(dir, "missing.yaml")
	_, err = LoadFile(missing)
	if err == nil || !strings.Contains(err.Error(), missing) || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("LoadFile(missing) = %v", err)
	}
}

func TestParseJSON(t *testing.T) {
	c, err := Parse([]byte(`{"apiVersion":"kadmit.io/v1alpha1","kind":"Configuration",
		"policies":{"lifespan":{"max":5},"nodeOvercommit":{"ratios":{"memory":"2"}}}}`))
	if err != nil {
		t.Fatal(err)
	}
	ls, _ := policy.ConfigOf(c.Policies, lifespan.Definition)
	no, _ := policy.ConfigOf(c.Policies, nodeovercommit.Definition)
	pn, _ := policy.ConfigOf(c.Policies, podname.Definition)
	if ls.Max != 5 || !reflect.DeepEqual(no.Ratios, map[corev1.ResourceName]string{"memory": "2"}) ||
		!reflect.DeepEqual(pn, podname.DefaultConfig()) {
		t.Fatalf("got %+v", c.Policies)
	}
	_, err = Parse([]byte(`{"apiVersion":"kadmit.io/v1alpha1","kind":"Configuration","policies":{"lifespan":{"maximum":5}}}`))
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "maximum") {
		t.Fatalf("unknown JSON field: %v", err)
	}
}
