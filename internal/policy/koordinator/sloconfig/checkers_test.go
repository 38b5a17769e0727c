package sloconfig

import (
	"fmt"
	"testing"
)

// TestCheckersUpstreamTable ports Test_CreateCheckersChanged and
// Test_NeedCheckForNodes (pkg/webhook/cm/plugins/sloconfig/
// checkers_test.go, v1.8.0): how many keys are checked, whether their
// contents fail, and whether nodes must be listed. The name case runs with
// the name check on, as upstream's test package leaves the flag set by an
// earlier test.
func TestCheckersUpstreamTable(t *testing.T) {
	colo := `{"enable":true,"metricAggregateDurationSeconds":%s,"cpuReclaimThresholdPercent":70,"memoryReclaimThresholdPercent":80,"updateTimeThresholdSeconds":300,"degradeTimeMinutes":5,"resourceDiffThreshold":0.1%s}`
	f := func(dur, extra string) string { return fmt.Sprintf(colo, dur, extra) }
	valid := map[string]string{
		ColocationConfigKey:        f("100", ""),
		ResourceThresholdConfigKey: `{"clusterStrategy":{"enable":true,"cpuSuppressThresholdPercent":60}}`,
		ResourceQOSConfigKey:       `{"clusterStrategy":{"enable":true,"beClass":{"cpuQOS":{"groupIdentity":0}}}}`,
		CPUBurstConfigKey:          `{"clusterStrategy":{"cfsQuotaBurstPeriodSeconds":60}}`,
		SystemConfigKey:            `{"clusterStrategy":{"minFreeKbytesFactor":150}}`,
	}
	invalidAll := map[string]string{}
	for _, k := range kinds {
		invalidAll[k.key] = "invalid_content"
	}
	oldInvalid := map[string]string{}
	for k, v := range valid {
		oldInvalid[k] = v
	}
	oldInvalid[ColocationConfigKey] = f("-1", "")
	for _, tc := range []struct {
		name      string
		old, data map[string]string
		hasOld    bool
		checkers  int
		fails     bool
		nodes     bool
	}{
		{"new config empty", oldInvalid, map[string]string{}, true, 0, false, false},
		{"config invalid but not changed", invalidAll, invalidAll, true, 0, false, false},
		{"config changed but invalid", nil, invalidAll, false, 5, true, false},
		{"colocation metricAggregateDurationSeconds invalid", nil, map[string]string{ColocationConfigKey: f("-1", "")}, false, 1, true, false},
		{"colocation nodeStrategies name invalid", nil, map[string]string{ColocationConfigKey: f("60", `,"nodeConfigs":[{"nodeSelector":{"matchLabels":{"xxx":"xxx"}},"enable":true}]`)}, false, 1, true, false},
		{"colocation nodeStrategies overlap", nil, map[string]string{ColocationConfigKey: f("60", `,"nodeConfigs":[{"nodeSelector":{"matchLabels":{"xxx":"xxx"}},"enable":true,"name":"test1"},{"nodeSelector":{"matchLabels":{"xxx":"xxx","yyy":"yyy"}},"enable":true,"name":"test2"}]`)}, false, 1, true, true},
		{"config valid and changed", nil, valid, false, 5, false, false},
		{"only colocation has one nodeStrategy", nil, map[string]string{ColocationConfigKey: f("60", `,"nodeConfigs":[{"name":"a","nodeSelector":{"matchLabels":{"xxx":"xxx"}}}]`)}, false, 1, false, false},
		{"colocation has two nodeStrategies", nil, map[string]string{ColocationConfigKey: f("60", `,"nodeConfigs":[{"name":"a","nodeSelector":{"matchLabels":{"xxx":"xxx"}}},{"name":"b","nodeSelector":{"matchLabels":{"yyy":"yyy"}}}]`)}, false, 1, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &Policy{cfg: Config{Namespace: DefaultNamespace, Name: DefaultName, NodeStrategyNameCheck: true}}
			var cm configMap
			cm.Metadata.Namespace, cm.Metadata.Name, cm.Data = DefaultNamespace, DefaultName, tc.data
			cs := p.changedCheckers(tc.old, tc.hasOld, cm)
			if len(cs) != tc.checkers {
				t.Fatalf("%d keys checked, want %d", len(cs), tc.checkers)
			}
			var err error
			nodes := false
			for _, c := range cs {
				if err == nil {
					err = c.checkContents(true)
				}
				nodes = nodes || len(c.profiles) > 1
			}
			if (err != nil) != tc.fails {
				t.Fatalf("contents error %v, want failure %v", err, tc.fails)
			}
			if nodes != tc.nodes {
				t.Fatalf("nodes needed %v, want %v", nodes, tc.nodes)
			}
		})
	}
}
