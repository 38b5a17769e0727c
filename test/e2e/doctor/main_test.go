// Package doctor tests `kadmit doctor` against a real kube-apiserver and etcd:
// each test builds a broken (or healthy) webhook situation out of real
// objects (Services, EndpointSlices, Deployments, ReplicaSets, Pods with
// owner references, webhook configurations; no kubelet or controllers run)
// and small TLS servers, then asserts doctor's finding, its ID and its fix.
//
// The API server routes webhook calls through EndpointSlices
// (--enable-aggregator-routing) to 198.18.0.0/15 addresses on the loopback
// device of a private network namespace (unshare --net), so nothing leaves
// the machine; doctor's handshakes dial only loopback and that range (see
// guardedDial). Without the namespace (not root, no unshare or ip) the TLS
// and probe scenarios skip with the reason, and the others run against a
// plain control plane; KADMIT_E2E_REQUIRED=1 turns a skip into a failure.
// Without the control plane binaries everything skips likewise.
// KADMIT_E2E_KEEP=1 keeps the temporary directory (logs, kubeconfig).
package doctor

import (
	"os"
	"testing"

	"github.com/kadmit/kadmit/test/e2e/e2eenv"
)

// env is the shared world: a control plane (routing Services inside the
// private namespace), and kadmit and the kubectl-kadmit plugin built into
// Tmp. No kadmit runs by default; scenarios start their own servers.
type env = e2eenv.Env

var suite = &e2eenv.Suite{
	Name:       "doctor e2e",
	Netns:      e2eenv.NetnsPreferred,
	NetnsNeeds: "TLS and probe scenarios",
	QPS:        100,
	Burst:      200,
	Commands:   []string{"kubectl-kadmit"},
}

func TestMain(m *testing.M) { os.Exit(suite.Main(m)) }

// world returns the shared environment, skipping or failing t when there is
// none.
func world(t *testing.T) *env {
	t.Helper()
	return suite.Env(t)
}

// routedWorld is world for scenarios that listen on 198.18.0.x and need the
// API server to route Services to them.
func routedWorld(t *testing.T) *env {
	t.Helper()
	return suite.Routed(t)
}
