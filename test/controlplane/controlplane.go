// Package controlplane runs a real kube-apiserver and etcd on loopback for
// kadmit's end-to-end tests and demo. It wraps controller-runtime's envtest so
// callers get a started API server, an admin client and a kubeconfig file that
// a separate process (kadmit serve --kubeconfig) can use, without knowing
// envtest's knobs.
//
// The binaries are not downloaded: `make controlplane` (hack/controlplane.sh)
// builds them from source into a cache directory, which Start reads.
package controlplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// KubeVersion is the kube-apiserver version hack/controlplane.sh builds and
// the default cache directory is named after.
const KubeVersion = "v1.37.1"

// EnvDir names the environment variable that overrides the binary directory;
// hack/controlplane.sh honours the same variable, so both agree on one place.
const EnvDir = "KADMIT_CONTROLPLANE_DIR"

// Binaries Start needs in the directory.
const (
	APIServerBinary = "kube-apiserver"
	EtcdBinary      = "etcd"
)

const (
	defaultStartTimeout = 90 * time.Second
	defaultStopTimeout  = 30 * time.Second
)

// ErrBinariesMissing matches (errors.Is) the error Start and FindBinaries
// return when kube-apiserver or etcd is not in the directory, so callers such
// as a test's TestMain can skip rather than fail.
var ErrBinariesMissing = errors.New("control plane binaries missing")

// Options configure Start. The zero value is usable.
type Options struct {
	// Dir holds the kube-apiserver and etcd binaries. Empty means DefaultDir().
	Dir string
	// StartTimeout bounds the start of each of etcd and kube-apiserver;
	// default 90s, because a cold kube-apiserver on a small machine takes tens
	// of seconds to become healthy.
	StartTimeout time.Duration
	// StopTimeout bounds the stop of each process; default 30s.
	StopTimeout time.Duration
	// Output, when set, receives the stdout and stderr of both processes;
	// nil discards them.
	Output io.Writer
	// APIServerFlags are extra kube-apiserver flags, without the leading
	// dashes, e.g. {"enable-aggregator-routing": "true", "advertise-address":
	// "198.18.0.1"}. They are set after, and so override, the defaults.
	APIServerFlags map[string]string
}

// ControlPlane is a running etcd and kube-apiserver on 127.0.0.1. Its fields
// are valid between Start and Stop.
type ControlPlane struct {
	// Config authenticates as user "admin" in group system:masters.
	Config *rest.Config
	// Client is a typed clientset built from Config.
	Client kubernetes.Interface
	// Dir is the directory the binaries were taken from.
	Dir string

	env      *envtest.Environment
	stopOnce sync.Once
	stopErr  error
}

// DefaultDir returns $KADMIT_CONTROLPLANE_DIR when set, otherwise
// ~/.cache/kadmit/controlplane/<KubeVersion>, the directory
// hack/controlplane.sh builds into. It fails only when the home directory is
// unknown and the variable is unset.
func DefaultDir() (string, error) {
	if d := os.Getenv(EnvDir); d != "" {
		return d, nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("controlplane: locate the binary cache: set %s: %w", EnvDir, err)
	}
	return filepath.Join(home, ".cache", "kadmit", "controlplane", KubeVersion), nil
}

// FindBinaries resolves dir (empty means DefaultDir()) and checks that it
// holds executable kube-apiserver and etcd files. It returns the directory, or
// an error matching ErrBinariesMissing that tells the user to run
// `make controlplane`.
func FindBinaries(dir string) (string, error) {
	if dir == "" {
		d, err := DefaultDir()
		if err != nil {
			return "", err
		}
		dir = d
	}
	for _, name := range []string{APIServerBinary, EtcdBinary} {
		p := filepath.Join(dir, name)
		fi, err := os.Stat(p)
		if err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			continue
		}
		reason := "not executable"
		if err != nil {
			reason = err.Error()
		}
		return "", fmt.Errorf("%w: %s (%s); run `make controlplane` (hack/controlplane.sh) to build kube-apiserver %s and etcd into %s, or set %s",
			ErrBinariesMissing, p, reason, KubeVersion, dir, EnvDir)
	}
	return dir, nil
}

// startAttempts bounds how many fresh environments Start tries. envtest's own
// retry reuses the exited process state and the same ports, so after one
// failed kube-apiserver start its further tries fail at once; a new
// environment on new ports is what can succeed.
const startAttempts = 3

// Start launches etcd and kube-apiserver from opts.Dir on free 127.0.0.1
// ports and returns once the API server serves the default namespace. The
// ServiceAccount admission plugin is disabled, since no controller creates the
// default ServiceAccount that pods would otherwise need. A start that fails
// (a process exits, or a port picked here was taken before the process bound
// it) is retried with a new environment on new ports, at most startAttempts
// times in all; each attempt is headed by a line in opts.Output.
//
// Errors: one matching ErrBinariesMissing when a binary is absent; ctx.Err()
// (wrapped) when ctx ends first, after stopping whatever was started; the
// last attempt's start failure, wrapped, with the number of attempts. On error
// nothing is left running.
func Start(ctx context.Context, opts Options) (*ControlPlane, error) {
	dir, err := FindBinaries(opts.Dir)
	if err != nil {
		return nil, err
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = defaultStartTimeout
	}
	if opts.StopTimeout <= 0 {
		opts.StopTimeout = defaultStopTimeout
	}
	out := opts.Output
	if out == nil {
		out = io.Discard
	}
	var lastErr error
	for attempt := 1; attempt <= startAttempts; attempt++ {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("controlplane: start: %w", err)
		}
		fmt.Fprintf(out, "controlplane: start attempt %d of %d\n", attempt, startAttempts)
		cp, err := startOnce(ctx, dir, opts)
		if err == nil {
			return cp, nil
		}
		if ctx.Err() != nil {
			return nil, err
		}
		fmt.Fprintf(out, "controlplane: start attempt %d failed: %v\n", attempt, err)
		lastErr = err
	}
	return nil, fmt.Errorf("controlplane: start kube-apiserver and etcd from %s (%d attempts, each on new ports): %w", dir, startAttempts, lastErr)
}

// startOnce starts one envtest environment on newly picked ports; on error
// nothing it started is left running.
func startOnce(ctx context.Context, dir string, opts Options) (*ControlPlane, error) {
	apiPort, err := freeLoopbackPort()
	if err != nil {
		return nil, err
	}
	etcdPort, err := freeLoopbackPort()
	if err != nil {
		return nil, err
	}

	api := &envtest.APIServer{
		SecureServing: envtest.SecureServing{
			ListenAddr: envtest.ListenAddr{Address: "127.0.0.1", Port: strconv.Itoa(apiPort)},
		},
		Out: opts.Output,
		Err: opts.Output,
	}
	// envtest already disables it by default; saying so here keeps pod
	// creation working should that default ever change.
	api.Configure().Set("disable-admission-plugins", "ServiceAccount")
	for k, v := range opts.APIServerFlags {
		api.Configure().Set(k, v)
	}

	etcd := &envtest.Etcd{
		Out: opts.Output,
		Err: opts.Output,
	}
	etcd.URL = &url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(etcdPort))}

	env := &envtest.Environment{
		BinaryAssetsDirectory:    dir,
		ControlPlane:             envtest.ControlPlane{APIServer: api, Etcd: etcd},
		ControlPlaneStartTimeout: opts.StartTimeout,
		ControlPlaneStopTimeout:  opts.StopTimeout,
	}
	// Explicit paths so that TEST_ASSET_* or KUBEBUILDER_ASSETS in the
	// environment cannot swap in other binaries behind the caller's back.
	api.Path = filepath.Join(dir, APIServerBinary)
	etcd.Path = filepath.Join(dir, EtcdBinary)

	// envtest.Start takes no context; run it aside so a cancelled ctx
	// returns promptly, but still wait for it so nothing is left running.
	type result struct {
		cfg *rest.Config
		err error
	}
	done := make(chan result, 1)
	go func() {
		cfg, err := env.Start()
		done <- result{cfg, err}
	}()

	var res result
	select {
	case res = <-done:
	case <-ctx.Done():
		// envtest bounds each start attempt by StartTimeout, so this wait ends.
		<-done
		_ = env.Stop()
		return nil, fmt.Errorf("controlplane: start: %w", ctx.Err())
	}
	if res.err != nil {
		// A partial start (etcd up, API server not) still has processes to end.
		_ = env.Stop()
		return nil, fmt.Errorf("api server on 127.0.0.1:%d, etcd on 127.0.0.1:%d: %w", apiPort, etcdPort, res.err)
	}

	client, err := kubernetes.NewForConfig(res.cfg)
	if err != nil {
		_ = env.Stop()
		return nil, fmt.Errorf("controlplane: build client: %w", err)
	}
	return &ControlPlane{Config: res.cfg, Client: client, Dir: dir, env: env}, nil
}

// Kubeconfig returns a kubeconfig (YAML) for the admin user: the API server's
// https://127.0.0.1:<port> URL, its CA and a client certificate, all inline.
func (c *ControlPlane) Kubeconfig() ([]byte, error) {
	user, err := c.env.AddUser(envtest.User{Name: "admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return nil, fmt.Errorf("controlplane: provision admin user: %w", err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		return nil, fmt.Errorf("controlplane: render kubeconfig: %w", err)
	}
	return kc, nil
}

// WriteKubeconfig writes Kubeconfig() to path with mode 0600, since it holds a
// client key with cluster-admin rights. The parent directory must exist.
func (c *ControlPlane) WriteKubeconfig(path string) error {
	kc, err := c.Kubeconfig()
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, kc, 0o600); err != nil {
		return fmt.Errorf("controlplane: write kubeconfig: %w", err)
	}
	return nil
}

// Stop ends kube-apiserver and etcd and removes their temporary directories.
// It is safe to call more than once; later calls return the first result.
func (c *ControlPlane) Stop() error {
	c.stopOnce.Do(func() {
		if err := c.env.Stop(); err != nil {
			c.stopErr = fmt.Errorf("controlplane: stop: %w", err)
		}
	})
	return c.stopErr
}

// freeLoopbackPort asks the kernel for a free 127.0.0.1 port. Another process
// may take it before the API server binds; envtest retries a failed start.
func freeLoopbackPort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("controlplane: find a free loopback port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
