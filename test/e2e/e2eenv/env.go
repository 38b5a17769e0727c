package e2eenv

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kadmit/kadmit/test/controlplane"
	"github.com/kadmit/kadmit/test/controlplane/kadmitproc"
	"github.com/kadmit/kadmit/test/netns"
)

// APIServerIP is the API server's --advertise-address, on lo inside the
// private network namespace. The secure port stays on 127.0.0.1 (the
// kubeconfig's URL); the advertise address only has to be non-loopback for
// the endpoint reconciler of the "kubernetes" Service.
const APIServerIP = "198.18.0.1"

// Env is the base environment of a suite, built once by Suite.Main. Its
// fields are set before Suite.Setup runs and stay valid until teardown.
type Env struct {
	// RepoRoot is the module's root directory.
	RepoRoot string
	// Tmp is the run's temporary directory: binaries, logs, kubeconfig.
	Tmp string
	// Binary is the kadmit executable built for this run.
	Binary string
	// Kubeconfig is a kubeconfig file for the control plane (user admin).
	Kubeconfig string
	// CP is the running kube-apiserver and etcd.
	CP *controlplane.ControlPlane
	// Config is CP's client configuration with warnings discarded (kadmit
	// sends some; the tests assert on errors and stored objects) and the
	// suite's QPS and Burst.
	Config *rest.Config
	// Client is a clientset for Config.
	Client kubernetes.Interface
	// Routed is true inside the private network namespace: the API server
	// resolves Services through their EndpointSlices and tests may listen
	// on 198.18.0.0/15.
	Routed bool
	// Kadmit is the `kadmit serve` StartKadmit started, if it ran.
	Kadmit *kadmitproc.Process

	suite *Suite
}

// setup builds the base environment: builds kadmit (and the suite's
// Commands) while the control plane starts, then runs the suite's Setup.
func (e *Env) setup(ctx context.Context) error {
	s := e.suite
	root, err := kadmitproc.RepoRoot()
	if err != nil {
		return err
	}
	e.RepoRoot = root
	if e.Tmp, err = os.MkdirTemp("", "kadmit-"+strings.ReplaceAll(s.Name, " ", "-")+"-"); err != nil {
		return fmt.Errorf("temp dir: %w", err)
	}
	e.Routed = s.Netns != NoNetns && netns.Inside()
	var flags map[string]string
	if e.Routed {
		for _, ip := range append([]string{APIServerIP}, s.LoopbackAddrs...) {
			if err := netns.AddLoopbackAddr(ip); err != nil {
				return err
			}
		}
		flags = map[string]string{"enable-aggregator-routing": "true", "advertise-address": APIServerIP}
	}

	// Building and starting the control plane are independent and each
	// takes a while; overlap them.
	e.Binary = filepath.Join(e.Tmp, "kadmit")
	buildErr := make(chan error, 1)
	go func() {
		if err := kadmitproc.Build(ctx, root, e.Binary); err != nil {
			buildErr <- err
			return
		}
		for _, name := range s.Commands {
			if err := BuildCommand(ctx, root, name, e.Command(name)); err != nil {
				buildErr <- err
				return
			}
		}
		buildErr <- nil
	}()
	cpOut, err := os.Create(filepath.Join(e.Tmp, "controlplane.log"))
	if err != nil {
		return fmt.Errorf("control plane log: %w", err)
	}
	cp, cpErr := controlplane.Start(ctx, controlplane.Options{Output: cpOut, APIServerFlags: flags})
	if cpErr == nil {
		e.CP = cp
	}
	if bErr := <-buildErr; bErr != nil {
		return bErr
	}
	if cpErr != nil {
		return fmt.Errorf("%w (API server and etcd output: %s; its last lines:\n%s)", cpErr, cpOut.Name(), logTail(cpOut.Name(), 40))
	}

	e.Config = rest.CopyConfig(cp.Config)
	e.Config.WarningHandler = rest.NoWarnings{}
	if s.QPS > 0 {
		e.Config.QPS, e.Config.Burst = s.QPS, s.Burst
	}
	if e.Client, err = kubernetes.NewForConfig(e.Config); err != nil {
		return fmt.Errorf("client: %w", err)
	}
	e.Kubeconfig = filepath.Join(e.Tmp, "kubeconfig")
	if err := cp.WriteKubeconfig(e.Kubeconfig); err != nil {
		return err
	}
	if s.Setup != nil {
		return s.Setup(ctx, e)
	}
	return nil
}

// Command is the path of the binary built from ./cmd/<name> (Suite.Commands).
func (e *Env) Command(name string) string { return filepath.Join(e.Tmp, name) }

// BuildCommand compiles ./cmd/<name> of the module at root into out. The
// compiler's output is part of the error.
func BuildCommand(ctx context.Context, root, name, out string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "./cmd/"+name)
	cmd.Dir = root
	b, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("go build ./cmd/%s: %w\n%s", name, err, strings.TrimSpace(string(b)))
	}
	return nil
}

// StartKadmit starts `kadmit serve` with a self-signed certificate on free
// loopback ports, registered with the control plane through Kubeconfig, with
// args appended and its log in Tmp/kadmit.log, as Env.Kadmit. It returns once
// kadmit is ready and its webhook configurations are registered, or when ctx
// ends; the caller then checks the webhooks take effect
// (Kadmit.WaitEffective) in a namespace of its choosing.
func (e *Env) StartKadmit(ctx context.Context, args ...string) error {
	addr, metricsAddr, err := FreeAddrs()
	if err != nil {
		return err
	}
	logFile, err := os.Create(filepath.Join(e.Tmp, "kadmit.log"))
	if err != nil {
		return fmt.Errorf("kadmit log: %w", err)
	}
	e.Kadmit, err = kadmitproc.Start(kadmitproc.Options{
		Binary:      e.Binary,
		Addr:        addr,
		MetricsAddr: metricsAddr,
		CAFile:      filepath.Join(e.Tmp, "ca.crt"),
		Kubeconfig:  e.Kubeconfig,
		Log:         logFile,
		ExtraArgs:   args,
	})
	if err != nil {
		return err
	}
	if err := e.Kadmit.WaitReady(ctx); err != nil {
		return err
	}
	_, _, err = e.Kadmit.WaitRegistered(ctx, e.Client)
	return err
}

// FreeAddrs returns two free loopback addresses for a kadmit process
// (see kadmitproc.FreeAddrs).
func FreeAddrs() (addr, metricsAddr string, err error) { return kadmitproc.FreeAddrs() }

// teardown ends the suite's processes (Suite.Stop), kadmit (SIGTERM, as in
// production) and the control plane, and removes the temporary directory
// unless KADMIT_E2E_KEEP=1. Every step is bounded; Suite.Main runs it once.
func (e *Env) teardown() {
	name := e.suite.Name
	if e.suite.Stop != nil {
		e.suite.Stop()
	}
	if e.Kadmit != nil {
		code, took, err := e.Kadmit.Terminate(KadmitStopGrace)
		switch {
		case err != nil:
			fmt.Fprintf(os.Stderr, "%s: stopping kadmit: %v\n", name, err)
		case code != 0:
			fmt.Fprintf(os.Stderr, "%s: kadmit exited with code %d after SIGTERM (%s)\n", name, code, took)
		}
	}
	if e.CP != nil {
		if err := e.CP.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		}
	}
	if e.Tmp == "" {
		return
	}
	if os.Getenv("KADMIT_E2E_KEEP") == "1" {
		fmt.Fprintf(os.Stderr, "%s: kept %s\n", name, e.Tmp)
		return
	}
	_ = os.RemoveAll(e.Tmp)
}

// logTail returns at most the last n lines of the file at path (reading at
// most its last 64 KiB), for an error that must explain itself after the
// temporary directory is gone, as on CI.
func logTail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	defer f.Close()
	const maxRead = 64 << 10
	if fi, err := f.Stat(); err == nil && fi.Size() > maxRead {
		_, _ = f.Seek(fi.Size()-maxRead, io.SeekStart)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxRead))
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
