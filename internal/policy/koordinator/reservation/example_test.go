package reservation_test

import (
	"path/filepath"
	"testing"

	"github.com/kadmit/kadmit/internal/builtin"
	"github.com/kadmit/kadmit/internal/policy"
	"github.com/kadmit/kadmit/internal/review"
)

// TestExample keeps examples/scheduling/reservation.yaml honest: with the
// example configuration, `kadmit review` mutates the Reservation as its
// comment says and denies the pod that sets the reserve-pod annotation.
func TestExample(t *testing.T) {
	dir := filepath.Join("..", "..", "..", "..", "examples", "scheduling")
	cfg, err := builtin.Config.LoadFile(filepath.Join(dir, "kadmit.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	whs, err := builtin.Webhooks(cfg, policy.Env{})
	if err != nil {
		t.Fatal(err)
	}
	docs, err := review.Read(filepath.Join(dir, "reservation.yaml"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) != 2 {
		t.Fatalf("%d documents, want 2", len(docs))
	}
	for _, d := range docs {
		res, err := review.Run(t.Context(), whs, d, review.Options{})
		if err != nil {
			t.Fatal(err)
		}
		switch res.Kind {
		case "Reservation":
			paths := map[string]bool{}
			for _, op := range res.Patch {
				paths[op.Path] = true
			}
			if !res.Allowed || !paths["/metadata/labels/koordinator.sh~1qosClass"] || !paths["/spec/template/spec/priority"] ||
				!paths["/spec/template/spec/schedulerName"] || len(res.Warnings) != 1 {
				t.Errorf("Reservation: allowed=%v patch %v warnings %v", res.Allowed, res.Patch, res.Warnings)
			}
		case "Pod":
			if res.Allowed || res.Code != 400 || res.Message != "annotations.scheduling.koordinator.sh/reserve-pod: Forbidden: cannot set in annotations" {
				t.Errorf("Pod: allowed=%v %d %q", res.Allowed, res.Code, res.Message)
			}
		default:
			t.Errorf("unexpected %s", res.Kind)
		}
	}
}
