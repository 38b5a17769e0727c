// Package chartcluster installs kadmit's Helm chart on a real two-node
// cluster (package cluster: kubelets, kube-proxy, containerd) and proves
// what a platform engineer installing it relies on: pods Ready by their
// real probes, spread over the nodes, webhooks registered and called
// through the Service, no failed and no bypassed admission across
// upgrades, restarts, pod deletions, a node drain and certificate
// rotations, and nothing left behind by helm uninstall.
//
// The package takes about 15 minutes on a 2-core machine, most of it the
// 70 disruptions at the chart's default values (a drain waits for each
// evicted pod's 10 s preStop sleep and 12 s shutdown drain): run it with
// -timeout 25m (make test-deploy gives 30m), go test's default 10m is too
// short.
package chartcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/kadmit/kadmit/test/cluster"
	"github.com/kadmit/kadmit/test/controlplane"
	"github.com/kadmit/kadmit/test/deploy/realcluster"
)

// One cluster for the package: it starts in seconds, but every test
// installs and uninstalls its own release on it.
var shared struct {
	once sync.Once
	c    *cluster.Cluster
	err  error
	log  *logBuffer
}

func TestMain(m *testing.M) {
	os.Exit(realcluster.Main(func() int {
		code := m.Run()
		if shared.c != nil {
			shared.c.Stop()
		}
		return code
	}))
}

// env returns the package's cluster, starting it on first use; it skips
// or (KADMIT_E2E_REQUIRED=1) fails the test when this machine cannot run
// one.
func env(t *testing.T) *cluster.Cluster {
	t.Helper()
	shared.once.Do(func() {
		shared.log = &logBuffer{}
		shared.c, shared.err = realcluster.StartContext(context.Background(), realcluster.Options{Cluster: cluster.Options{Nodes: 2, Log: shared.log}})
	})
	t.Log(shared.log.String())
	if err := shared.err; err != nil {
		if (errors.Is(err, cluster.ErrUnavailable) || errors.Is(err, controlplane.ErrBinariesMissing)) && os.Getenv(cluster.EnvRequired) != "1" {
			t.Skip(err)
		}
		t.Fatal(err)
	}
	if err := shared.c.Alive(); err != nil {
		t.Fatal(err)
	}
	return shared.c
}

// logBuffer keeps the cluster's start log for the first test's output.
type logBuffer struct {
	mu     sync.Mutex
	b      []byte
	logged bool
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b = append(l.b, p...)
	return len(p), nil
}

// String returns the log once (later calls return a short note).
func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.logged {
		return "cluster started by an earlier test"
	}
	l.logged = true
	return fmt.Sprintf("cluster start:\n%s", l.b)
}
