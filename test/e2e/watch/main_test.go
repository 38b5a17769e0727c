// Package watch tests `kadmit watch` against a real kube-apiserver and
// etcd: the watch runs as its own process (the binary e2eenv builds) on
// the control plane's kubeconfig, inside the private network namespace
// where the test's webhook server listens on a 198.18.0.0/15 address on
// lo; the test makes the failures with real objects (Service,
// EndpointSlice, ValidatingWebhookConfiguration; no kubelet or
// controllers run) and reads the watch's /metrics and the Events it
// writes. KADMIT_E2E_REQUIRED=1 turns a skip (no control plane binaries,
// no network namespace) into a failure.
package watch

import (
	"os"
	"testing"

	"github.com/kadmit/kadmit/test/e2e/e2eenv"
)

var suite = &e2eenv.Suite{
	Name:       "watch e2e",
	Netns:      e2eenv.NetnsRequired,
	NetnsNeeds: "the watch's handshakes with a webhook server behind an EndpointSlice",
	QPS:        100,
	Burst:      200,
}

func TestMain(m *testing.M) { os.Exit(suite.Main(m)) }
