// Package realcluster runs kadmit's Helm chart on a real cluster (package
// cluster: kubelets, kube-proxy, containerd): it builds kadmit's image once
// per test binary and imports it into every node, installs, upgrades and
// uninstalls deploy/helm/kadmit with the Helm SDK, waits for the release
// the way an operator would (Deployment Ready by the real probes, webhook
// configurations registered), and drives a bounded load of server-side
// dry-run pod creations that counts failed admissions and admissions that
// bypassed kadmit, next to the API server's own webhook metrics.
//
// Tests use it from a TestMain that re-executes the binary in the private
// namespaces the cluster needs:
//
//	func TestMain(m *testing.M) { os.Exit(realcluster.Main(m.Run)) }
//
//	c := realcluster.Start(t, realcluster.Options{})
//	rel, err := realcluster.Install(ctx, c, realcluster.InstallOptions{})
//	load := realcluster.StartLoad(ctx, c, realcluster.LoadOptions{Namespace: ns})
package realcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/kadmit/kadmit/test/cluster"
	"github.com/kadmit/kadmit/test/controlplane"
	"github.com/kadmit/kadmit/test/deploy/chart"
	"github.com/kadmit/kadmit/test/deploy/kadmitimage"
)

// Tag is the tag of the image Image builds: kadmitimage.Ref(Tag) is what
// Install runs unless told otherwise.
const Tag = "test"

var img struct {
	once    sync.Once
	dir     string
	archive string
	err     error
	mu      sync.Mutex
	retags  map[string]string
}

// Main is cluster.Main that also removes the directory holding the image
// Image built (a test binary built with plain cluster.Main leaves it in
// os.TempDir()).
func Main(run func() int) int {
	return cluster.Main(func() int {
		defer func() {
			if img.dir != "" {
				_ = os.RemoveAll(img.dir)
			}
		}()
		return run()
	})
}

// Image builds kadmit's image (kadmitimage.Build from the repository root,
// tag Tag) the first time it is called in this process and returns the
// archive and its reference; later calls return the same archive (a
// failed build is not retried: the error is returned again).
func Image(ctx context.Context) (archive, ref string, err error) {
	img.once.Do(func() {
		root, err := chart.RepoRoot()
		if err != nil {
			img.err = err
			return
		}
		if img.dir, err = os.MkdirTemp("", "kadmit-realcluster-image-"); err != nil {
			img.err = fmt.Errorf("realcluster: %w", err)
			return
		}
		img.archive, _, img.err = kadmitimage.Build(ctx, root, img.dir, Tag)
	})
	if img.err != nil {
		return "", "", img.err
	}
	return img.archive, kadmitimage.Ref(Tag), nil
}

// ImageTag returns an archive of the same image under another tag
// (kadmitimage.Retag, ~30 ms; cached per tag), for an upgrade that changes
// the image reference and so rolls the pods. Import it with
// c.ImportImage before upgrading to it.
func ImageTag(ctx context.Context, tag string) (archive, ref string, err error) {
	base, _, err := Image(ctx)
	if err != nil {
		return "", "", err
	}
	if tag == Tag {
		return base, kadmitimage.Ref(tag), nil
	}
	img.mu.Lock()
	defer img.mu.Unlock()
	if a, ok := img.retags[tag]; ok {
		return a, kadmitimage.Ref(tag), nil
	}
	a, ref, err := kadmitimage.Retag(base, tag)
	if err != nil {
		return "", "", err
	}
	if img.retags == nil {
		img.retags = map[string]string{}
	}
	img.retags[tag] = a
	return a, ref, nil
}

// Options configure Start.
type Options struct {
	// Cluster is passed to cluster.Start with kadmit's image added to
	// Images (Nodes defaults to 2 there). Log defaults to the test's log.
	Cluster cluster.Options
	// Timeout bounds the image build and the cluster start together;
	// default 5 minutes.
	Timeout time.Duration
}

// StartContext builds kadmit's image (once per process, see Image) and
// starts a cluster with it imported into every node. Errors matching
// cluster.ErrUnavailable or controlplane.ErrBinariesMissing mean this
// machine cannot run a cluster.
func StartContext(ctx context.Context, opts Options) (*cluster.Cluster, error) {
	if opts.Timeout == 0 {
		opts.Timeout = 5 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	// cluster.Start refuses outside the namespaces; say so before a build
	// that would be wasted.
	if !cluster.Inside() {
		return nil, fmt.Errorf("%w: realcluster.Start must run inside the private namespaces realcluster.Main (cluster.Main) makes", cluster.ErrUnavailable)
	}
	began := time.Now()
	archive, _, err := Image(ctx)
	if err != nil {
		return nil, fmt.Errorf("realcluster: kadmit image: %w", err)
	}
	if opts.Cluster.Log != nil {
		fmt.Fprintf(opts.Cluster.Log, "realcluster: kadmit image %s ready (%s)\n", archive, time.Since(began).Round(time.Millisecond))
	}
	co := opts.Cluster
	co.Images = append(append([]string{}, co.Images...), archive)
	return cluster.Start(ctx, co)
}

// Start is StartContext for a test: it logs the start steps to t, stops
// the cluster in t.Cleanup, and skips the test when this machine cannot
// run a cluster, unless KADMIT_E2E_REQUIRED=1, which fails it.
func Start(t testing.TB, opts Options) *cluster.Cluster {
	t.Helper()
	if opts.Cluster.Log == nil {
		opts.Cluster.Log = TestLog(t)
	}
	c, err := StartContext(context.Background(), opts)
	if err != nil {
		if (errors.Is(err, cluster.ErrUnavailable) || errors.Is(err, controlplane.ErrBinariesMissing)) && os.Getenv(cluster.EnvRequired) != "1" {
			t.Skip(err)
		}
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	return c
}

// TestLog is an io.Writer that logs each write to t.
func TestLog(t testing.TB) io.Writer { return testWriter{t} }

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(string(trimNewline(p)))
	return len(p), nil
}

func trimNewline(p []byte) []byte {
	for len(p) > 0 && p[len(p)-1] == '\n' {
		p = p[:len(p)-1]
	}
	return p
}
