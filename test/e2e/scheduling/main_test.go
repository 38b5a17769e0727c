// Package scheduling runs kadmit's scheduling-system policies (job-queue,
// resource-flavor, elastic-quota, colocation, kadmit-config) as a separate
// `kadmit serve` process against a real kube-apiserver and etcd, with the
// Kueue and Koordinator CRDs installed by the test from testdata/. Nothing is
// mocked. Like test/e2e it skips without the control plane binaries unless
// KADMIT_E2E_REQUIRED=1, and KADMIT_E2E_KEEP=1 keeps the temporary directory.
package scheduling

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
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
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/kadmit/kadmit/internal/controlplane"
	"github.com/kadmit/kadmit/internal/controlplane/kadmitproc"
)

type env struct {
	tmp     string
	cp      *controlplane.ControlPlane
	client  kubernetes.Interface
	dyn     dynamic.Interface
	kadmit  *kadmitproc.Process
	suffix  string
	jobs    string // namespace with default queue "main"
	quotas  string // namespace holding the ElasticQuotas
	podsNS  string // namespace claimed by ElasticQuota team-a
	mixed   string // namespace labelled colocation=on
	plain   string // namespace without labels
	config  string // namespace of kadmit's config ConfigMap
	started time.Time
}

var (
	shared     *env
	skipReason string
	setupErr   error
)

const (
	setupTimeout    = 6 * time.Minute
	kadmitStopGrace = 30 * time.Second
	// cacheWait bounds how long a test waits for kadmit's informers to see
	// an object the test just wrote.
	cacheWait = 20 * time.Second
)

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

func TestMain(m *testing.M) {
	flag.Parse()
	ctrllog.SetLogger(logr.Discard())
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	if _, err := controlplane.FindBinaries(""); err != nil {
		if !errors.Is(err, controlplane.ErrBinariesMissing) || os.Getenv("KADMIT_E2E_REQUIRED") == "1" {
			fmt.Fprintf(os.Stderr, "scheduling e2e: FAIL: %v\n", err)
			return 1
		}
		skipReason = fmt.Sprintf("scheduling e2e tests need a control plane: %v", err)
		fmt.Fprintln(os.Stderr, "scheduling e2e: SKIP:", skipReason)
		return m.Run()
	}
	e := &env{}
	var once sync.Once
	teardown := func() { once.Do(e.teardown) }
	defer teardown()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		if _, ok := <-sigs; ok {
			teardown()
			os.Exit(130)
		}
	}()
	if f := flag.Lookup("test.timeout"); f != nil {
		if d, ok := f.Value.(flag.Getter).Get().(time.Duration); ok && d > time.Minute {
			t := time.AfterFunc(d-30*time.Second, teardown)
			defer t.Stop()
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	err := e.setup(ctx)
	cancel()
	if err != nil {
		setupErr = err
		fmt.Fprintf(os.Stderr, "scheduling e2e: set-up failed: %v\n", err)
	} else {
		shared = e
	}
	code := m.Run()
	if code != 0 && e.kadmit != nil {
		fmt.Fprintf(os.Stderr, "scheduling e2e: kadmit's last log lines:\n%s\n", e.kadmit.Tail(40))
	}
	return code
}

// kadmitConfig enables every scheduling policy; pod-name and lifespan stay
// on because kadmitproc.WaitEffective probes them.
func (e *env) kadmitConfig() string {
	return fmt.Sprintf(`apiVersion: kadmit.io/v1alpha1
kind: Configuration
policies:
  jobQueue:
    enabled: true
    defaultQueues: {%[1]s: main}
    queues:
    - {name: main, quota: {cpu: "4", memory: 8Gi}}
    - {name: spare}
  resourceFlavor: {enabled: true}
  elasticQuota: {enabled: true}
  colocation:
    enabled: true
    profiles:
    - name: batch
      namespaceSelector: {matchLabels: {colocation: "on"}}
      selector: {matchLabels: {qos: be}}
      labels: {koordinator.sh/qosClass: BE}
      schedulerName: koord-scheduler
      tolerations: [{key: colocation, operator: Exists, effect: NoSchedule}]
      nodeSelector: {node-pool: mixed}
  kadmitConfig: {enabled: true, namespace: %[2]s, name: kadmit}
`, e.jobs, e.config)
}

func (e *env) setup(ctx context.Context) error {
	root, err := kadmitproc.RepoRoot()
	if err != nil {
		return err
	}
	if e.tmp, err = os.MkdirTemp("", "kadmit-sched-e2e-"); err != nil {
		return fmt.Errorf("temp dir: %w", err)
	}
	binary := filepath.Join(e.tmp, "kadmit")
	buildErr := make(chan error, 1)
	go func() { buildErr <- kadmitproc.Build(ctx, root, binary) }()
	cpOut, err := os.Create(filepath.Join(e.tmp, "controlplane.log"))
	if err != nil {
		return fmt.Errorf("control plane log: %w", err)
	}
	cp, cpErr := controlplane.Start(ctx, controlplane.Options{Output: cpOut})
	if cpErr == nil {
		e.cp = cp
	}
	if err := <-buildErr; err != nil {
		return err
	}
	if cpErr != nil {
		return fmt.Errorf("%w (output: %s)", cpErr, cpOut.Name())
	}
	cfg := rest.CopyConfig(cp.Config)
	cfg.WarningHandler = rest.NoWarnings{}
	if e.client, err = kubernetes.NewForConfig(cfg); err != nil {
		return fmt.Errorf("client: %w", err)
	}
	if e.dyn, err = dynamic.NewForConfig(cfg); err != nil {
		return fmt.Errorf("dynamic client: %w", err)
	}

	// CRDs first: kadmit discovers them once at start.
	for _, f := range []string{"kueue-crds.yaml", "koordinator-crds.yaml"} {
		if err := e.installCRDs(ctx, filepath.Join("testdata", f)); err != nil {
			return err
		}
	}
	e.suffix = fmt.Sprintf("%06d", rand.IntN(1_000_000))
	e.jobs, e.quotas, e.podsNS = "jobs-"+e.suffix, "quotas-"+e.suffix, "team-a-"+e.suffix
	e.mixed, e.plain, e.config = "mixed-"+e.suffix, "plain-"+e.suffix, "kadmit-config-"+e.suffix
	for _, ns := range []string{e.jobs, e.quotas, e.podsNS, e.mixed, e.plain, e.config} {
		obj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}
		if ns == e.mixed {
			obj.Labels = map[string]string{"colocation": "on"}
		}
		if _, err := e.client.CoreV1().Namespaces().Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create namespace %s: %w", ns, err)
		}
	}

	cfgFile := filepath.Join(e.tmp, "kadmit.yaml")
	if err := os.WriteFile(cfgFile, []byte(e.kadmitConfig()), 0o600); err != nil {
		return fmt.Errorf("write kadmit config: %w", err)
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
		Binary: binary, Addr: addr, MetricsAddr: metricsAddr, CAFile: filepath.Join(e.tmp, "ca.crt"),
		Kubeconfig: kubeconfig, Log: logFile, ExtraArgs: []string{"--config", cfgFile},
	})
	if err != nil {
		return err
	}
	readyCtx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	if err := e.kadmit.WaitReady(readyCtx); err != nil {
		return err
	}
	if _, _, err := e.kadmit.WaitRegistered(readyCtx, e.client); err != nil {
		return err
	}
	return e.kadmit.WaitEffective(readyCtx, e.client, e.plain)
}

// installCRDs creates every CustomResourceDefinition in file and waits until
// each is Established, so that the API server serves it.
func (e *env) installCRDs(ctx context.Context, file string) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("read %s: %w", file, err)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var names []string
	for {
		var u unstructured.Unstructured
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return fmt.Errorf("decode %s: %w", file, err)
		}
		if len(u.Object) == 0 {
			continue
		}
		if _, err := e.dyn.Resource(crdGVR).Create(ctx, &u, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create CRD %s: %w", u.GetName(), err)
		}
		names = append(names, u.GetName())
	}
	for _, n := range names {
		if err := poll(ctx, 60*time.Second, func() error {
			u, err := e.dyn.Resource(crdGVR).Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				return err
			}
			conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
			for _, c := range conds {
				m, _ := c.(map[string]any)
				if m["type"] == "Established" && m["status"] == "True" {
					return nil
				}
			}
			return fmt.Errorf("CRD %s not established", n)
		}); err != nil {
			return err
		}
	}
	return nil
}

func (e *env) teardown() {
	if e.kadmit != nil {
		if code, took, err := e.kadmit.Terminate(kadmitStopGrace); err != nil || code != 0 {
			fmt.Fprintf(os.Stderr, "scheduling e2e: kadmit exit %d after %s: %v\n", code, took, err)
		}
	}
	if e.cp != nil {
		if err := e.cp.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "scheduling e2e: %v\n", err)
		}
	}
	if e.tmp == "" {
		return
	}
	if os.Getenv("KADMIT_E2E_KEEP") == "1" {
		fmt.Fprintf(os.Stderr, "scheduling e2e: kept %s\n", e.tmp)
		return
	}
	_ = os.RemoveAll(e.tmp)
}

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

func testCtx(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// poll calls f every 100ms until it returns nil, ctx ends or timeout passes;
// the error then carries f's last error.
func poll(ctx context.Context, timeout time.Duration, f func() error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("gave up after %s: %w", timeout, err)
		case <-tick.C:
		}
	}
}
