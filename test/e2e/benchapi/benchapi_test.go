// Package benchapi runs `kadmit bench --through-apiserver` against a real
// kube-apiserver and etcd with kadmit registered (the seed webhooks), and
// checks the report against what the API server and the bench must have
// done: the exact number of dry-run creates, a histogram delta for every
// kadmit webhook that intercepts pod CREATE, with one observation per create,
// and finite quantiles. It also checks the clear refusal when the user may
// not read /metrics.
//
// Run: cd test && KADMIT_E2E_REQUIRED=1 KADMIT_CONTROLPLANE_DIR=... go test
// -count=1 ./e2e/benchapi/
package benchapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kadmit/kadmit/internal/bench"
	"github.com/kadmit/kadmit/test/controlplane/kadmitproc"
	"github.com/kadmit/kadmit/test/e2e/e2eenv"
)

const (
	kadmitReadyLimit = 60 * time.Second
	rate             = 50
	duration         = 10 * time.Second
	// benchLimit bounds one bench process: its duration, the per-create
	// timeout it could wait out, two scrapes, and start-up on a busy machine.
	benchLimit = duration + 2*bench.DefaultAPITimeout + time.Minute
)

var (
	namespace string
	suite     = &e2eenv.Suite{Name: "benchapi", Setup: setup}
)

func TestMain(m *testing.M) { os.Exit(suite.Main(m)) }

// setup starts kadmit with the seed profile, registered with the control
// plane, and waits until its webhooks take effect in a fresh namespace.
func setup(ctx context.Context, e *e2eenv.Env) error {
	readyCtx, cancel := context.WithTimeout(ctx, kadmitReadyLimit)
	defer cancel()
	if err := e.StartKadmit(readyCtx); err != nil {
		return err
	}
	namespace = fmt.Sprintf("kadmit-benchapi-%06d", rand.IntN(1_000_000))
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}
	if _, err := e.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create namespace %s: %w", namespace, err)
	}
	return e.Kadmit.WaitEffective(readyCtx, e.Client, namespace)
}

// runBench runs kadmit bench with args and returns stdout, stderr and the
// exit code.
func runBench(t *testing.T, e *e2eenv.Env, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), benchLimit)
	defer cancel()
	cmd := exec.CommandContext(ctx, e.Binary, append([]string{"bench"}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		t.Fatalf("run kadmit bench: %v", err)
	}
	return out.String(), errb.String(), code
}

// podCreateWebhooks returns the names of kadmit's registered webhooks whose
// rules include CREATE of pods: the ones every dry-run create must reach.
func podCreateWebhooks(t *testing.T, e *e2eenv.Env) []string {
	t.Helper()
	ctx := e2eenv.TestCtx(t, 30*time.Second)
	reg := e.Client.AdmissionregistrationV1()
	m, err := reg.MutatingWebhookConfigurations().Get(ctx, kadmitproc.ConfigName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	v, err := reg.ValidatingWebhookConfigurations().Get(ctx, kadmitproc.ConfigName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, w := range m.Webhooks {
		if podCreate(w.Rules) {
			names = append(names, w.Name)
		}
	}
	for _, w := range v.Webhooks {
		if podCreate(w.Rules) {
			names = append(names, w.Name)
		}
	}
	if len(names) < 2 {
		t.Fatalf("kadmit registered %v for pod CREATE; the seed profile has a mutating and a validating one", names)
	}
	return names
}

// podCreate reports whether rules intercept CREATE of pods.
func podCreate(rules []admissionregistrationv1.RuleWithOperations) bool {
	for _, r := range rules {
		create := slices.Contains(r.Operations, admissionregistrationv1.Create) || slices.Contains(r.Operations, admissionregistrationv1.OperationAll)
		pods := slices.Contains(r.Resources, "pods") || slices.Contains(r.Resources, "*")
		if create && pods {
			return true
		}
	}
	return false
}

// TestThroughAPIServer is the acceptance run: 50 creates/s for 10 s
// of the default pod, through the real API server, with kadmit's seed
// webhooks registered.
func TestThroughAPIServer(t *testing.T) {
	e := suite.Env(t)
	hooks := podCreateWebhooks(t, e)
	stdout, stderr, code := runBench(t, e, "--through-apiserver", "--kubeconfig", e.Kubeconfig,
		"--namespace", namespace, "--rate", fmt.Sprint(rate), "-d", duration.String(), "-o", "json")
	if code != 0 {
		t.Fatalf("kadmit bench exited %d\nstdout: %s\nstderr: %s\nkadmit log:\n%s", code, stdout, stderr, e.Kadmit.Tail(20))
	}
	var rep bench.APIServerJSON
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("report is not JSON: %v\n%s", err, stdout)
	}
	t.Logf("report: %s", stdout)

	const want = rate * int64(duration/time.Second)
	if rep.Planned != want || rep.Sent != want || rep.Answered != want || rep.Created != want || !rep.Complete {
		t.Errorf("planned %d sent %d answered %d created %d complete %v; want exactly %d each",
			rep.Planned, rep.Sent, rep.Answered, rep.Created, rep.Complete, want)
	}
	if len(rep.Errors) != 0 || rep.StoppedBy != "count" {
		t.Errorf("errors %v (%v), stopped by %q", rep.Errors, rep.ErrorSamples, rep.StoppedBy)
	}
	if rep.Kind != "Pod" || rep.Namespace != namespace || rep.Rate != rate {
		t.Errorf("kind %q namespace %q rate %d", rep.Kind, rep.Namespace, rep.Rate)
	}
	if !(rep.ClientMS.P50 > 0 && rep.ClientMS.P99 >= rep.ClientMS.P50) {
		t.Errorf("client latency %+v", rep.ClientMS)
	}
	byName := map[string]bench.WebhookJSON{}
	for _, w := range rep.Webhooks {
		byName[w.Name] = w
	}
	for _, name := range hooks {
		w, ok := byName[name]
		if !ok {
			t.Errorf("no histogram delta for kadmit webhook %s; report has %v", name, rep.Webhooks)
			continue
		}
		// Each create calls each webhook once: nothing else ran in the window.
		if w.Calls != want || w.Operation != "CREATE" || w.Rejected != 0 {
			t.Errorf("%s: %d calls (%s), %d rejected; want %d CREATE calls, none rejected", name, w.Calls, w.Operation, w.Rejected, want)
		}
		if len(w.Buckets) < 2 || w.Buckets[len(w.Buckets)-1].LE != "+Inf" || w.Buckets[len(w.Buckets)-1].Count != want {
			t.Errorf("%s: buckets %v", name, w.Buckets)
		}
		for _, v := range []float64{w.P50MS, w.P99MS, w.MeanMS} {
			if math.IsNaN(v) || math.IsInf(v, 0) || v <= 0 {
				t.Errorf("%s: p50 %v p99 %v mean %v ms, want finite and positive", name, w.P50MS, w.P99MS, w.MeanMS)
			}
		}
		if w.P99InInf || w.P99MS < w.P50MS || w.LowestMS != 5 {
			t.Errorf("%s: p99 %v (in +Inf %v), p50 %v, lowest bucket %v ms", name, w.P99MS, w.P99InInf, w.P50MS, w.LowestMS)
		}
		// The webhook's mean is part of the create's mean latency.
		if w.ShareMean <= 0 || w.ShareMean >= 1 {
			t.Errorf("%s: share of the client's mean %v, want in (0, 1)", name, w.ShareMean)
		}
	}
}

// TestText checks the human report of a short run names what it measured
// and prints the target next to the result.
func TestText(t *testing.T) {
	e := suite.Env(t)
	stdout, stderr, code := runBench(t, e, "--through-apiserver", "--kubeconfig", e.Kubeconfig,
		"--namespace", namespace, "--rate", "20", "-d", "1s")
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
	}
	for _, want := range []string{
		"20 of 20 planned sent (exactly as planned)",
		"server-side dry-run CREATE (dryRun=All",
		"bucket-interpolated as PromQL's histogram_quantile",
		"lifespan.kadmit.io", "pod-name.kadmit.io",
		"target      every webhook's p99 in the API server's lowest bucket (<= 5.00ms) at 100 creates/s",
		"(this run: 20 creates/s, not 100)",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("report lacks %q:\n%s", want, stdout)
		}
	}
}

// TestMetricsForbidden impersonates a user without RBAC on /metrics: the
// bench must refuse before sending anything and name the missing
// permission.
func TestMetricsForbidden(t *testing.T) {
	e := suite.Env(t)
	cfg, err := clientcmd.LoadFromFile(e.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, ai := range cfg.AuthInfos {
		ai.Impersonate = "kadmit-bench-nobody"
		ai.ImpersonateGroups = []string{"system:authenticated"}
	}
	path := filepath.Join(t.TempDir(), "nobody.kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code := runBench(t, e, "--through-apiserver", "--kubeconfig", path, "--namespace", namespace, "--rate", "10", "-d", "1s")
	if code != 2 || !strings.Contains(stderr, `needs RBAC verb "get" on nonResourceURL "/metrics"`) {
		t.Errorf("exit %d, stderr %q, stdout %q; want 2 and the missing permission named", code, stderr, stdout)
	}
}

// TestMissingNamespace: a namespace that does not exist is refused before
// any create is sent.
func TestMissingNamespace(t *testing.T) {
	e := suite.Env(t)
	_, stderr, code := runBench(t, e, "--through-apiserver", "--kubeconfig", e.Kubeconfig, "--namespace", "no-such-namespace", "-d", "1s")
	if code != 2 || !strings.Contains(stderr, `namespace "no-such-namespace" not found: create it or pass --namespace`) {
		t.Errorf("exit %d, stderr %q", code, stderr)
	}
}

// TestManifestFile creates another kind from -f: the resource is found
// through discovery, the object lands in --namespace, and with no webhook
// on ConfigMaps the report says no webhook was called.
func TestManifestFile(t *testing.T) {
	e := suite.Env(t)
	path := filepath.Join(t.TempDir(), "cm.yaml")
	manifest := "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  generateName: bench-\n  namespace: elsewhere\ndata:\n  k: v\n"
	if err := os.WriteFile(path, []byte(manifest), 0o600); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code := runBench(t, e, "--through-apiserver", "--kubeconfig", e.Kubeconfig,
		"--namespace", namespace, "-f", path, "--rate", "20", "-d", "1s", "-o", "json")
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
	}
	var rep bench.APIServerJSON
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Kind != "ConfigMap" || rep.Resource != "configmaps" || rep.Namespace != namespace || rep.Created != 20 || len(rep.Webhooks) != 0 {
		t.Errorf("kind %s resource %s namespace %s created %d webhooks %v", rep.Kind, rep.Resource, rep.Namespace, rep.Created, rep.Webhooks)
	}
	// Nothing was stored: dryRun=All.
	cms, err := e.Client.CoreV1().ConfigMaps(namespace).List(e2eenv.TestCtx(t, 30*time.Second), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, cm := range cms.Items {
		if strings.HasPrefix(cm.Name, "bench-") {
			t.Errorf("dry-run stored %s", cm.Name)
		}
	}
}
