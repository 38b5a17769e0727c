package serve

import (
	"context"
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/celpolicy"
	"github.com/kadmit/kadmit/internal/served"
)

// declaredHooks loads (with load: see celpolicy.LoadOptions) and compiles
// the declared policies at paths and in docs (--policies-configmap's data
// keys) as one set, through served.Assemble as a start and a reload do,
// and returns their hooks, offline (every namespace has only its
// kubernetes.io/metadata.name label) and without serve's bounds: what the
// kadmit-policies guard checks a ConfigMap write with. Errors start with
// "declared policies: ".
func declaredHooks(load celpolicy.LoadOptions, paths []string, docs []celpolicy.Document) ([]admission.Hook, error) {
	policies, err := assemble(served.Sources{Declared: &served.Declared{Paths: paths, Docs: docs, Load: load}})
	if err != nil {
		return nil, fmt.Errorf("declared policies: %w", err)
	}
	return policies.Hooks, nil
}

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
