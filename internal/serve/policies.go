package serve

import (
	"context"
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/celpolicy"
	"github.com/kadmit/kadmit/internal/clustercache"
)

// declaredHooks loads (with load: see celpolicy.LoadOptions) and compiles
// the declared policies at paths and in docs (--policies-configmap's data
// keys) as one set and returns their hooks, namespace lookups answered by
// the cluster's namespace cache (nil offline: every namespace then has
// only its kubernetes.io/metadata.name label). opts carries the bounds
// (Budget, MaxObjectBytes).
func declaredHooks(load celpolicy.LoadOptions, paths []string, docs []celpolicy.Document, cluster *clustercache.Caches, opts celpolicy.Options) ([]admission.Hook, error) {
	opts = opts.WithCluster(cluster)
	set, err := celpolicy.LoadWith(load, paths, docs)
	if err != nil {
		return nil, fmt.Errorf("declared policies: %w", err)
	}
	e, err := newEngine(set, opts)
	if err != nil {
		return nil, fmt.Errorf("declared policies: %w", err)
	}
	return e.Hooks(), nil
}

// newEngine is celpolicy.New; TestReloadReleasesOldEngine records the
// engines it builds to prove a reload lets the previous one go.
var newEngine = celpolicy.New

// declaredLoad is how opts load declared policies.
func declaredLoad(opts Options) celpolicy.LoadOptions {
	return celpolicy.LoadOptions{AllowSensitiveGroups: opts.PolicyAllowSensitiveGroups}
}

// policyConfigMapName splits --policies-configmap NAMESPACE/NAME.
func policyConfigMapName(opts Options) (namespace, name string, err error) {
	ns, name, ok := strings.Cut(opts.PolicyConfigMap, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return "", "", usage("--policies-configmap %q: want NAMESPACE/NAME", opts.PolicyConfigMap)
	}
	return ns, name, nil
}

// loadPolicyConfigMap reads --policies-configmap's documents at start; a
// missing or unreadable ConfigMap is an error, which serve treats as a
// declared set that does not load (reloader.start: the built-in policies
// are served until the ConfigMap's informer delivers one that builds).
func loadPolicyConfigMap(ctx context.Context, cs kubernetes.Interface, opts Options) ([]celpolicy.Document, error) {
	ns, name, err := policyConfigMapName(opts)
	if err != nil {
		return nil, err
	}
	cm, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("--policies-configmap: read ConfigMap %s/%s: %w", ns, name, err)
	}
	return celpolicy.ConfigMapDocuments(cm), nil
}
