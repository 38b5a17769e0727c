package serve

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/builtin"
	"github.com/kadmit/kadmit/internal/celpolicy"
	"github.com/kadmit/kadmit/internal/clustercache"
)

// maxReplicasVAP is a ValidatingAdmissionPolicy named name that denies
// deployments with more than max replicas, with its binding.
func maxReplicasVAP(name, max string) string {
	return `apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: ` + name + `}
spec:
  matchConstraints:
    resourceRules:
    - {apiGroups: [apps], apiVersions: [v1], operations: [CREATE], resources: [deployments]}
  validations:
  - expression: object.spec.replicas <= ` + max + `
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: ` + name + `}
spec: {policyName: ` + name + `, validationActions: [Deny]}
`
}

func policyCM(data map[string]string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kadmit-system", Name: "policies"}, Data: data}
}

// testReloader is a reloader serving the seed profile with declared
// policies from a ConfigMap, its cluster caches static, recording what it
// serves and registers.
func testReloader(t *testing.T) (*reloader, func() []string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	cfg := builtin.Config.Default()
	resources := append(builtin.Caches(cfg), celpolicy.Caches()...)
	cluster, err := clustercache.NewStatic(ctx, resources, nil)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var served, registered []string
	r := &reloader{ctx: ctx, opts: Options{PolicyConfigMap: "kadmit-system/policies"}, log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		cfg: cfg, wantCfg: cfg, cluster: cluster, clusterKey: clustercache.Key(resources)}
	r.serve = func(whs []*admission.Webhook) {
		mu.Lock()
		defer mu.Unlock()
		served = nil
		for _, wh := range whs {
			for _, h := range wh.Hooks {
				served = append(served, h.Policy)
			}
		}
	}
	r.register = func(hooks []admission.Hook) {
		mu.Lock()
		defer mu.Unlock()
		registered = nil
		for _, h := range hooks {
			registered = append(registered, h.Policy)
		}
	}
	return r, func() []string {
		mu.Lock()
		defer mu.Unlock()
		if !slices.Equal(served, registered) {
			t.Errorf("served %v, registered %v", served, registered)
		}
		var declared []string
		for _, p := range served {
			if strings.HasPrefix(p, "vap-") || strings.HasPrefix(p, "map-") {
				declared = append(declared, p)
			}
		}
		return declared
	}
}

// A ConfigMap edit that builds is swapped in; an invalid edit and a
// deletion are refused, the running policies kept; an unchanged ConfigMap
// (the informer's resync) rebuilds nothing.
func TestPolicyConfigMapSwap(t *testing.T) {
	r, declared := testReloader(t)
	r.policyConfigMap(policyCM(map[string]string{"a.yaml": maxReplicasVAP("a", "5")}))
	if got := declared(); !slices.Equal(got, []string{"vap-a"}) {
		t.Fatalf("after the first ConfigMap: %v", got)
	}
	running := r.policyDocs

	// A binding to a missing policy: refused.
	bad := policyCM(map[string]string{"a.yaml": maxReplicasVAP("a", "5"), "b.yaml": "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicyBinding\nmetadata: {name: b}\nspec: {policyName: none, validationActions: [Deny]}\n"})
	r.policyConfigMap(bad)
	// An expression that does not compile: refused.
	r.policyConfigMap(policyCM(map[string]string{"a.yaml": maxReplicasVAP("a", "(")}))
	// Not YAML: refused.
	r.policyConfigMap(policyCM(map[string]string{"a.yaml": "{"}))
	r.policyConfigMap(nil)
	if got := declared(); !slices.Equal(got, []string{"vap-a"}) || !slices.Equal(r.policyDocs, running) {
		t.Fatalf("after refused edits: serving %v, docs %v", got, r.policyDocs)
	}

	// Keys are read in lexical order, each its own document stream.
	r.policyConfigMap(policyCM(map[string]string{"z.yaml": maxReplicasVAP("z", "7"), "a.yaml": maxReplicasVAP("a", "5")}))
	if got := declared(); !slices.Equal(got, []string{"vap-a", "vap-z"}) {
		t.Fatalf("after a valid edit: %v", got)
	}
	// The same data again (a resync) builds nothing: serve is not called.
	r.serve = func([]*admission.Webhook) { t.Error("unchanged ConfigMap rebuilt") }
	r.policyConfigMap(policyCM(map[string]string{"a.yaml": maxReplicasVAP("a", "5"), "z.yaml": maxReplicasVAP("z", "7")}))
}

// The ConfigMap's documents and the --policies files are one set: a
// binding in the ConfigMap may name a policy in a file.
func TestDeclaredHooksFilesAndConfigMap(t *testing.T) {
	binding := `apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicyBinding
metadata: {name: lifespan-again}
spec: {policyName: lifespan}
`
	docs := celpolicy.ConfigMapDocuments(policyCM(map[string]string{"b.yaml": binding, "a.yaml": maxReplicasVAP("a", "5")}))
	if len(docs) != 2 || docs[0].Name != "ConfigMap kadmit-system/policies data[a.yaml]" {
		t.Fatalf("documents %+v", docs)
	}
	hooks, err := declaredHooks(celpolicy.LoadOptions{}, []string{"../../examples/cel/lifespan"}, docs)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, h := range hooks {
		names = append(names, h.Policy)
	}
	if !slices.Equal(names, []string{"map-lifespan", "vap-lifespan-label", "vap-a"}) {
		t.Errorf("hooks %v", names)
	}
	// An error names the ConfigMap key.
	docs = celpolicy.ConfigMapDocuments(policyCM(map[string]string{"bad.yaml": "kind: 3"}))
	if _, err := declaredHooks(celpolicy.LoadOptions{}, nil, docs); err == nil || !strings.Contains(err.Error(), "ConfigMap kadmit-system/policies data[bad.yaml]") {
		t.Errorf("error %v, want one naming the key", err)
	}
}

// The watch sees its one ConfigMap's adds, edits and deletion, and no other.
func TestWatchPolicyConfigMap(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs := fake.NewClientset(policyCM(map[string]string{"a.yaml": "x"}))
	events := make(chan *corev1.ConfigMap, 16)
	if err := celpolicy.WatchConfigMap(ctx, cs, "kadmit-system", "policies", func(cm *corev1.ConfigMap) { events <- cm }); err != nil {
		t.Fatal(err)
	}
	next := func() *corev1.ConfigMap {
		t.Helper()
		select {
		case cm := <-events:
			return cm
		case <-ctx.Done():
			t.Fatal("no event")
			return nil
		}
	}
	if cm := next(); cm == nil || cm.Data["a.yaml"] != "x" {
		t.Fatalf("add: %+v", cm)
	}
	other := policyCM(map[string]string{"a.yaml": "other"})
	other.Name = "other"
	if _, err := cs.CoreV1().ConfigMaps("kadmit-system").Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().ConfigMaps("kadmit-system").Update(ctx, policyCM(map[string]string{"a.yaml": "y"}), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if cm := next(); cm == nil || cm.Name != "policies" || cm.Data["a.yaml"] != "y" {
		t.Fatalf("update: %+v", cm)
	}
	if err := cs.CoreV1().ConfigMaps("kadmit-system").Delete(ctx, "policies", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if cm := next(); cm != nil {
		t.Fatalf("delete: %+v", cm)
	}
	select {
	case cm := <-events:
		t.Fatalf("extra event %+v", cm)
	default:
	}
}

func TestPolicyConfigMapUsage(t *testing.T) {
	for _, v := range []string{"policies", "/policies", "ns/", "a/b/c"} {
		if _, _, err := policyConfigMapName(Options{PolicyConfigMap: v}); err == nil {
			t.Errorf("%q accepted", v)
		}
	}
	if ns, name, err := policyConfigMapName(Options{PolicyConfigMap: "kadmit-system/policies"}); err != nil || ns != "kadmit-system" || name != "policies" {
		t.Errorf("%s %s %v", ns, name, err)
	}
}
