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
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"

	"github.com/kadmit/kadmit/test/e2e/e2eenv"
	"github.com/kadmit/kadmit/test/poll"
)

// env is the world every test shares, built once by TestMain: the base
// environment with the CRDs installed and kadmit running, and the run's
// namespaces.
type env struct {
	*e2eenv.Env
	dyn     dynamic.Interface
	suffix  string
	jobs    string // namespace with default queue "main"
	quotas  string // namespace holding the ElasticQuotas
	podsNS  string // namespace claimed by ElasticQuota team-a
	mixed   string // namespace labelled colocation=on
	plain   string // namespace without labels
	config  string // namespace of kadmit's config ConfigMap
	started time.Time
}

// cacheWait bounds how long a test waits for kadmit's informers to see an
// object the test just wrote.
const cacheWait = 20 * time.Second

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

var (
	shared = &env{}
	suite  = &e2eenv.Suite{Name: "scheduling e2e", Setup: shared.setup}
)

func TestMain(m *testing.M) { os.Exit(suite.Main(m)) }

// world returns the shared environment, skipping or failing t when there is
// none.
func world(t *testing.T) *env {
	t.Helper()
	suite.Env(t)
	return shared
}

// kadmitConfig enables every scheduling policy; pod-name and lifespan stay
// on because kadmitproc.WaitEffective probes them.
func (e *env) kadmitConfig() string {
	return fmt.Sprintf(`apiVersion: kadmit.io/v1alpha1
kind: Configuration
policies:
  jobQueue:
    enabled: true
    managedLabel: true
    requireQueue: true
    defaultQueues: {%[1]s: main}
    queues:
    - {name: main, quota: {cpu: "4", memory: 8Gi}}
    - {name: spare}
  resourceFlavor: {enabled: true}
  elasticQuota: {enabled: true, quotaAdmission: true}
  colocation:
    enabled: true
    recordProfiles: true
    profiles:
    - &batch
      name: batch
      namespaceSelector: {matchLabels: {colocation: "on"}}
      selector: {matchLabels: {qos: be}}
      labels: {koordinator.sh/qosClass: BE}
      priorityClassName: koord-batch
      schedulerName: koord-scheduler
      tolerations: [{key: colocation, operator: Exists, effect: NoSchedule}]
      nodeSelector: {node-pool: mixed}
  reservation: {enabled: true, recordProfiles: true, checkAllocations: true, profiles: [*batch]}
  kadmitConfig: {enabled: true, namespace: %[2]s, name: kadmit}
`, e.jobs, e.config)
}

// setup installs the CRDs, creates the namespaces and starts kadmit with
// every scheduling policy enabled.
func (e *env) setup(ctx context.Context, base *e2eenv.Env) error {
	e.Env = base
	var err error
	if e.dyn, err = dynamic.NewForConfig(e.Config); err != nil {
		return fmt.Errorf("dynamic client: %w", err)
	}

	// CRDs first: kadmit discovers them once at start.
	for _, f := range []string{"kueue-crds.yaml", "koordinator-crds.yaml", "koordinator-reservation-crd.yaml"} {
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
		if _, err := e.Client.CoreV1().Namespaces().Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create namespace %s: %w", ns, err)
		}
	}

	if err := e.koordinatorSetup(ctx); err != nil {
		return err
	}

	cfgFile := filepath.Join(e.Tmp, "kadmit.yaml")
	if err := os.WriteFile(cfgFile, []byte(e.kadmitConfig()), 0o600); err != nil {
		return fmt.Errorf("write kadmit config: %w", err)
	}
	readyCtx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	if err := e.StartKadmit(readyCtx, "--config", cfgFile); err != nil {
		return err
	}
	return e.Kadmit.WaitEffective(readyCtx, e.Client, e.plain)
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
		if err := poll.Until(ctx, 60*time.Second, func(ctx context.Context) error {
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
