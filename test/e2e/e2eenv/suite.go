// Package e2eenv is the harness the end-to-end suites under test/e2e share.
//
// A Suite is one package's TestMain: it skips every test, or fails the run
// when KADMIT_E2E_REQUIRED=1, without the control plane binaries (or without
// a private network namespace, for suites that want one); it re-executes the
// test binary inside that namespace; it builds the base environment (Env) once
// and tears it down on return, on SIGINT or SIGTERM, and shortly before
// `go test -timeout` would panic the binary, so that no API server, etcd or
// kadmit outlives the run. KADMIT_E2E_KEEP=1 keeps the temporary directory
// (logs, kubeconfig) for a post-mortem; its path is printed.
//
// Env is what every suite builds on: a temporary directory, the kadmit binary
// built for this run, a real kube-apiserver and etcd on loopback with a client
// and a kubeconfig, and optionally one `kadmit serve` process (StartKadmit).
// Inside the private network namespace the API server advertises APIServerIP
// and routes Services through their EndpointSlices
// (--enable-aggregator-routing), so webhooks may be served on 198.18.0.0/15
// addresses on lo without any traffic leaving the machine.
package e2eenv

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/kadmit/kadmit/test/controlplane"
	"github.com/kadmit/kadmit/test/netns"
)

// Netns says whether a suite runs in a private network namespace
// (test/netns).
type Netns int

const (
	// NoNetns runs the suite on the host's loopback only.
	NoNetns Netns = iota
	// NetnsPreferred re-executes the suite inside a private network
	// namespace when one can be made. When not, the suite runs outside with
	// Env.Routed false, and Suite.Routed skips the tests that need it,
	// unless KADMIT_E2E_REQUIRED=1 turns that into a failure of the run.
	NetnsPreferred
	// NetnsRequired re-executes the suite inside a private network
	// namespace; without one every test skips, or the run fails when
	// KADMIT_E2E_REQUIRED=1 (or when the re-execution itself fails).
	NetnsRequired
)

// Bounds of the harness's own steps. Generous, since a cold kube-apiserver
// and a cold `go build` on a two-core machine take tens of seconds each.
const (
	// SetupTimeout bounds the whole set-up: builds, control plane and the
	// suite's own Setup.
	SetupTimeout = 6 * time.Minute
	// KadmitStopGrace bounds the SIGTERM of the kadmit StartKadmit started.
	KadmitStopGrace = 30 * time.Second
	// timeoutMargin is how long before `go test -timeout` expires the
	// harness tears down.
	timeoutMargin = 30 * time.Second
)

// Suite is one e2e package's harness. Declare it as a package variable,
// call Main from TestMain, and get the environment in each test with Env (or
// Routed); keep the suite's own state in the package, set by Setup.
type Suite struct {
	// Name prefixes the harness's messages on stderr ("routed: SKIP: ...")
	// and names the temporary directory (kadmit-<name>-*).
	Name string
	// Subject names the suite's tests in skip reasons ("<Subject> need a
	// control plane"); empty means Name + " tests".
	Subject string
	// Netns selects whether the suite runs in a private network namespace.
	Netns Netns
	// NetnsNeeds names what needs the namespace under NetnsPreferred, for
	// the skip reason ("TLS and probe scenarios").
	NetnsNeeds string
	// LoopbackAddrs are put on lo inside the namespace besides APIServerIP.
	LoopbackAddrs []string
	// QPS and Burst raise the client's rate limits; zero keeps client-go's.
	QPS   float32
	Burst int
	// Commands are further ./cmd/<name> packages built into Env.Command(name)
	// next to kadmit, e.g. "kubectl-kadmit".
	Commands []string
	// Setup, when set, builds the suite's own world once the base
	// environment is up: namespaces, CRDs, kadmit (StartKadmit), replicas.
	// A failure fails every test. It runs within SetupTimeout.
	Setup func(ctx context.Context, e *Env) error
	// Stop, when set, ends the suite's own processes at teardown, before the
	// kadmit from StartKadmit and the control plane stop.
	Stop func()
	// PostMortem, when set, writes what helps explain failed tests (the
	// logs of the suite's own processes) to w. The last lines of kadmit's
	// log, when StartKadmit ran, are written regardless.
	PostMortem func(w io.Writer)

	env           *Env
	skipReason    string // every test skips with it
	setupErr      error  // every test fails with it: the harness broke
	noNetnsReason string // why Routed skips, under NetnsPreferred
}

// Main runs the suite: call it from TestMain as os.Exit(suite.Main(m)). It
// parses the flags, re-executes inside a private network namespace when the
// suite asks for one, builds the environment, runs the tests and tears the
// environment down. It returns the exit code.
func (s *Suite) Main(m *testing.M) int {
	flag.Parse()
	// envtest logs through controller-runtime's global logger, which nags
	// with a stack trace on stderr when left unset.
	ctrllog.SetLogger(logr.Discard())
	required := os.Getenv("KADMIT_E2E_REQUIRED") == "1"
	if s.Netns != NoNetns && !netns.Inside() {
		if code, done := s.reexec(m, required); done {
			return code
		}
	}
	return s.run(m, required)
}

// reexec re-runs the test binary inside a private network namespace and
// returns its exit code with done true, or, when the namespace cannot be
// made, decides between failing, skipping every test (done true) and running
// here without it (done false).
func (s *Suite) reexec(m *testing.M, required bool) (code int, done bool) {
	if s.Netns == NetnsRequired {
		if err := netns.Available(); err != nil && !required {
			// Run the tests anyway so that each reports SKIP with the reason
			// and `go test` shows the package as passing.
			s.skipReason = fmt.Sprintf("%s need a private network namespace: %v (set KADMIT_E2E_REQUIRED=1 to fail instead of skip)", s.subject(), err)
			fmt.Fprintf(os.Stderr, "%s: SKIP: %s\n", s.Name, s.skipReason)
			return m.Run(), true
		}
		code, err := netns.Reexec()
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: FAIL: %v\n", s.Name, err)
			return 1, true
		}
		return code, true
	}
	err := netns.Available()
	if err == nil {
		code, rerr := netns.Reexec()
		if rerr == nil {
			return code, true
		}
		err = rerr
	}
	if required {
		fmt.Fprintf(os.Stderr, "%s: FAIL: %v\n", s.Name, err)
		return 1, true
	}
	s.noNetnsReason = fmt.Sprintf("%s need a private network namespace: %v (set KADMIT_E2E_REQUIRED=1 to fail instead of skip)", s.NetnsNeeds, err)
	fmt.Fprintf(os.Stderr, "%s: SKIP (partly): %s\n", s.Name, s.noNetnsReason)
	return 0, false
}

// run checks for the control plane binaries, sets up, runs the tests and
// tears down, also on a signal or an approaching test timeout.
func (s *Suite) run(m *testing.M, required bool) int {
	if _, err := controlplane.FindBinaries(""); err != nil {
		if !errors.Is(err, controlplane.ErrBinariesMissing) || required {
			fmt.Fprintf(os.Stderr, "%s: FAIL: %v\n", s.Name, err)
			return 1
		}
		s.skipReason = fmt.Sprintf("%s need a control plane: %v (set KADMIT_E2E_REQUIRED=1 to fail instead of skip)", s.subject(), err)
		fmt.Fprintf(os.Stderr, "%s: SKIP: %s\n", s.Name, s.skipReason)
		return m.Run()
	}

	e := &Env{suite: s}
	var once sync.Once
	teardown := func() { once.Do(e.teardown) }
	defer teardown()

	// The API server and etcd run in their own process group, so Ctrl-C on
	// `go test` does not reach them; end them here instead.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		if _, ok := <-sigs; ok {
			fmt.Fprintf(os.Stderr, "%s: interrupted; stopping kadmit and the control plane\n", s.Name)
			teardown()
			os.Exit(130)
		}
	}()
	// go test -timeout panics the binary without running deferred calls;
	// tear down shortly before that so that nothing outlives it.
	if f := flag.Lookup("test.timeout"); f != nil {
		if d, ok := f.Value.(flag.Getter).Get().(time.Duration); ok && d > time.Minute {
			t := time.AfterFunc(d-timeoutMargin, func() {
				fmt.Fprintf(os.Stderr, "%s: test timeout approaching; stopping kadmit and the control plane\n", s.Name)
				teardown()
			})
			defer t.Stop()
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), SetupTimeout)
	err := e.setup(ctx)
	cancel()
	if err != nil {
		s.setupErr = err
		fmt.Fprintf(os.Stderr, "%s: set-up failed: %v\n", s.Name, err)
	} else {
		s.env = e
	}
	code := m.Run()
	if code != 0 {
		if e.Kadmit != nil {
			fmt.Fprintf(os.Stderr, "%s: kadmit's last log lines:\n%s\n", s.Name, e.Kadmit.Tail(40))
		}
		if s.PostMortem != nil {
			s.PostMortem(os.Stderr)
		}
	}
	return code
}

// Env returns the environment, skipping t when the suite cannot run here
// and failing it when the set-up failed.
func (s *Suite) Env(t *testing.T) *Env {
	t.Helper()
	switch {
	case s.skipReason != "":
		t.Skip(s.skipReason)
	case s.setupErr != nil:
		t.Fatalf("%s set-up failed: %v", s.Name, s.setupErr)
	case s.env == nil:
		t.Fatalf("%s set-up did not run", s.Name)
	}
	return s.env
}

// Routed is Env for tests that need the private network namespace: they
// listen on 198.18.0.0/15 and need the API server to route Services to
// them. Outside the namespace (NetnsPreferred) it skips t with the reason.
func (s *Suite) Routed(t *testing.T) *Env {
	t.Helper()
	e := s.Env(t)
	if !e.Routed {
		t.Skip(s.noNetnsReason)
	}
	return e
}

func (s *Suite) subject() string {
	if s.Subject != "" {
		return s.Subject
	}
	return s.Name + " tests"
}

// TestCtx returns a context that ends after d or with t, whichever is first.
func TestCtx(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}
