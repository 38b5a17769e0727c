// Package routed runs kadmit the way a cluster does: several `kadmit serve
// --tls=self-managed --register` replicas behind a Service, each on its own
// address, called by a real kube-apiserver that resolves the Service through
// its EndpointSlices (--enable-aggregator-routing) and verifies the serving
// certificate for kadmit.kadmit-system.svc. The test plays the kubelet (it
// starts, kills and stops the replicas) and the endpoints controller (it
// keeps the Service's EndpointSlice in step with each replica's /readyz).
//
// Everything runs inside a private network namespace (unshare --net): the
// replicas get addresses from 198.18.0.0/15 on its lo, which EndpointSlices
// accept and which never leave the machine. Without root, unshare or ip, or
// without the control plane binaries, the tests skip with the reason, unless
// KADMIT_E2E_REQUIRED=1 turns that into a failure. KADMIT_E2E_KEEP=1 keeps the
// temporary directory (replica logs, controlplane.log, kubeconfig).
package routed

import (
	"context"
	"errors"
	"flag"
	"fmt"
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
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/kadmit/kadmit/internal/controlplane"
	"github.com/kadmit/kadmit/internal/controlplane/kadmitproc"
	"github.com/kadmit/kadmit/internal/netns"
)

// The cluster's fixed names and addresses.
const (
	systemNS     = "kadmit-system"
	serviceName  = "kadmit"
	servicePort  = 443
	targetPort   = 9443
	portName     = "https"
	secretName   = "kadmit-tls"
	leaseName    = "kadmit-leader"
	serverName   = serviceName + "." + systemNS + ".svc"
	loadNS       = "kadmit-load"    // where the load creates (dry-run) pods
	ignoredNS    = "kadmit-ignored" // labelled kadmit.io/ignore=true
	apiServerIP  = "198.18.0.1"     // --advertise-address
	noListenerIP = "198.18.0.2"     // the routing sanity check's endpoint
)

// Leader-election and rotation timings given to every replica: short, so
// that a take-over or a CA rotation fits in a test.
const (
	leaseDuration = 4 * time.Second
	renewDeadline = 3 * time.Second
	retryPeriod   = time.Second
	settleDelay   = 2 * time.Second
)

// env is the world every test shares, built once by TestMain.
type env struct {
	tmp        string
	binary     string
	kubeconfig string
	cp         *controlplane.ControlPlane
	client     kubernetes.Interface // QPS raised for the load
	cluster    *cluster
}

var (
	shared     *env
	skipReason string
	setupErr   error
)

const (
	setupTimeout     = 6 * time.Minute
	replicaStopGrace = 15 * time.Second
)

func TestMain(m *testing.M) {
	flag.Parse()
	ctrllog.SetLogger(logr.Discard())
	required := os.Getenv("KADMIT_E2E_REQUIRED") == "1"
	if !netns.Inside() {
		if err := netns.Available(); err != nil && !required {
			// Run the tests anyway so that each reports SKIP with the reason
			// and `go test` shows the package as passing.
			skipReason = fmt.Sprintf("Service-routed e2e tests need a private network namespace: %v (set KADMIT_E2E_REQUIRED=1 to fail instead of skip)", err)
			fmt.Fprintln(os.Stderr, "routed: SKIP:", skipReason)
			os.Exit(m.Run())
		}
		code, err := netns.Reexec()
		if err != nil {
			fmt.Fprintf(os.Stderr, "routed: FAIL: %v\n", err)
			os.Exit(1)
		}
		os.Exit(code)
	}
	os.Exit(runMain(m, required))
}

func runMain(m *testing.M, required bool) int {
	if _, err := controlplane.FindBinaries(""); err != nil {
		if !errors.Is(err, controlplane.ErrBinariesMissing) || required {
			fmt.Fprintf(os.Stderr, "routed: FAIL: %v\n", err)
			return 1
		}
		skipReason = fmt.Sprintf("Service-routed e2e tests need a control plane: %v (set KADMIT_E2E_REQUIRED=1 to fail instead of skip)", err)
		fmt.Fprintln(os.Stderr, "routed: SKIP:", skipReason)
		return m.Run()
	}

	var teardownOnce sync.Once
	e := &env{}
	teardown := func() { teardownOnce.Do(e.teardown) }
	defer teardown()

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		if _, ok := <-sigs; ok {
			fmt.Fprintln(os.Stderr, "routed: interrupted; stopping the replicas and the control plane")
			teardown()
			os.Exit(130)
		}
	}()
	// go test -timeout panics without running deferred calls; tear down
	// shortly before, so that nothing outlives the test binary.
	if f := flag.Lookup("test.timeout"); f != nil {
		if d, ok := f.Value.(flag.Getter).Get().(time.Duration); ok && d > time.Minute {
			t := time.AfterFunc(d-30*time.Second, func() {
				fmt.Fprintln(os.Stderr, "routed: test timeout approaching; stopping the replicas and the control plane")
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
		fmt.Fprintf(os.Stderr, "routed: set-up failed: %v\n", err)
	} else {
		shared = e
	}
	code := m.Run()
	if code != 0 && e.cluster != nil {
		e.cluster.dumpLogs(os.Stderr, 30)
	}
	return code
}

func (e *env) setup(ctx context.Context) error {
	root, err := kadmitproc.RepoRoot()
	if err != nil {
		return err
	}
	if e.tmp, err = os.MkdirTemp("", "kadmit-routed-"); err != nil {
		return fmt.Errorf("temp dir: %w", err)
	}
	for _, ip := range []string{apiServerIP, noListenerIP} {
		if err := netns.AddLoopbackAddr(ip); err != nil {
			return err
		}
	}
	e.binary = filepath.Join(e.tmp, "kadmit")
	buildErr := make(chan error, 1)
	go func() { buildErr <- kadmitproc.Build(ctx, root, e.binary) }()

	cpOut, err := os.Create(filepath.Join(e.tmp, "controlplane.log"))
	if err != nil {
		return fmt.Errorf("control plane log: %w", err)
	}
	// The secure port stays on 127.0.0.1 (the kubeconfig's URL); the
	// advertise address only has to be non-loopback for the endpoint
	// reconciler of the "kubernetes" Service.
	cp, cpErr := controlplane.Start(ctx, controlplane.Options{Output: cpOut, APIServerFlags: map[string]string{
		"enable-aggregator-routing": "true",
		"advertise-address":         apiServerIP,
	}})
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
	// client-go's default 5 QPS would throttle the 20 pod creations per
	// second of the load, and the endpoints controller besides.
	cfg.QPS, cfg.Burst = 200, 400
	if e.client, err = kubernetes.NewForConfig(cfg); err != nil {
		return fmt.Errorf("client: %w", err)
	}
	e.kubeconfig = filepath.Join(e.tmp, "kubeconfig")
	if err := cp.WriteKubeconfig(e.kubeconfig); err != nil {
		return err
	}

	for _, ns := range []*corev1.Namespace{
		{ObjectMeta: metav1.ObjectMeta{Name: systemNS}},
		{ObjectMeta: metav1.ObjectMeta{Name: loadNS}},
		{ObjectMeta: metav1.ObjectMeta{Name: ignoredNS, Labels: map[string]string{"kadmit.io/ignore": "true"}}},
	} {
		if _, err := e.client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create namespace %s: %w", ns.Name, err)
		}
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: serviceName, Namespace: systemNS},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "kadmit"},
			Ports: []corev1.ServicePort{{Name: portName, Port: servicePort, TargetPort: intstr.FromInt32(targetPort),
				Protocol: corev1.ProtocolTCP}},
		},
	}
	if _, err := e.client.CoreV1().Services(systemNS).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create Service: %w", err)
	}
	e.cluster = newCluster(e)
	e.cluster.startEndpointsController()
	return nil
}

// teardown stops every replica (SIGTERM) and the control plane and removes
// the temporary directory. Every step is bounded.
func (e *env) teardown() {
	if e.cluster != nil {
		e.cluster.shutdown()
	}
	if e.cp != nil {
		if err := e.cp.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "routed: %v\n", err)
		}
	}
	if e.tmp == "" {
		return
	}
	if os.Getenv("KADMIT_E2E_KEEP") == "1" {
		fmt.Fprintf(os.Stderr, "routed: kept %s\n", e.tmp)
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

// testCtx bounds one test.
func testCtx(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}
