package served

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kadmit/kadmit/internal/builtin"
)

// committedChart reads the chart template make generate writes.
func committedChart(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", ChartCachesPath))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The committed chart RBAC for the policies' caches is what their Go
// declarations generate: a policy that adds a cache (or a generator
// change) fails here until `make generate` is run.
func TestChartCachesGenerated(t *testing.T) {
	generated, err := ChartCachesTemplate(builtin.Registry)
	if err != nil {
		t.Fatal(err)
	}
	if err := chartDiff(committedChart(t), generated); err != nil {
		t.Fatal(err)
	}
}

// A difference planted in the generator's input is reported by the same
// comparison TestChartCachesGenerated makes: a resource dropped (a policy's
// cache the chart would not grant), and a condition dropped (namespaces no
// longer granted for declared policies).
func TestChartCachesPlantedDifference(t *testing.T) {
	reads, err := chartReads(builtin.Registry)
	if err != nil {
		t.Fatal(err)
	}
	committed := committedChart(t)
	for _, tc := range []struct {
		name  string
		plant func([]chartRead) []chartRead
		want  string // in the report
	}{
		{"reservations dropped", func(rs []chartRead) []chartRead {
			return slices.DeleteFunc(rs, func(r chartRead) bool { return r.Resource == "reservations" })
		}, `checkAllocations`},
		{"declared policies' namespaces dropped", func(rs []chartRead) []chartRead {
			for i := range rs {
				if rs[i].Resource == "namespaces" {
					rs[i].conditions = slices.DeleteFunc(slices.Clone(rs[i].conditions), func(c chartCondition) bool { return c.declared })
				}
			}
			return rs
		}, `configMap`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			planted := renderChartReads(tc.plant(slices.Clone(reads)))
			err := chartDiff(committed, planted)
			if err == nil {
				t.Fatal("planted difference not reported")
			}
			t.Logf("reported: %v", err)
			if !strings.Contains(err.Error(), ChartCachesPath) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "make generate") {
				t.Errorf("report %q does not name the file, the differing line (%s) and the fix", err, tc.want)
			}
		})
	}
}

// What the generator learned from the Go declarations, read back: each
// resource under the conditions the policies' Caches put it (the chart's
// former hand-written needs* helpers).
func TestChartReads(t *testing.T) {
	reads, err := chartReads(builtin.Registry)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, r := range reads {
		key := r.Group + "/" + r.Resource
		if r.namespaced {
			key += " in " + r.nsField + " (default " + r.nsDefault + ")"
		}
		got[key] = r.comment()
	}
	want := map[string]string{
		"kueue.x-k8s.io/localqueues":             "job-queue (jobQueue.enabled)",
		"/namespaces":                            "job-queue (jobQueue.manageJobsWithoutQueueName), colocation (colocation.profiles[].namespaceSelector), declared policies (policies.configMap)",
		"scheduling.koordinator.sh/reservations": "reservation (reservation.checkAllocations)",
		"scheduling.k8s.io/priorityclasses":      "reservation (reservation.profiles[].priorityClassName), colocation (colocation.profiles[].priorityClassName)",
		"scheduling.sigs.k8s.io/elasticquotas":   "elastic-quota (elasticQuota.enabled)",
		"/pods":                                  "elastic-quota (elasticQuota.enabled)",
		"/nodes":                                 "slo-config (sloConfig.enabled)",
		"/configmaps in namespace (default koordinator-system)": "slo-config (sloConfig.nodeCheck)",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %q, want %q", k, got[k], v)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("unexpected read %s: %s", k, got[k])
		}
	}
}

// A chartSections entry that names no policy, or a fact that turns
// nothing on, is a generator error rather than a silently wrong chart.
func TestChartReadsRefusesStaleFacts(t *testing.T) {
	saved := chartSections
	t.Cleanup(func() { chartSections = saved })
	for name, change := range map[string]map[string]chartSection{
		"unknown section":                   {"noSuchPolicy": {}},
		"fact reading nothing":              {"lifespan": {Facts: []chartFact{{Flag: "max", On: `{"max": 3}`}}}},
		"namespaced read without its field": {"sloConfig": {Off: `{"nodeCheck": false}`, Facts: []chartFact{{Flag: "nodeCheck", On: `{"nodeCheck": true}`}}}},
	} {
		chartSections = maps.Clone(saved)
		maps.Copy(chartSections, change)
		if _, err := chartReads(builtin.Registry); err == nil {
			t.Errorf("%s: no error", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
}
