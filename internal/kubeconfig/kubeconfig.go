// Package kubeconfig loads the client configuration every kadmit command
// that talks to a cluster uses, the way kubectl does, so `serve`,
// `uninstall` and `doctor` resolve --kubeconfig and --context identically.
package kubeconfig

import (
	"fmt"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Load returns the client configuration from path (empty: $KUBECONFIG, then
// ~/.kube/config, then the in-cluster ServiceAccount), with context overriding
// the current context when set and userAgent as the User-Agent. The error
// says the kubeconfig could not be loaded and why.
func Load(path, context, userAgent string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = path
	rc, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: context}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig: %w", err)
	}
	if userAgent != "" {
		rc.UserAgent = userAgent
	}
	return rc, nil
}
