// Package koordnode runs kadmit's Koordinator slo-config and
// node-amplification policies as a separate `kadmit serve` process against a
// real kube-apiserver and etcd: the slo-controller-config ConfigMap on
// /validate-configmap (next to kadmit-config on the same path), node label
// changes on /validate-node, and the resource-amplification ratio on
// /mutate-node-status (next to node-overcommit on the same path). Only
// these three paths are registered. Nothing is mocked. Like test/e2e it
// skips without the control plane binaries unless KADMIT_E2E_REQUIRED=1,
// and KADMIT_E2E_KEEP=1 keeps the temporary directory.
package koordnode

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kadmit/kadmit/test/e2e/e2eenv"
	"github.com/kadmit/kadmit/test/poll"
)

// env is the world every test shares, built once by TestMain.
type env struct {
	*e2eenv.Env
	suffix string
	koord  string // the slo-controller-config namespace (sloConfig.namespace)
	config string // the namespace of kadmit's own ConfigMap (kadmit-config)
}

// cacheWait bounds how long a test waits for kadmit's informers to see an
// object the test just wrote.
const cacheWait = 20 * time.Second

var (
	shared = &env{}
	suite  = &e2eenv.Suite{Name: "koordnode e2e", Setup: shared.setup}
)

func TestMain(m *testing.M) { os.Exit(suite.Main(m)) }

func world(t *testing.T) *env {
	t.Helper()
	suite.Env(t)
	return shared
}

// kadmitConfig turns off the seed's pod policies so that only
// /validate-configmap, /validate-node and /mutate-node-status are
// registered; node-overcommit (cpu ×2) and kadmit-config stay on to share
// those paths.
func (e *env) kadmitConfig() string {
	return fmt.Sprintf(`apiVersion: kadmit.io/v1alpha1
kind: Configuration
policies:
  podName: {enabled: false}
  lifespan: {enabled: false}
  nodeOvercommit: {enabled: true, ratios: {cpu: "2"}}
  sloConfig: {enabled: true, namespace: %[1]s}
  nodeAmplification: {enabled: true}
  kadmitConfig: {enabled: true, namespace: %[2]s, name: kadmit}
`, e.koord, e.config)
}

func (e *env) setup(ctx context.Context, base *e2eenv.Env) error {
	e.Env = base
	e.suffix = fmt.Sprintf("%06d", rand.IntN(1_000_000))
	e.koord, e.config = "koordinator-"+e.suffix, "kadmit-config-"+e.suffix
	for _, ns := range []string{e.koord, e.config} {
		if _, err := e.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create namespace %s: %w", ns, err)
		}
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
	return e.waitEffective(readyCtx)
}

// waitEffective polls until the API server calls kadmit on
// /validate-configmap: a dry-run slo-controller-config with an invalid
// colocation value is denied with slo-config's message.
func (e *env) waitEffective(ctx context.Context) error {
	cm := sloConfigMap(e.koord, map[string]string{"colocation-config": `{"metricAggregateDurationSeconds":0}`})
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	return poll.Until(ctx, 0, func(ctx context.Context) error {
		_, err := e.Client.CoreV1().ConfigMaps(e.koord).Create(ctx, cm, dry)
		switch {
		case err == nil:
			return errors.New("slo-config webhook: invalid slo-controller-config admitted")
		case !strings.Contains(err.Error(), "ConfigParamInvalid"):
			return fmt.Errorf("slo-config webhook: %w", err)
		}
		return nil
	})
}

func sloConfigMap(ns string, data map[string]string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "slo-controller-config"}, Data: data}
}
