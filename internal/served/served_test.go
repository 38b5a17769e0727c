package served

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/kadmit/kadmit/internal/builtin"
	"github.com/kadmit/kadmit/internal/celpolicy"
	"github.com/kadmit/kadmit/internal/clustercache"
	"github.com/kadmit/kadmit/internal/policy"
)

func TestAssemble(t *testing.T) {
	cfg, err := builtin.Config.Parse([]byte(`{"apiVersion": "kadmit.io/v1alpha1", "kind": "Configuration", "policies": {"jobQueue": {"enabled": true}}}`))
	if err != nil {
		t.Fatal(err)
	}
	var asked [][]clustercache.Read
	cluster := func(reads []clustercache.Read) (*clustercache.Caches, error) {
		asked = append(asked, reads)
		return nil, nil // offline
	}

	// Built-in policies and declared ones through the one door: built-in
	// hooks in registry order first, then the declared policies'; the
	// caches are the union, asked for once, before anything is built.
	p, err := Assemble(Sources{Config: cfg, Declared: &Declared{Paths: []string{"../../examples/cel/lifespan"}}, Cluster: cluster})
	if err != nil {
		t.Fatal(err)
	}
	if len(asked) != 1 || len(asked[0]) != len(p.Caches) {
		t.Fatalf("cluster asked %v, Caches %v", asked, p.Caches)
	}
	want := append(builtin.Caches(cfg), celpolicy.Caches()...)
	if !slices.EqualFunc(p.Caches, want, func(a, b clustercache.Read) bool { return a.Resource == b.Resource }) {
		t.Errorf("caches %v, want %v", p.Caches, want)
	}
	builtins, err := builtin.Hooks(cfg, policy.Env{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, h := range p.Hooks {
		names = append(names, h.Policy)
	}
	wantNames := []string{}
	for _, h := range builtins {
		wantNames = append(wantNames, h.Policy)
	}
	wantNames = append(wantNames, "map-lifespan", "vap-lifespan-label")
	if !slices.Equal(names, wantNames) {
		t.Errorf("hooks %v, want %v", names, wantNames)
	}
	if p.Engine == nil || len(p.Engine.Set().Mutating) != 1 {
		t.Errorf("engine %+v", p.Engine)
	}
	whs, err := p.Webhooks()
	if err != nil {
		t.Fatal(err)
	}
	if last := whs[len(whs)-1].Path; last != celpolicy.ValidatePath && last != celpolicy.MutatePath {
		t.Errorf("last webhook %s, want a declared policies' path", last)
	}

	// Without declared policies: no engine, no namespace cache; the
	// cluster is still asked (`kadmit review --state` reads its file).
	asked = nil
	p, err = Assemble(Sources{Config: builtin.Config.Default(), Cluster: cluster})
	if err != nil || p.Engine != nil || len(p.Caches) != 0 || len(asked) != 1 {
		t.Errorf("seed profile: %+v, %v, asked %v", p, err, asked)
	}
	// An empty declared set serves nothing but keeps its caches listed.
	p, err = Assemble(Sources{Declared: &Declared{}})
	if err != nil || len(p.Hooks) != 0 || len(p.Caches) != len(celpolicy.Caches()) {
		t.Errorf("empty declared set: %+v, %v", p, err)
	}
}

// Failures stay apart: the cluster's error as it is, the declared
// policies' a *DeclaredError (serve keeps the built-in policies on that
// one alone).
func TestAssembleErrors(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicyBinding\nmetadata: {name: b}\nspec: {policyName: none, validationActions: [Deny]}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Assemble(Sources{Config: builtin.Config.Default(), Declared: &Declared{Paths: []string{bad}}})
	var de *DeclaredError
	if !errors.As(err, &de) || !errors.Is(err, celpolicy.ErrInput) {
		t.Errorf("bad declared policy: %v", err)
	}
	boom := errors.New("boom")
	_, err = Assemble(Sources{Declared: &Declared{Paths: []string{bad}}, Cluster: func([]clustercache.Read) (*clustercache.Caches, error) { return nil, boom }})
	if !errors.Is(err, boom) || errors.As(err, &de) {
		t.Errorf("cluster error: %v", err)
	}
}
