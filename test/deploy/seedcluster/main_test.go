package seedcluster_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/kadmit/kadmit/test/cluster"
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

// startCluster starts a two-node cluster with kadmit's image and the
// foreign webhook's imported, failing (KADMIT_E2E_REQUIRED=1) or skipping
// when this machine cannot run one.
func startCluster(t *testing.T) *cluster.Cluster {
	t.Helper()
	opts := realcluster.Options{Cluster: cluster.Options{Nodes: 2}}
	if cluster.Inside() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		foreign, err := foreignArchive(ctx)
		if err != nil {
			t.Fatal(err)
		}
		opts.Cluster.Images = []string{foreign}
	}
	return realcluster.Start(t, opts)
}

// install runs `helm install` of kadmit's chart with default values (only
// the image reference and pull policy of a registry-less cluster differ)
// and values over them, and waits until it is Ready and registered.
func install(t *testing.T, c *cluster.Cluster, values map[string]any) *realcluster.Release {
	t.Helper()
	began := time.Now()
	rel, err := realcluster.Install(ctxFor(t, 4*time.Minute), c, realcluster.InstallOptions{Values: values})
	if err != nil {
		t.Fatalf("%v\n%s", err, podsDump(c))
	}
	t.Logf("kadmit installed and Ready in %s", time.Since(began).Round(time.Millisecond))
	return rel
}
