// Package e2e runs kadmit as a separate process against a real kube-apiserver
// and etcd on loopback, registered by kadmit itself, and checks what the API
// server stores or refuses. Nothing is mocked: if these pass, a cluster
// configured the same way behaves the same.
//
// Run with `go test ./test/e2e/...` after `make controlplane`. Without the
// control plane binaries the tests skip, unless KADMIT_E2E_REQUIRED=1, which
// turns their absence into a failure (for CI). KADMIT_E2E_KEEP=1 keeps the
// temporary directory (kadmit.log, controlplane.log, kubeconfig) for a
// post-mortem; its path is printed.
package e2e

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/kadmit/kadmit/internal/controlplane"
	"github.com/kadmit/kadmit/internal/controlplane/kadmitproc"
)

// env is the shared world every test runs in, built once by TestMain.
type env struct {
	repoRoot  string
	tmp       string
	binary    string // the kadmit executable built for this run
	cp        *controlplane.ControlPlane
	client    kubernetes.Interface
	kadmit    *kadmitproc.Process
	namespace string // a fresh namespace for this run's pods
}

var (
	shared *env
	// skipReason, when set, makes every test skip with it.
	skipReason string
	// setupErr, when set, makes every test fail with it: the harness broke,
	// which must not pass for a skip.
	setupErr error
)

// Bounds of the set-up steps. Generous, since a cold kube-apiserver and a
// cold `go build` on a two-core machine take tens of seconds each.
const (
	setupTimeout     = 6 * time.Minute
	kadmitStopGrace  = 30 * time.Second
	kadmitReadyLimit = 60 * time.Second
)

func TestMain(m *testing.M) {
	flag.Parse()
	// envtest logs through controller-runtime's global logger, which nags
	// with a stack trace on stderr when left unset.
	ctrllog.SetLogger(logr.Discard())
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	required := os.Getenv("KADMIT_E2E_REQUIRED") == "1"
	if _, err := controlplane.FindBinaries(""); err != nil {
		if !errors.Is(err, controlplane.ErrBinariesMissing) || required {
			fmt.Fprintf(os.Stderr, "e2e: FAIL: %v\n", err)
			return 1
		}
		skipReason = fmt.Sprintf("e2e tests need a control plane: %v (set KADMIT_E2E_REQUIRED=1 to fail instead of skip)", err)
		fmt.Fprintln(os.Stderr, "e2e: SKIP:", skipReason)
		return m.Run()
	}

	var teardownOnce sync.Once
	e := &env{}
	teardown := func() { teardownOnce.Do(func() { e.teardown() }) }
	defer teardown()

	// The API server and etcd run in their own process group, so Ctrl-C on
	// `go test` does not reach them; end them here instead.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		if _, ok := <-sigs; ok {
			fmt.Fprintln(os.Stderr, "e2e: interrupted; stopping kadmit and the control plane")
			teardown()
			os.Exit(130)
		}
	}()
	// go test -timeout panics the binary without running deferred calls;
	// tear down shortly before that so the control plane does not outlive it.
	if f := flag.Lookup("test.timeout"); f != nil {
		if d, ok := f.Value.(flag.Getter).Get().(time.Duration); ok && d > time.Minute {
			t := time.AfterFunc(d-30*time.Second, func() {
				fmt.Fprintln(os.Stderr, "e2e: test timeout approaching; stopping kadmit and the control plane")
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
		fmt.Fprintf(os.Stderr, "e2e: set-up failed: %v\n", err)
	} else {
		shared = e
	}
	code := m.Run()
	if code != 0 && e.kadmit != nil {
		fmt.Fprintf(os.Stderr, "e2e: kadmit's last log lines:\n%s\n", e.kadmit.Tail(40))
	}
	return code
}

func (e *env) setup(ctx context.Context) error {
	root, err := kadmitproc.RepoRoot()
	if err != nil {
		return err
	}
	e.repoRoot = root
	if e.tmp, err = os.MkdirTemp("", "kadmit-e2e-"); err != nil {
		return fmt.Errorf("temp dir: %w", err)
	}
	e.binary = filepath.Join(e.tmp, "kadmit")

	// Building kadmit and starting the control plane are independent and
	// each takes a while; overlap them.
	buildErr := make(chan error, 1)
	go func() { buildErr <- kadmitproc.Build(ctx, e.repoRoot, e.binary) }()

	cpOut, err := os.Create(filepath.Join(e.tmp, "controlplane.log"))
	if err != nil {
		return fmt.Errorf("control plane log: %w", err)
	}
	cp, cpErr := controlplane.Start(ctx, controlplane.Options{Output: cpOut})
	if bErr := <-buildErr; bErr != nil {
		if cpErr == nil {
			e.cp = cp
		}
		return bErr
	}
	if cpErr != nil {
		return fmt.Errorf("%w (API server and etcd output: %s)", cpErr, cpOut.Name())
	}
	e.cp = cp
	// Warnings (kadmit sends some) would go to stderr through klog and
	// clutter the test output; the tests assert on errors and stored objects.
	cfg := rest.CopyConfig(cp.Config)
	cfg.WarningHandler = rest.NoWarnings{}
	if e.client, err = kubernetes.NewForConfig(cfg); err != nil {
		return fmt.Errorf("client: %w", err)
	}

	kubeconfig := filepath.Join(e.tmp, "kubeconfig")
	if err := cp.WriteKubeconfig(kubeconfig); err != nil {
		return err
	}
	addr, err := kadmitproc.FreeAddr()
	if err != nil {
		return err
	}
	metricsAddr, err := kadmitproc.FreeAddr()
	if err != nil {
		return err
	}
	logFile, err := os.Create(filepath.Join(e.tmp, "kadmit.log"))
	if err != nil {
		return fmt.Errorf("kadmit log: %w", err)
	}
	e.kadmit, err = kadmitproc.Start(kadmitproc.Options{
		Binary:      e.binary,
		Addr:        addr,
		MetricsAddr: metricsAddr,
		CAFile:      filepath.Join(e.tmp, "ca.crt"),
		Kubeconfig:  kubeconfig,
		Log:         logFile,
	})
	if err != nil {
		return err
	}

	readyCtx, cancel := context.WithTimeout(ctx, kadmitReadyLimit)
	defer cancel()
	if err := e.kadmit.WaitReady(readyCtx); err != nil {
		return err
	}
	if _, _, err := e.kadmit.WaitRegistered(readyCtx, e.client); err != nil {
		return err
	}

	e.namespace = fmt.Sprintf("kadmit-e2e-%06d", rand.IntN(1_000_000))
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e.namespace}}
	if _, err := e.client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create namespace %s: %w", e.namespace, err)
	}
	return e.kadmit.WaitEffective(readyCtx, e.client, e.namespace)
}

// teardown ends kadmit (SIGTERM, as in production) and the control plane and
// removes the temporary directory. Every step is bounded; it runs once.
func (e *env) teardown() {
	if e.kadmit != nil {
		code, took, err := e.kadmit.Terminate(kadmitStopGrace)
		switch {
		case err != nil:
			fmt.Fprintf(os.Stderr, "e2e: stopping kadmit: %v\n", err)
		case code != 0:
			fmt.Fprintf(os.Stderr, "e2e: kadmit exited with code %d after SIGTERM (%s)\n", code, took)
		}
	}
	if e.cp != nil {
		if err := e.cp.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
		}
	}
	if e.tmp == "" {
		return
	}
	if os.Getenv("KADMIT_E2E_KEEP") == "1" {
		fmt.Fprintf(os.Stderr, "e2e: kept %s\n", e.tmp)
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
		t.Fatalf("e2e set-up failed: %v", setupErr)
	case shared == nil:
		t.Fatal("e2e set-up did not run")
	}
	return shared
}

// testCtx bounds one test's API calls.
func testCtx(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}
