// Command demo shows kadmit at work against a real API server in about a
// minute: it starts kube-apiserver and etcd on loopback, runs `kadmit serve`
// with a self-signed certificate and --register, applies the manifests in
// examples/seed/ and prints, for each step, what was expected next to what the
// API server answered.
//
//	make controlplane                          # once: builds kube-apiserver and etcd
//	cd test && go run ./demo [--kadmit PATH]   # or: make demo
//
// It exits 0 when every outcome matched and 1 otherwise, and stops kadmit and
// the control plane on every path out, Ctrl-C included.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/kadmit/kadmit/test/controlplane"
	"github.com/kadmit/kadmit/test/controlplane/kadmitproc"
	"github.com/kadmit/kadmit/test/seed"
)

type options struct {
	kadmit      string
	addr        string
	metricsAddr string
	seedDir     string
	cpDir       string
	timeout     time.Duration
	verbose     bool
}

func main() {
	var o options
	flag.StringVar(&o.kadmit, "kadmit", "", "kadmit binary to run (default: build ./cmd/kadmit into a temporary directory)")
	flag.StringVar(&o.addr, "addr", "127.0.0.1:9443", "kadmit's HTTPS admission address; a free port is used if it is busy")
	flag.StringVar(&o.metricsAddr, "metrics-addr", "127.0.0.1:8080", "kadmit's plain-HTTP metrics and health address; a free port is used if it is busy")
	flag.StringVar(&o.seedDir, "seed", "", "directory of the seed manifests (default: examples/seed in the repository)")
	flag.StringVar(&o.cpDir, "controlplane-dir", "", "directory with kube-apiserver and etcd (default: $"+controlplane.EnvDir+" or the `make controlplane` cache)")
	flag.DurationVar(&o.timeout, "timeout", 5*time.Minute, "give up after this long")
	flag.BoolVar(&o.verbose, "v", false, "also print kadmit's full log")
	flag.Parse()
	// envtest logs through controller-runtime's global logger, which nags
	// with a stack trace on stderr when left unset; the demo has its own output.
	ctrllog.SetLogger(logr.Discard())
	os.Exit(run(o))
}

// run returns the exit code; it is separate from main so deferred clean-up
// runs before os.Exit.
func run(o options) int {
	// Ctrl-C cancels ctx; every wait below watches it, and the deferred
	// stops below still run. The API server and etcd sit in their own process
	// group, so the terminal's Ctrl-C does not reach them directly.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()

	out := os.Stdout
	say := func(format string, args ...any) { fmt.Fprintf(out, format+"\n", args...) }

	root, err := kadmitproc.RepoRoot()
	if err != nil && (o.seedDir == "" || o.kadmit == "") {
		say("demo: %v (run it from the kadmit repository, or pass --seed and --kadmit)", err)
		return 1
	}
	if o.seedDir == "" {
		o.seedDir = filepath.Join(root, "examples", "seed")
	}
	tmp, err := os.MkdirTemp("", "kadmit-demo-")
	if err != nil {
		say("demo: temporary directory: %v", err)
		return 1
	}
	defer os.RemoveAll(tmp)

	if o.kadmit == "" {
		say("Building kadmit (go build ./cmd/kadmit) ...")
		o.kadmit = filepath.Join(tmp, "kadmit")
		if err := kadmitproc.Build(ctx, root, o.kadmit); err != nil {
			say("demo: %v", err)
			return 1
		}
	}

	say("Starting a control plane: kube-apiserver %s and etcd on 127.0.0.1 ...", controlplane.KubeVersion)
	cpLog, err := os.Create(filepath.Join(tmp, "controlplane.log"))
	if err != nil {
		say("demo: %v", err)
		return 1
	}
	started := time.Now()
	cp, err := controlplane.Start(ctx, controlplane.Options{Dir: o.cpDir, Output: cpLog})
	if err != nil {
		say("demo: %v", err)
		return 1
	}
	defer func() {
		say("Stopping the control plane ...")
		if err := cp.Stop(); err != nil {
			say("demo: %v", err)
		}
	}()
	say("  API server ready at %s (%s)", cp.Config.Host, time.Since(started).Round(100*time.Millisecond))

	kubeconfig := filepath.Join(tmp, "kubeconfig")
	if err := cp.WriteKubeconfig(kubeconfig); err != nil {
		say("demo: %v", err)
		return 1
	}
	addr, err := pickAddr(o.addr)
	if err != nil {
		say("demo: %v", err)
		return 1
	}
	metricsAddr, err := pickAddr(o.metricsAddr)
	if err != nil {
		say("demo: %v", err)
		return 1
	}
	if addr != o.addr || metricsAddr != o.metricsAddr {
		say("  (%s or %s is busy; using %s and %s)", o.addr, o.metricsAddr, addr, metricsAddr)
	}

	var kadmitLog io.Writer
	if o.verbose {
		kadmitLog = os.Stderr
	}
	// kadmit's own namespace holds its certificate Secret.
	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: kadmitNamespace}}, metav1.CreateOptions{}); err != nil {
		say("demo: create namespace %s: %v", kadmitNamespace, err)
		return 1
	}
	k, err := kadmitproc.Start(kadmitproc.Options{
		Binary:      o.kadmit,
		Addr:        addr,
		MetricsAddr: metricsAddr,
		Args: []string{"serve", "--tls=self-managed", "--namespace", kadmitNamespace,
			"--register", "--webhook-url", "https://" + addr, "--kubeconfig", kubeconfig,
			"--addr", addr, "--metrics-addr", metricsAddr, "--log-format", "json",
			// Every allowed decision logged (by default they are sampled
			// past 10 a second per webhook): the demo shows them all.
			"--log-allowed-sample=1"},
		Log: kadmitLog,
	})
	if err != nil {
		say("demo: %v", err)
		return 1
	}
	defer func() {
		code, took, err := k.Terminate(35 * time.Second)
		switch {
		case err != nil:
			say("demo: %v", err)
		default:
			say("Stopped kadmit with SIGTERM: exit code %d after %s.", code, took.Round(time.Millisecond))
		}
	}()
	say("Starting kadmit:\n  %s", strings.Join(k.Args, " "))

	waitCtx, waitCancel := context.WithTimeout(ctx, 90*time.Second)
	defer waitCancel()
	if err := k.WaitReady(waitCtx); err != nil {
		say("demo: %v", err)
		return 1
	}
	say("  kadmit is ready (GET http://%s/readyz answered 200)", metricsAddr)
	if _, _, err := k.WaitRegistered(waitCtx, cp.Client); err != nil {
		say("demo: %v", err)
		return 1
	}
	say("  kadmit registered MutatingWebhookConfiguration %q and ValidatingWebhookConfiguration %q", kadmitproc.ConfigName, kadmitproc.ConfigName)
	if err := showCertificates(ctx, say, cp.Client, addr); err != nil {
		say("demo: %v", err)
		return 1
	}
	if err := k.WaitEffective(waitCtx, cp.Client, metav1.NamespaceDefault); err != nil {
		say("demo: %v", err)
		return 1
	}
	say("  the API server now calls kadmit (checked with dry-run pods)\n")

	say("kadmit's policies, as the seed profile configures them:")
	say("  pod-name         denies pods whose name contains \"offensive\"")
	say("  lifespan         gives each pod tolerations for the acme.com/lifespan-remaining=<days> node taint:")
	say("                   one per day from its acme.com/lifespan-requested label up to 14, or Exists without the label")
	say("  node-overcommit  doubles a node's allocatable CPU and keeps what the kubelet reserved, on every status")
	say("                   update the kubelet posts, without compounding")
	say("")
	say("Applying the manifests in %s:\n", o.seedDir)
	// A client of our own so that API server warnings (which carry kadmit's
	// warnings) are collected for the report rather than logged to stderr.
	warnings := &warningLog{}
	cfg := rest.CopyConfig(cp.Config)
	cfg.WarningHandler = warnings
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		say("demo: %v", err)
		return 1
	}
	rows := runSeed(ctx, &seed.Env{Client: client, Dir: o.seedDir})
	rows = append(rows, rotateServing(ctx, client, addr))

	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "STEP\tEXPECTED\tAPI SERVER ANSWERED\tRESULT")
	failed := 0
	for i, r := range rows {
		verdict := "MATCH"
		if !r.match {
			verdict = "MISMATCH"
			failed++
		}
		fmt.Fprintf(tw, "%d. %s\t%s\t%s\t%s\n", i+1, r.step, r.expected, oneLine(r.got, 72), verdict)
	}
	_ = tw.Flush()
	for i, r := range rows {
		for _, p := range r.problems {
			say("  step %d: %s", i+1, p)
		}
	}

	// The start-up probes are dry-runs of our own; leave them out.
	var decisions []kadmitproc.Decision
	probes := 0
	for _, dec := range k.Decisions() {
		if strings.HasSuffix(dec.Object, "/"+kadmitproc.ProbePodName) || strings.HasSuffix(dec.Object, "/kadmit-probe") {
			probes++
			continue
		}
		decisions = append(decisions, dec)
	}
	say("\nWhat kadmit logged: one JSON line per decision (%d for the steps above, %d for the start-up probes).", len(decisions), probes)
	say("Condensed: webhook path, operation, kind, object, decision, time kadmit took:")
	for _, dec := range decisions[max(0, len(decisions)-30):] {
		verdict := "allowed"
		if !dec.Allowed {
			verdict = fmt.Sprintf("DENIED %d %s", dec.Code, oneLine(dec.Message, 70))
		} else if dec.Patched {
			verdict = "allowed, patched"
		}
		say("  %-19s %-6s %-6s %-26s %-17s %s", dec.Webhook, dec.Operation, dec.Kind, dec.Object, verdict, dec.LatencyString())
	}
	for _, l := range k.Logs() {
		if strings.Contains(l, `"admission decision"`) && strings.Contains(l, `"object":"default/offensive-pod"`) && strings.Contains(l, `"allowed":false`) {
			say("The denial of offensive-pod as kadmit logged it (latency in nanoseconds):\n  %s", l)
			break
		}
	}
	if len(warnings.list()) > 0 {
		say("\nWarnings kadmit sent back through the API server:")
		for _, w := range warnings.list() {
			say("  %s", w)
		}
	}
	say("")

	if ctx.Err() != nil {
		say("demo: interrupted or timed out: %v", context.Cause(ctx))
		return 1
	}
	if failed > 0 {
		say("%d of %d outcomes did not match.", failed, len(rows))
		return 1
	}
	say("All %d outcomes matched.", len(rows))
	return 0
}

// warningLog collects the Warning headers the API server returns.
type warningLog struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warningLog) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, text)
}

func (w *warningLog) list() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.msgs...)
}

// pickAddr returns want when it can be listened on, else a free loopback port.
func pickAddr(want string) (string, error) {
	if kadmitproc.AddrFree(want) {
		return want, nil
	}
	return kadmitproc.FreeAddr()
}

// row is one line of the demo's table.
type row struct {
	step, expected, got string
	match               bool
	problems            []string
}

// apiTimeout bounds each step.
const apiTimeout = 30 * time.Second

// runSeed runs the seed table (test/seed), the rows the e2e suite checks too.
func runSeed(ctx context.Context, e *seed.Env) []row {
	var rows []row
	for _, sc := range seed.Scenarios() {
		sctx, cancel := context.WithTimeout(ctx, apiTimeout)
		r := sc.Run(sctx, e)
		cancel()
		rows = append(rows, row{step: sc.Name, expected: sc.Expected, got: r.Got, match: r.Matched(), problems: r.Problems})
	}
	return rows
}

// oneLine keeps a table cell on one line and at most n runes.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}
