// Package diagcluster proves `kadmit watch`'s diagnosis on the real cluster
// (package cluster: kubelets, containerd, kube-proxy, the endpoint-slice
// controller), with kadmit's chart installed as an operator installs it
// (watch.enabled) and the watch observed as an operator's monitoring
// observes it (test/watchprobe: its /metrics scraped from every watch pod,
// the chart's PrometheusRule evaluated by Prometheus's engine, its Events):
//
//   - NoFalseAlarms: a healthy cluster (kadmit, a Kueue-like controller
//     injecting its own caBundle, a cert-manager-like injector, an Argo
//     CD-like periodic re-apply of the unchanged configurations) through
//     kadmit's serving and CA rotations, rolling restarts and a node drain:
//     no warning or error finding, no Warning Event, no alert;
//   - Detection: each failure class (the eight of the routed simulation and
//     the six of issue 23) injected into a healthy webhook of its own, real
//     pods of a small webhook server (./webhook) behind a real Service: the
//     time to the finding's metric, its Warning Event and its alert
//     expression, as a table.
//
// The package takes 5-7 minutes on a busy 2-core machine; run it with
// -timeout 20m (make test-deploy gives 30m).
package diagcluster

import (
	"os"
	"testing"

	"github.com/kadmit/kadmit/test/deploy/realcluster"
)

func TestMain(m *testing.M) {
	os.Exit(realcluster.Main(func() int {
		defer func() {
			if built.dir != "" {
				_ = os.RemoveAll(built.dir)
			}
		}()
		return m.Run()
	}))
}
