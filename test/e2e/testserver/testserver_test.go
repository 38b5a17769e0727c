// Package testserver runs `kadmit test --server`, the built binary,
// against a real kube-apiserver: the repository's examples (examples/cel)
// agree offline and in the API server; a planted suite whose policy reads
// a field the API server defaults is reported as a difference; a policy of
// the same name already in the cluster is refused and left alone; and
// nothing kadmit installed stays behind.
//
// The control plane is taken from KADMIT_CONTROLPLANE_DIR (default
// ~/.cache/kadmit/controlplane/v1.37.1). Without the binaries the test
// skips, unless KADMIT_E2E_REQUIRED=1.
package testserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/kadmit/kadmit/test/controlplane"
	"github.com/kadmit/kadmit/test/controlplane/kadmitproc"
	"github.com/kadmit/kadmit/test/poll"
)

var world struct {
	cp         *controlplane.ControlPlane
	kubeconfig string
	binary     string
	root       string
	skip       string
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	required := os.Getenv("KADMIT_E2E_REQUIRED") == "1"
	dir, err := controlplane.FindBinaries("")
	if err != nil {
		if required || !errors.Is(err, controlplane.ErrBinariesMissing) {
			fmt.Fprintln(os.Stderr, "testserver:", err)
			return 1
		}
		world.skip = err.Error()
		return m.Run()
	}
	tmp, err := os.MkdirTemp("", "kadmit-testserver-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "testserver:", err)
		return 1
	}
	defer os.RemoveAll(tmp)
	if world.root, err = kadmitproc.RepoRoot(); err != nil {
		fmt.Fprintln(os.Stderr, "testserver:", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	world.binary = filepath.Join(tmp, "kadmit")
	built := make(chan error, 1)
	go func() { built <- kadmitproc.Build(ctx, world.root, world.binary) }()
	var log bytes.Buffer
	cp, err := controlplane.Start(ctx, controlplane.Options{Dir: dir, Output: &log})
	if err != nil {
		fmt.Fprintf(os.Stderr, "testserver: %v\n%s", err, log.String())
		return 1
	}
	defer func() { _ = cp.Stop() }()
	if err := <-built; err != nil {
		fmt.Fprintln(os.Stderr, "testserver:", err)
		return 1
	}
	world.cp = cp
	world.kubeconfig = filepath.Join(tmp, "kubeconfig")
	if err := cp.WriteKubeconfig(world.kubeconfig); err != nil {
		fmt.Fprintln(os.Stderr, "testserver:", err)
		return 1
	}
	return m.Run()
}

func requireWorld(t *testing.T) {
	t.Helper()
	if world.skip != "" {
		t.Skip(world.skip)
	}
}

// kadmitTest runs the binary's `kadmit test --server` on path and returns
// its output and exit status.
func kadmitTest(ctx context.Context, t *testing.T, path string) (string, int) {
	t.Helper()
	cmd := exec.CommandContext(ctx, world.binary, "test", "--server", "--kubeconfig", world.kubeconfig, "--server-wait", "40s", path)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return out.String(), 0
	case errors.As(err, &exit):
		return out.String(), exit.ExitCode()
	default:
		t.Fatalf("kadmit test --server: %v\n%s", err, out.String())
		return "", 0
	}
}

// The examples' gatekeeper suite takes its param kind from a CRD, which
// the cluster must serve before the suite runs (kadmit installs the
// suite's params, not their CRDs).
func installCRDs(ctx context.Context, t *testing.T) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(world.root, "examples", "cel", "gatekeeper-requiredlabels", "crds.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	installCRD(ctx, t, data)
}

// installCRD creates the CRD in data (YAML) and waits until it is served.
func installCRD(ctx context.Context, t *testing.T, data []byte) {
	t.Helper()
	j, err := yaml.YAMLToJSON(data)
	if err != nil {
		t.Fatal(err)
	}
	var crd struct {
		Metadata struct{ Name string }
		Spec     struct {
			Group    string
			Versions []struct{ Name string }
		}
	}
	if err := yaml.Unmarshal(data, &crd); err != nil || len(crd.Spec.Versions) == 0 {
		t.Fatalf("crds.yaml: %v", err)
	}
	rc := world.cp.Client.Discovery().RESTClient()
	if err := rc.Post().AbsPath("/apis/apiextensions.k8s.io/v1/customresourcedefinitions").Body(j).SetHeader("Content-Type", "application/json").Do(ctx).Error(); err != nil {
		t.Fatalf("create CRD %s: %v", crd.Metadata.Name, err)
	}
	if err := poll.Until(ctx, 30*time.Second, func(context.Context) error {
		rl, err := world.cp.Client.Discovery().ServerResourcesForGroupVersion(crd.Spec.Group + "/" + crd.Spec.Versions[0].Name)
		if err == nil && len(rl.APIResources) == 0 {
			err = errors.New("no resources served yet")
		}
		return err
	}); err != nil {
		t.Fatalf("CRD %s not served: %v", crd.Metadata.Name, err)
	}
}

// leftovers lists the admission policies and bindings in the cluster.
func leftovers(ctx context.Context, t *testing.T, cs kubernetes.Interface) []string {
	t.Helper()
	var names []string
	vaps, err := cs.AdmissionregistrationV1().ValidatingAdmissionPolicies().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range vaps.Items {
		names = append(names, "ValidatingAdmissionPolicy/"+p.Name)
	}
	vbs, err := cs.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range vbs.Items {
		names = append(names, "ValidatingAdmissionPolicyBinding/"+b.Name)
	}
	maps, err := cs.AdmissionregistrationV1().MutatingAdmissionPolicies().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range maps.Items {
		names = append(names, "MutatingAdmissionPolicy/"+p.Name)
	}
	return names
}

var summaryRE = regexp.MustCompile(`(?m)^(\d+) tests, (\d+) passed, (\d+) failed, (\d+) differ from the API server$`)

// TestExamplesAgree: every suite under examples/ decides in the API server
// what it decides offline.
func TestExamplesAgree(t *testing.T) {
	requireWorld(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	installCRDs(ctx, t)
	// Every suite under examples/ in one run: examples/cel, then
	// examples/policy-testing, whose cluster-state suite selects
	// ConfigMap params after examples/cel's docs-params suite removed its
	// ConfigMap-param binding (the run's paramKind keeper holds the API
	// server's informer, kubernetes#130887).
	out, code := kadmitTest(ctx, t, filepath.Join(world.root, "examples"))
	t.Logf("kadmit test --server examples/:\n%s", out)
	if code != 0 || strings.Contains(out, "DIFF ") {
		t.Fatalf("exit %d, want 0 and no DIFF line", code)
	}
	m := summaryRE.FindStringSubmatch(out)
	if m == nil || m[1] != m[2] || m[4] != "0" || m[1] == "0" {
		t.Fatalf("summary %q: want every test passed and none differing", m)
	}
	if l := leftovers(ctx, t, world.cp.Client); len(l) > 0 {
		t.Errorf("left in the cluster after the run: %v", l)
	}
	params, err := world.cp.Client.Discovery().RESTClient().Get().AbsPath("/apis/constraints.gatekeeper.sh/v1beta1/k8srequiredlabels").DoRaw(ctx)
	if err != nil || strings.Contains(string(params), `"name"`) {
		t.Errorf("the gatekeeper suite's param left in the cluster: %s %v", params, err)
	}
}

// TestPlantedDifference: a policy that reads imagePullPolicy, which the
// API server defaults, denies offline and allows in the API server; the
// run reports exactly that test as differing and exits 1.
func TestPlantedDifference(t *testing.T) {
	requireWorld(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, code := kadmitTest(ctx, t, filepath.Join("testdata", "planted"))
	t.Logf("kadmit test --server testdata/planted:\n%s", out)
	if code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	want := `DIFF  planted / a pod without imagePullPolicy: offline allowed=false 422 "pods \"planted-a\" is forbidden: ValidatingAdmissionPolicy 'planted-pull-policy' with binding 'planted-pull-policy' denied request: every container must set imagePullPolicy", server allowed=true`
	if !strings.Contains(out, want+"\n") {
		t.Errorf("output lacks the line\n%s", want)
	}
	if n := strings.Count(out, "DIFF "); n != 1 {
		t.Errorf("%d DIFF lines, want 1 (the pod with imagePullPolicy agrees)", n)
	}
	if !strings.Contains(out, "2 tests, 2 passed, 0 failed, 1 differ from the API server\n") {
		t.Error("summary: want 2 passed offline, 1 differing")
	}
	if l := leftovers(ctx, t, world.cp.Client); len(l) > 0 {
		t.Errorf("left in the cluster after the run: %v", l)
	}
}

// TestRefusesExistingPolicy: a policy of the suite's name that is already
// in the cluster is not overwritten: the run fails with exit 2 naming it,
// and the user's policy is unchanged.
func TestRefusesExistingPolicy(t *testing.T) {
	requireWorld(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cs := world.cp.Client
	mine := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "planted-pull-policy", Labels: map[string]string{"owner": "user"}},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
					Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}},
				},
			}}},
			Validations: []admissionregistrationv1.Validation{{Expression: "true"}},
		},
	}
	created, err := cs.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, mine, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cs.AdmissionregistrationV1().ValidatingAdmissionPolicies().Delete(context.Background(), mine.Name, metav1.DeleteOptions{})
	}()
	out, code := kadmitTest(ctx, t, filepath.Join("testdata", "planted"))
	t.Logf("kadmit test --server testdata/planted, policy present:\n%s", out)
	if code != 2 || !strings.Contains(out, "ValidatingAdmissionPolicy planted-pull-policy: already exists in the cluster") {
		t.Errorf("exit %d, want 2 and the existing policy named", code)
	}
	cur, err := cs.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, mine.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cur.ResourceVersion != created.ResourceVersion || cur.Labels["owner"] != "user" {
		t.Errorf("the user's policy was changed: %+v", cur.ObjectMeta)
	}
	if l := leftovers(ctx, t, cs); len(l) != 1 {
		t.Errorf("in the cluster after the refused run: %v, want only the user's policy", l)
	}
}

// TestOperationsAgree: DELETE and UPDATE (old objects created for real
// first), a namespace the suite declares with labels, and impersonated
// users (userInfo) decide the same offline and in the API server; the old
// objects and the namespace are gone after the run.
func TestOperationsAgree(t *testing.T) {
	requireWorld(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, code := kadmitTest(ctx, t, filepath.Join("testdata", "agree"))
	t.Logf("kadmit test --server testdata/agree:\n%s", out)
	if code != 0 || strings.Contains(out, "DIFF ") || !strings.Contains(out, "5 tests, 5 passed, 0 failed, 0 differ from the API server\n") {
		t.Fatalf("exit %d, want 0, every test passed and none differing", code)
	}
	cs := world.cp.Client
	if l := leftovers(ctx, t, cs); len(l) > 0 {
		t.Errorf("left in the cluster after the run: %v", l)
	}
	// Without kube-controller-manager a deleted namespace stays
	// Terminating; what matters is that kadmit deleted it.
	ns, err := cs.CoreV1().Namespaces().Get(ctx, "agree-ns", metav1.GetOptions{})
	if err == nil && ns.DeletionTimestamp == nil {
		t.Errorf("namespace agree-ns, created by the run, was not deleted")
	}
	if err == nil {
		cms, err := cs.CoreV1().ConfigMaps("agree-ns").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, cm := range cms.Items {
			if cm.Name == "kept" || cm.Name == "other" {
				t.Errorf("old object ConfigMap %s left in the cluster", cm.Name)
			}
		}
	}
}

// TestInterruptCleansUp: Ctrl-C (SIGINT) while the suite is installed
// stops the run with exit 2 and still removes the policies, bindings and
// old objects it created.
func TestInterruptCleansUp(t *testing.T) {
	requireWorld(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	policy, err := os.ReadFile(filepath.Join("testdata", "planted", "policy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "policy.yaml"), policy, 0o600); err != nil {
		t.Fatal(err)
	}
	// Enough tests that the run is still sending when the signal lands.
	var suite strings.Builder
	suite.WriteString("apiVersion: kadmit.io/v1alpha1\nkind: PolicyTest\nmetadata: {name: interrupted}\npolicies: [policy.yaml]\ntests:\n")
	suite.WriteString("- name: update\n  operation: UPDATE\n  oldObject: {apiVersion: v1, kind: ConfigMap, metadata: {name: interrupt-old, namespace: default}}\n" +
		"  object: {apiVersion: v1, kind: ConfigMap, metadata: {name: interrupt-old, namespace: default}, data: {a: b}}\n  expect: {allowed: true}\n")
	for i := range 400 {
		fmt.Fprintf(&suite, "- name: pod %d\n  object: {apiVersion: v1, kind: Pod, metadata: {name: p%d, namespace: default}, spec: {containers: [{name: c, image: nginx, imagePullPolicy: Always}]}}\n  expect: {allowed: true}\n", i, i)
	}
	if err := os.WriteFile(filepath.Join(dir, "suite.yaml"), []byte(suite.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, world.binary, "test", "--server", "--kubeconfig", world.kubeconfig, dir)
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var errOut bytes.Buffer
	buf := make([]byte, 4096)
	signalled := false
	for {
		n, rerr := stderr.Read(buf)
		errOut.Write(buf[:n])
		if !signalled && strings.Contains(errOut.String(), "waiting until the API server enforces them") {
			if err := cmd.Process.Signal(os.Interrupt); err != nil {
				t.Fatal(err)
			}
			signalled = true
		}
		if rerr != nil {
			break
		}
	}
	err = cmd.Wait()
	t.Logf("stderr:\n%s\nstdout:\n%s", errOut.String(), stdout.String())
	var exit *exec.ExitError
	if !signalled || !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(errOut.String(), "context canceled") {
		t.Fatalf("signalled %v, exit %v: want the run interrupted with exit 2", signalled, err)
	}
	cs := world.cp.Client
	if l := leftovers(ctx, t, cs); len(l) > 0 {
		t.Errorf("left in the cluster after Ctrl-C: %v", l)
	}
	if _, err := cs.CoreV1().ConfigMaps("default").Get(ctx, "interrupt-old", metav1.GetOptions{}); err == nil {
		t.Error("the old object ConfigMap interrupt-old is left in the cluster after Ctrl-C")
	}
}

// TestAcrossSuites: one run of two suites, a namespace the first declares
// with a label and the second uses without declaring (kadmit created it,
// so the second suite sees it unlabelled, as offline), an UPDATE of a
// custom resource (sent with the stored object's resourceVersion, which a
// custom resource requires), and a param in a namespace kadmit creates.
func TestAcrossSuites(t *testing.T) {
	requireWorld(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	installCRD(ctx, t, []byte(`apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.test.kadmit.io}
spec:
  group: test.kadmit.io
  scope: Namespaced
  names: {kind: Widget, listKind: WidgetList, plural: widgets, singular: widget}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
`))
	dir := t.TempDir()
	policy := func(name, rule, expr, selector string) string {
		return fmt.Sprintf(`apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: %[1]s}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules: [%[2]s]
  validations: [{expression: %[3]q, message: %[1]s}]
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: %[1]s}
spec:
  policyName: %[1]s
  validationActions: [Deny]
  matchResources: {namespaceSelector: %[4]s}
`, name, rule, expr, selector)
	}
	files := map[string]string{
		"a/policy.yaml": policy("across-widgets", `{apiGroups: [test.kadmit.io], apiVersions: [v1], operations: [UPDATE], resources: [widgets]}`,
			"object.spec.size <= 3", "{matchLabels: {env: prod}}"),
		"a/suite.yaml": `apiVersion: kadmit.io/v1alpha1
kind: PolicyTest
metadata: {name: a}
policies: [policy.yaml]
namespaces: [{metadata: {name: across, labels: {env: prod}}}]
tests:
- name: growing a widget past 3 is denied
  operation: UPDATE
  oldObject: {apiVersion: test.kadmit.io/v1, kind: Widget, metadata: {name: w, namespace: across}, spec: {size: 2}}
  object: {apiVersion: test.kadmit.io/v1, kind: Widget, metadata: {name: w, namespace: across}, spec: {size: 5}}
  expect: {allowed: false, code: 422}
- name: growing it to 3 is allowed
  operation: UPDATE
  oldObject: {apiVersion: test.kadmit.io/v1, kind: Widget, metadata: {name: w, namespace: across}, spec: {size: 2}}
  object: {apiVersion: test.kadmit.io/v1, kind: Widget, metadata: {name: w, namespace: across}, spec: {size: 3}}
  expect: {allowed: true, patched: {/spec/size: 3}}
`,
		// A param in a namespace that does not exist: kadmit creates it.
		"b/policy.yaml": `apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: across-configmaps}
spec:
  failurePolicy: Fail
  paramKind: {apiVersion: v1, kind: ConfigMap}
  matchConstraints:
    resourceRules: [{apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [configmaps]}]
  validations: [{expression: "object.metadata.name != params.data.forbidden", message: forbidden name}]
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: across-configmaps}
spec:
  policyName: across-configmaps
  validationActions: [Deny]
  paramRef: {name: limits, namespace: across-params, parameterNotFoundAction: Deny}
  matchResources: {namespaceSelector: {matchLabels: {env: prod}}}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: limits, namespace: across-params}
data: {forbidden: bad}
`,
		"b/suite.yaml": `apiVersion: kadmit.io/v1alpha1
kind: PolicyTest
metadata: {name: b}
policies: [policy.yaml]
namespaces: [{metadata: {name: across-b, labels: {env: prod}}}]
tests:
- name: the forbidden name where the namespace is not prod is allowed
  object: {apiVersion: v1, kind: ConfigMap, metadata: {name: bad, namespace: across}}
  expect: {allowed: true}
- name: the forbidden name in prod is denied
  object: {apiVersion: v1, kind: ConfigMap, metadata: {name: bad, namespace: across-b}}
  expect: {allowed: false, messageContains: forbidden name}
- name: another name in prod is allowed
  object: {apiVersion: v1, kind: ConfigMap, metadata: {name: good, namespace: across-b}}
  expect: {allowed: true}
`,
	}
	for name, content := range files {
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(name)), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	out, code := kadmitTest(ctx, t, dir)
	t.Logf("kadmit test --server (two suites):\n%s", out)
	if code != 0 || strings.Contains(out, "DIFF ") || !strings.Contains(out, "5 tests, 5 passed, 0 failed, 0 differ from the API server\n") {
		t.Fatalf("exit %d, want 0, every test passed and none differing", code)
	}
	if l := leftovers(ctx, t, world.cp.Client); len(l) > 0 {
		t.Errorf("left in the cluster after the run: %v", l)
	}
}

// TestProbeNotMasked: a suite whose policy denies every namespace
// creation, kadmit's readiness probe included, and which mutates
// ConfigMaps, still runs: the probe's Warn binding reports both policy
// kinds in effect.
func TestProbeNotMasked(t *testing.T) {
	requireWorld(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, code := kadmitTest(ctx, t, filepath.Join("testdata", "denynamespaces"))
	t.Logf("kadmit test --server testdata/denynamespaces:\n%s", out)
	if code != 0 || strings.Contains(out, "DIFF ") || !strings.Contains(out, "2 tests, 2 passed, 0 failed, 0 differ from the API server\n") {
		t.Fatalf("exit %d, want 0, every test passed and none differing", code)
	}
	if l := leftovers(ctx, t, world.cp.Client); len(l) > 0 {
		t.Errorf("left in the cluster after the run: %v", l)
	}
}

// TestStaleParamInformerExplained: kube-apiserver v1.37.1 stops a built-in
// paramKind's informer for good once no binding uses it for a second
// (kubernetes/kubernetes#130887). Run a suite with a named ConfigMap param,
// then, once its cleanup has left no binding on ConfigMaps for a few
// seconds, a suite with a selected one: the first agrees; the second meets
// the bug, and `kadmit test --server` says so under its DIFF lines instead
// of leaving the user to think the offline answer is wrong. The stopped
// informer stays stopped for this API server, so this test must stay the
// last in the file. If a later kube-apiserver fixes the bug, the second
// run agrees and this test says so.
func TestStaleParamInformerExplained(t *testing.T) {
	requireWorld(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// Two copies in their own namespaces: a namespace kadmit created and
	// removed stays Terminating here (no namespace controller).
	out, code := kadmitTest(ctx, t, filepath.Join("testdata", "staleparams", "1"))
	t.Logf("first run:\n%s", out)
	if code != 0 {
		t.Fatalf("first run: exit %d, want 0:\n%s", code, out)
	}
	// The API server's policy source refreshes every second; leave it a
	// few with no binding on ConfigMaps.
	time.Sleep(4 * time.Second)
	out, code = kadmitTest(ctx, t, filepath.Join("testdata", "staleparams", "2"))
	t.Logf("second run:\n%s", out)
	if code == 0 {
		t.Fatal("second run agrees: this kube-apiserver keeps a built-in paramKind's informer after its last binding goes (kubernetes#130887 fixed?); drop the note's test or pin the version that has the bug")
	}
	if code != 1 || !strings.Contains(out, "no params found for policy binding") ||
		!strings.Contains(out, "kube-apiserver stops that kind's param informer for good") {
		t.Errorf("second run: exit %d, want 1 with the DIFF and the note on kubernetes#130887", code)
	}
	if l := leftovers(ctx, t, world.cp.Client); len(l) > 0 {
		t.Errorf("left in the cluster after the run: %v", l)
	}
}
