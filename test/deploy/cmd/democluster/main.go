// Command democluster shows kadmit on a real two-node cluster (test/cluster:
// kubelets, containerd, kube-proxy, all inside private namespaces on this
// machine): it installs kadmit's Helm chart with the Helm SDK, shows its
// pods Ready and the seed profile admitting, mutating and rejecting, then
// makes two field failures of other controllers' webhooks happen for real
// (seed 004: a webhook that intercepts its own namespace blocks its own
// restart; seed 001: two webhook Services selecting each other's pods give
// x509 errors) and shows what `kadmit doctor --from-error` says about each.
//
//	make demo-cluster                          # builds what it needs, as root
//	cd test/deploy && go run ./cmd/democluster --kadmit ../../bin/kadmit
//
// Needs root and the binaries `make cluster` builds. Every wait is bounded;
// the whole run takes about two minutes once built. It exits 0 when every
// step showed what it should, 1 otherwise; the cluster is stopped on every
// path out (KADMIT_CLUSTER_KEEP=1 keeps its work directory and logs).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/kadmit/kadmit/test/cluster"
	"github.com/kadmit/kadmit/test/cluster/image"
	"github.com/kadmit/kadmit/test/deploy/chart"
	"github.com/kadmit/kadmit/test/deploy/kadmitimage"
)

// envWork carries the directory holding the images, built outside the
// namespaces (where the module proxy is reachable), to the re-executed
// process inside them.
const envWork = "KADMIT_DEMO_CLUSTER_WORK"

// imageTag is the tag kadmit's image is built under.
const imageTag = "demo"

type options struct {
	kadmit  string
	timeout time.Duration
	verbose bool
}

func main() {
	var o options
	flag.StringVar(&o.kadmit, "kadmit", "", "kadmit binary that runs `kadmit doctor` (default: build ./cmd/kadmit)")
	flag.DurationVar(&o.timeout, "timeout", 5*time.Minute, "give up after this long (the images' build included)")
	flag.BoolVar(&o.verbose, "v", false, "also print the cluster's start steps")
	flag.Parse()
	os.Exit(mainCode(o))
}

// mainCode builds the images outside the namespaces, then runs the demo
// inside them (cluster.Main re-executes this binary there).
func mainCode(o options) int {
	if cluster.Inside() {
		return cluster.Main(func() int { return run(o) })
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	if err := cluster.Available(); err != nil {
		fmt.Printf("demo-cluster: %v\n", err)
		return 1
	}
	root, err := chart.RepoRoot()
	if err != nil {
		fmt.Printf("demo-cluster: %v (run it from the kadmit repository)\n", err)
		return 1
	}
	work, err := os.MkdirTemp("", "kadmit-demo-cluster-")
	if err != nil {
		fmt.Printf("demo-cluster: %v\n", err)
		return 1
	}
	defer os.RemoveAll(work)
	began := time.Now()
	if o.kadmit == "" {
		fmt.Println("Building kadmit (go build ./cmd/kadmit) for `kadmit doctor` ...")
		o.kadmit = filepath.Join(work, "kadmit")
		cmd := exec.CommandContext(ctx, "go", "build", "-o", o.kadmit, "./cmd/kadmit")
		cmd.Dir, cmd.Env = root, append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Printf("demo-cluster: go build ./cmd/kadmit: %v\n%s", err, out)
			return 1
		}
	}
	if o.kadmit, err = filepath.Abs(o.kadmit); err != nil {
		fmt.Printf("demo-cluster: %v\n", err)
		return 1
	}
	fmt.Printf("Building images without a registry or container engine: %s (the Dockerfile's build stage) and %s ...\n", kadmitimage.Ref(imageTag), image.ForeignRef)
	if _, _, err := kadmitimage.Build(ctx, root, work, imageTag); err != nil {
		fmt.Printf("demo-cluster: %v\n", err)
		return 1
	}
	if _, err := image.Foreign(ctx, work); err != nil {
		fmt.Printf("demo-cluster: %v\n", err)
		return 1
	}
	fmt.Printf("  built in %s\n", time.Since(began).Round(100*time.Millisecond))
	os.Setenv(envWork, work)
	// The deadline carries over: the inner process gets what is left.
	left := time.Until(began.Add(o.timeout))
	os.Args = append([]string{os.Args[0], "--kadmit", o.kadmit, "--timeout", left.Round(time.Second).String()}, boolFlag("-v", o.verbose)...)
	code := cluster.Main(func() int { return run(o) })
	fmt.Printf("demo-cluster: %s in all, the images' build included.\n", time.Since(began).Round(time.Second))
	return code
}

func boolFlag(name string, on bool) []string {
	if on {
		return []string{name}
	}
	return nil
}

func archives() (kadmitArchive, foreignArchive string, err error) {
	work := os.Getenv(envWork)
	if work == "" {
		return "", "", fmt.Errorf("%s is not set: run democluster itself, not its re-executed self", envWork)
	}
	kadmitArchive = filepath.Join(work, "kadmit-"+imageTag+".tar")
	foreignArchive = filepath.Join(work, "foreign.tar")
	for _, a := range []string{kadmitArchive, foreignArchive} {
		if _, err := os.Stat(a); err != nil {
			return "", "", err
		}
	}
	return kadmitArchive, foreignArchive, nil
}

// lineWriter prefixes the cluster's start steps.
type lineWriter struct{}

func (lineWriter) Write(p []byte) (int, error) {
	fmt.Print("  " + strings.TrimRight(string(p), "\n") + "\n")
	return len(p), nil
}
