package sloconfig_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/kadmit/kadmit/internal/builtin"
	"github.com/kadmit/kadmit/internal/policy"
	"github.com/kadmit/kadmit/internal/review"
)

// TestKoordinatorExamples keeps examples/koordinator honest: `kadmit
// review` with its kadmit.yaml admits the documented slo-controller-config,
// denies the overlapping one, and amplifies the node status as the
// example's comment says.
func TestKoordinatorExamples(t *testing.T) {
	dir := filepath.Join("..", "..", "..", "..", "examples", "koordinator")
	cfg, err := builtin.Config.LoadFile(filepath.Join(dir, "kadmit.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	whs, err := builtin.Webhooks(cfg, policy.Env{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	run := func(file string, opts review.Options) *review.Result {
		t.Helper()
		docs, err := review.Read(filepath.Join(dir, file), nil)
		if err != nil || len(docs) != 1 {
			t.Fatalf("%s: %d documents, %v", file, len(docs), err)
		}
		res, err := review.Run(ctx, whs, docs[0], opts)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if res := run("slo-controller-config.yaml", review.Options{}); !res.Allowed {
		t.Fatalf("slo-controller-config.yaml denied: %s", res.Message)
	}
	if res := run("slo-controller-config-overlap.yaml", review.Options{}); res.Allowed || res.Code != 400 ||
		!strings.Contains(res.Message, `"reason":"NodeStrategiesOverlap"`) {
		t.Fatalf("slo-controller-config-overlap.yaml: %+v", res)
	}
	old, err := review.Read(filepath.Join(dir, "node-old.yaml"), nil)
	if err != nil {
		t.Fatal(err)
	}
	res := run("node-status.yaml", review.Options{Operation: admissionv1.Update, SubResource: "status", Old: old})
	if !res.Allowed {
		t.Fatalf("node-status.yaml denied: %s", res.Message)
	}
	var n corev1.Node
	if err := json.Unmarshal(res.Object, &n); err != nil {
		t.Fatal(err)
	}
	if cpu, mem := n.Status.Allocatable.Cpu().String(), n.Status.Allocatable.Memory().String(); cpu != "5250m" || mem != "9019431321600m" {
		t.Fatalf("allocatable cpu %s memory %s", cpu, mem)
	}
	if raw := n.Annotations["node.koordinator.sh/raw-allocatable"]; raw != `{"cpu":"3500m","memory":"7Gi"}` {
		t.Fatalf("raw-allocatable %q", raw)
	}
}
