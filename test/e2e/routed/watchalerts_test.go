package routed

// The alert expressions of the chart's PrometheusRule (group kadmit-watch)
// as `make manifests` renders them, for watchprobe.Evaluator (Prometheus's
// own PromQL engine over the scrapes of the watch's /metrics).

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kadmit/kadmit/test/watchprobe"
)

// rulesFile holds the chart's kadmit-watch alert group as `make manifests`
// renders it (release kadmit, namespace kadmit-system).
const rulesFile = "deploy/prometheus/kadmit-watch-rules.yaml"

// newAlertEvaluator reads the group kadmit-watch from rulesFile (a
// Prometheus rule file) and returns an evaluator of its rules.
func newAlertEvaluator(t *testing.T, e *env) *watchprobe.Evaluator {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(e.RepoRoot, rulesFile))
	if err != nil {
		t.Fatal(err)
	}
	rules, err := watchprobe.ParseRules(data, watchprobe.AlertGroup)
	if err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	if len(rules) == 0 {
		t.Fatalf("%s has no alerting rule in group %s", rulesFile, watchprobe.AlertGroup)
	}
	t.Logf("alert expressions from %s (group %s): %d rules", rulesFile, watchprobe.AlertGroup, len(rules))
	a, err := watchprobe.NewEvaluator(rules, watchprobe.EvaluatorOptions{})
	if err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	return a
}
