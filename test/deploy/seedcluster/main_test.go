package seedcluster_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/kadmit/kadmit/test/cluster"
	"github.com/kadmit/kadmit/test/controlplane"
)

func TestMain(m *testing.M) {
	os.Exit(cluster.Main(func() int {
		defer func() {
			if built.dir != "" {
				_ = os.RemoveAll(built.dir)
			}
		}()
		return m.Run()
	}))
}

// startCluster starts a two-node cluster with the foreign webhook's image
// imported, failing (KADMIT_E2E_REQUIRED=1) or skipping when this machine
// cannot run one.
func startCluster(t *testing.T) *cluster.Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if !cluster.Inside() {
		t.Fatal("not inside the private namespaces cluster.Main makes")
	}
	foreign, err := foreignArchive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c, err := cluster.Start(ctx, cluster.Options{Nodes: 2, Images: []string{foreign}, Log: testWriter{t}})
	if err != nil {
		if (errors.Is(err, cluster.ErrUnavailable) || errors.Is(err, controlplane.ErrBinariesMissing)) && os.Getenv(cluster.EnvRequired) != "1" {
			t.Skip(err)
		}
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	return c
}

func TestSeed004Foreign(t *testing.T) {
	c := startCluster(t)
	seed004Foreign(t, c)
}

func TestSeed000Foreign(t *testing.T) {
	c := startCluster(t)
	seed000Foreign(t, c)
}

func TestSeed001Foreign(t *testing.T) {
	c := startCluster(t)
	ctx := ctxFor(t, 4*time.Minute)
	s := setUpSeed001(ctx, t, c, "kadmit-system")
	r := s.batches(ctx, t, 12, 4, 6, nil)
	t.Logf("%+v", r)
	s.doctorNamesCollision(ctx, t)
	s.watchNamesCollision(ctx, t)
}
