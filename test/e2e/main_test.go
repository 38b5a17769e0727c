// Package e2e runs kadmit as a separate process against a real kube-apiserver
// and etcd on loopback, registered by kadmit itself, and checks what the API
// server stores or refuses. Nothing is mocked: if these pass, a cluster
// configured the same way behaves the same.
//
// Run with `cd test && go test ./e2e/...` after `make controlplane`. Without the
// control plane binaries the tests skip, unless KADMIT_E2E_REQUIRED=1, which
// turns their absence into a failure (for CI). KADMIT_E2E_KEEP=1 keeps the
// temporary directory (kadmit.log, controlplane.log, kubeconfig) for a
// post-mortem; its path is printed.
package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kadmit/kadmit/test/e2e/e2eenv"
)

// env is the shared world every test runs in, built once by TestMain: the
// base environment with one kadmit registered, and this run's namespace.
type env struct {
	*e2eenv.Env
	namespace string // a fresh namespace for this run's pods
}

// kadmitReadyLimit bounds kadmit's start until its webhooks take effect.
const kadmitReadyLimit = 60 * time.Second

var (
	shared = &env{}
	suite  = &e2eenv.Suite{Name: "e2e", Setup: shared.setup}
)

func TestMain(m *testing.M) { os.Exit(suite.Main(m)) }

// setup starts kadmit, registered with the control plane, and checks its
// webhooks take effect in a fresh namespace.
func (e *env) setup(ctx context.Context, base *e2eenv.Env) error {
	e.Env = base
	readyCtx, cancel := context.WithTimeout(ctx, kadmitReadyLimit)
	defer cancel()
	if err := e.StartKadmit(readyCtx); err != nil {
		return err
	}
	e.namespace = fmt.Sprintf("kadmit-e2e-%06d", rand.IntN(1_000_000))
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e.namespace}}
	if _, err := e.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create namespace %s: %w", e.namespace, err)
	}
	return e.Kadmit.WaitEffective(readyCtx, e.Client, e.namespace)
}

// world returns the shared environment, skipping or failing t when there is
// none.
func world(t *testing.T) *env {
	t.Helper()
	suite.Env(t)
	return shared
}
