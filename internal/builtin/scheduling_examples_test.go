package builtin

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kadmit/kadmit/internal/policy"
	"github.com/kadmit/kadmit/internal/review"
)

// TestSchedulingExamples keeps examples/scheduling honest: each manifest's
// header comment says Allowed or Denied, and `kadmit review` with the
// example config must agree.
func TestSchedulingExamples(t *testing.T) {
	dir := filepath.Join("..", "..", "examples", "scheduling")
	cfg, err := Config.LoadFile(filepath.Join(dir, "kadmit.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	whs, err := Webhooks(cfg, policy.Env{})
	if err != nil {
		t.Fatal(err)
	}
	docs, err := review.Read(filepath.Join(dir, "manifests"), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{ // file -> allowed
		"job-default-queue.yaml": true, "job-over-quota.yaml": false,
		"flavor-good.yaml": true, "flavor-bad-taint.yaml": false,
		"elasticquota-child.yaml": true, "elasticquota-min-over-max.yaml": false,
		"colocated-pod.yaml": true, "kadmit-config-bad.yaml": false,
	}
	if len(docs) != len(want) {
		t.Fatalf("%d example documents, want %d", len(docs), len(want))
	}
	for _, d := range docs {
		res, err := review.Run(context.Background(), whs, d, review.Options{Operation: "CREATE"})
		if err != nil {
			t.Fatal(err)
		}
		base := filepath.Base(d.Source)
		allowed, ok := want[base]
		if !ok {
			t.Errorf("unexpected example %s", base)
			continue
		}
		if res.Allowed != allowed {
			t.Errorf("%s: allowed = %v (%s), want %v", base, res.Allowed, res.Message, allowed)
		}
		if base == "kadmit-config-bad.yaml" && !strings.Contains(res.Message, "policies.lifespan.max: must be >= 0, got -1") {
			t.Errorf("%s: message %q", base, res.Message)
		}
	}
}
