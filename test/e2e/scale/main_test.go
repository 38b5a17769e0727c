// Package scale measures `kadmit doctor` and `kadmit watch` on a cluster of
// issue 23's size, created in a real kube-apiserver and etcd (no kubelet or
// controllers run): 500 webhook configurations of 4 webhooks each, calling
// 2,000 Services in 100 namespaces, and 50,000 pods of Deployments
// (ReplicaSets and Deployments included), each pod the realistic shape of
// internal/bench's pod (two containers, env, probes, volumes, the default
// tolerations). It asserts one doctor run (the binary, default --qps and
// --burst) under 10 s and the watch's peak RSS (VmHWM) under 256 MiB from
// start through ready and a few evaluations, and logs the figures: object
// creation rate, doctor's wall time and peak RSS, the watch's time to
// ready, peak RSS and evaluation times. No endpoint exists (no kubelet), so
// every Service webhook is KD201 and nothing is dialled: no network
// namespace is needed. KADMIT_E2E_REQUIRED=1 turns a skip (no control plane
// binaries) into a failure.
package scale

import (
	"os"
	"testing"

	"github.com/kadmit/kadmit/test/e2e/e2eenv"
)

var suite = &e2eenv.Suite{
	Name: "scale e2e",
	// The creates go through their own client (createClient) with its own
	// rate; the suite's client only reads.
	QPS:   100,
	Burst: 200,
}

func TestMain(m *testing.M) { os.Exit(suite.Main(m)) }
