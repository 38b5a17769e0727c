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
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/kadmit/kadmit/internal/controlplane"
	"github.com/kadmit/kadmit/internal/controlplane/kadmitproc"
	"github.com/kadmit/kadmit/internal/netns"
)

// apiServerIP is the API server's --advertise-address, on lo inside the
// private namespace.
const apiServerIP = "198.18.0.1"

type env struct {
	tmp        string
	kadmit     string // kadmit binary (healthy install scenario)
	plugin     string // kubectl-kadmit binary
	kubeconfig string
	cp         *controlplane.ControlPlane
	client     kubernetes.Interface
	// routed is true inside the private namespace: the API server resolves
	// Services through EndpointSlices and tests may listen on 198.18.0.x.
	routed bool
}

var (
	shared     *env
	skipReason string
	setupErr   error
	// noNetnsReason explains why routed scenarios skip outside the namespace.
	noNetnsReason string
)

const setupTimeout = 6 * time.Minute

func TestMain(m *testing.M) {
	flag.Parse()
	ctrllog.SetLogger(logr.Discard())
	required := os.Getenv("KADMIT_E2E_REQUIRED") == "1"
	if !netns.Inside() {
		err := netns.Available()
		if err == nil {
			code, rerr := netns.Reexec()
			if rerr == nil {
				os.Exit(code)
			}
			err = rerr
		}
		if required {
			fmt.Fprintf(os.Stderr, "doctor e2e: FAIL: %v\n", err)
			os.Exit(1)
		}
		noNetnsReason = fmt.Sprintf("TLS and probe scenarios need a private network namespace: %v (set KADMIT_E2E_REQUIRED=1 to fail instead of skip)", err)
		fmt.Fprintln(os.Stderr, "doctor e2e: SKIP (partly):", noNetnsReason)
	}
	os.Exit(runMain(m, required))
}

func runMain(m *testing.M, required bool) int {
	if _, err := controlplane.FindBinaries(""); err != nil {
		if !errors.Is(err, controlplane.ErrBinariesMissing) || required {
			fmt.Fprintf(os.Stderr, "doctor e2e: FAIL: %v\n", err)
			return 1
		}
		skipReason = fmt.Sprintf("doctor e2e tests need a control plane: %v (set KADMIT_E2E_REQUIRED=1 to fail instead of skip)", err)
		fmt.Fprintln(os.Stderr, "doctor e2e: SKIP:", skipReason)
		return m.Run()
	}
	var once sync.Once
	e := &env{}
	teardown := func() { once.Do(e.teardown) }
	defer teardown()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		if _, ok := <-sigs; ok {
			fmt.Fprintln(os.Stderr, "doctor e2e: interrupted; stopping the control plane")
			teardown()
			os.Exit(130)
		}
	}()
	// go test -timeout panics without deferred calls; stop first.
	if f := flag.Lookup("test.timeout"); f != nil {
		if d, ok := f.Value.(flag.Getter).Get().(time.Duration); ok && d > time.Minute {
			t := time.AfterFunc(d-30*time.Second, func() {
				fmt.Fprintln(os.Stderr, "doctor e2e: test timeout approaching; stopping the control plane")
				teardown()
			})
			defer t.Stop()
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	err := e.setup(ctx)
	cancel()
	if err != nil {
		setupErr = err
		fmt.Fprintf(os.Stderr, "doctor e2e: set-up failed: %v\n", err)
	} else {
		shared = e
	}
	return m.Run()
}

func (e *env) setup(ctx context.Context) error {
	root, err := kadmitproc.RepoRoot()
	if err != nil {
		return err
	}
	if e.tmp, err = os.MkdirTemp("", "kadmit-doctor-e2e-"); err != nil {
		return fmt.Errorf("temp dir: %w", err)
	}
	e.routed = netns.Inside()
	flags := map[string]string{}
	if e.routed {
		if err := netns.AddLoopbackAddr(apiServerIP); err != nil {
			return err
		}
		flags = map[string]string{"enable-aggregator-routing": "true", "advertise-address": apiServerIP}
	}
	e.kadmit = filepath.Join(e.tmp, "kadmit")
	e.plugin = filepath.Join(e.tmp, "kubectl-kadmit")
	buildErr := make(chan error, 1)
	go func() {
		if err := kadmitproc.Build(ctx, root, e.kadmit); err != nil {
			buildErr <- err
			return
		}
		buildErr <- buildPlugin(ctx, root, e.plugin)
	}()
	cpOut, err := os.Create(filepath.Join(e.tmp, "controlplane.log"))
	if err != nil {
		return fmt.Errorf("control plane log: %w", err)
	}
	cp, cpErr := controlplane.Start(ctx, controlplane.Options{Output: cpOut, APIServerFlags: flags})
	if cpErr == nil {
		e.cp = cp
	}
	if bErr := <-buildErr; bErr != nil {
		return bErr
	}
	if cpErr != nil {
		return fmt.Errorf("%w (API server and etcd output: %s)", cpErr, cpOut.Name())
	}
	cfg := rest.CopyConfig(cp.Config)
	cfg.WarningHandler = rest.NoWarnings{}
	cfg.QPS, cfg.Burst = 100, 200
	if e.client, err = kubernetes.NewForConfig(cfg); err != nil {
		return fmt.Errorf("client: %w", err)
	}
	e.kubeconfig = filepath.Join(e.tmp, "kubeconfig")
	return cp.WriteKubeconfig(e.kubeconfig)
}

func buildPlugin(ctx context.Context, root, out string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "./cmd/kubectl-kadmit")
	cmd.Dir = root
	b, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("go build ./cmd/kubectl-kadmit: %w\n%s", err, strings.TrimSpace(string(b)))
	}
	return nil
}

func (e *env) teardown() {
	if e.cp != nil {
		if err := e.cp.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "doctor e2e: %v\n", err)
		}
	}
	if e.tmp == "" {
		return
	}
	if os.Getenv("KADMIT_E2E_KEEP") == "1" {
		fmt.Fprintf(os.Stderr, "doctor e2e: kept %s\n", e.tmp)
		return
	}
	_ = os.RemoveAll(e.tmp)
}

// world returns the shared environment, skipping or failing t when there is
// none.
func world(t *testing.T) *env {
	t.Helper()
	switch {
	case skipReason != "":
		t.Skip(skipReason)
	case setupErr != nil:
		t.Fatalf("set-up failed: %v", setupErr)
	case shared == nil:
		t.Fatal("set-up did not run")
	}
	return shared
}

// routedWorld is world for scenarios that listen on 198.18.0.x and need the
// API server to route Services to them.
func routedWorld(t *testing.T) *env {
	t.Helper()
	e := world(t)
	if !e.routed {
		t.Skip(noNetnsReason)
	}
	return e
}
