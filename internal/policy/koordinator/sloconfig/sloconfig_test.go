package sloconfig

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/testkit"
)

const sys = `{"clusterStrategy":{"minFreeKbytesFactor":150}}`

type fakeNodes map[string]map[string]string

func (f fakeNodes) NodeLabels(ctx context.Context, fn func(string, map[string]string) error) error {
	for _, n := range slices.Sorted(maps.Keys(f)) {
		if err := fn(n, f[n]); err != nil {
			return err
		}
	}
	return nil
}

func cmRaw(ns, name string, data map[string]string) []byte {
	b, _ := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"namespace": ns, "name": name}, "data": data})
	return b
}

func cmReq(op admissionv1.Operation, data, old map[string]string) *admission.Request {
	var obj, oldObj []byte
	if op != admissionv1.Delete {
		obj = cmRaw(DefaultNamespace, DefaultName, data)
	}
	if old != nil {
		oldObj = cmRaw(DefaultNamespace, DefaultName, old)
	}
	return testkit.Request(op, testkit.ConfigMaps, obj, oldObj, testkit.Namespace(DefaultNamespace), testkit.Name(DefaultName))
}

func newPolicy(t *testing.T, cfg Config, nodes Nodes) *Policy {
	t.Helper()
	p, err := New(cfg, nodes, nil)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestConfigMapUpstreamTables ports the facts of upstream's checker tests
// (pkg/webhook/cm/plugins/sloconfig/*_checker_test.go, v1.8.0): each
// config value as JSON under its key, and whether upstream's checker
// returns an error. The test name carries upstream's case name.
func TestConfigMapUpstreamTables(t *testing.T) {
	sel := func(k, v string) string { return fmt.Sprintf(`"nodeSelector":{"matchLabels":{%q:%q}}`, k, v) }
	for _, tc := range []struct {
		name string
		data map[string]string
		deny string // substring of the message; "" allows
	}{
		// resource_threshold_checker_test.go:225-330
		{"threshold: cluster CPUSuppressThresholdPercent invalid", map[string]string{ResourceThresholdConfigKey: `{"clusterStrategy":{"enable":true,"cpuSuppressThresholdPercent":-1}}`}, "CPUSuppressThresholdPercent must be 0 or greater"},
		{"threshold: cluster CPUEvictBESatisfactionUpperPercent invalid", map[string]string{ResourceThresholdConfigKey: `{"clusterStrategy":{"cpuEvictBESatisfactionUpperPercent":102}}`}, "CPUEvictBESatisfactionUpperPercent"},
		{"threshold: upper must not nil when lower not nil", map[string]string{ResourceThresholdConfigKey: `{"clusterStrategy":{"cpuEvictBESatisfactionLowerPercent":35}}`}, "CPUEvictBESatisfactionLowerPercent must be less than CPUEvictBESatisfactionUpperPercent"},
		{"threshold: upper < lower", map[string]string{ResourceThresholdConfigKey: `{"clusterStrategy":{"cpuEvictBESatisfactionUpperPercent":22,"cpuEvictBESatisfactionLowerPercent":35}}`}, "ConfigParamInvalid"},
		{"threshold: all is nil", map[string]string{ResourceThresholdConfigKey: `{"nodeStrategies":[{"name":"xxx-yyy",` + sel("xxx", "yyy") + `}]}`}, ""},
		{"threshold: config valid", map[string]string{ResourceThresholdConfigKey: `{"clusterStrategy":{"enable":true,"cpuSuppressThresholdPercent":60,"cpuEvictBESatisfactionUpperPercent":60,"cpuEvictBESatisfactionLowerPercent":30},"nodeStrategies":[{"name":"xxx-yyy",` + sel("xxx", "yyy") + `,"cpuSuppressThresholdPercent":50}]}`}, ""},
		{"threshold: node strategy without selector", map[string]string{ResourceThresholdConfigKey: `{"nodeStrategies":[{"name":"a"}]}`}, "nodeConfigs NodeSelector must not empty error! configType: resource-threshold-config,nodeConfig name:a"},
		// colocation_checker_test.go:255-390
		{"colocation: cluster MetricAggregateDurationSeconds invalid", map[string]string{ColocationConfigKey: `{"metricAggregateDurationSeconds":0}`}, "MetricAggregateDurationSeconds"},
		{"colocation: cluster CPUReclaimThresholdPercent invalid", map[string]string{ColocationConfigKey: `{"cpuReclaimThresholdPercent":-1}`}, "CPUReclaimThresholdPercent"},
		{"colocation: MemoryReclaimThresholdPercent more than 100 is valid", map[string]string{ColocationConfigKey: `{"memoryReclaimThresholdPercent":101}`}, ""},
		{"colocation: cluster DegradeTimeMinutes invalid", map[string]string{ColocationConfigKey: `{"degradeTimeMinutes":0}`}, "DegradeTimeMinutes"},
		{"colocation: cluster UpdateTimeThresholdSeconds invalid", map[string]string{ColocationConfigKey: `{"updateTimeThresholdSeconds":-1}`}, "UpdateTimeThresholdSeconds"},
		{"colocation: cluster ResourceDiffThreshold invalid", map[string]string{ColocationConfigKey: `{"resourceDiffThreshold":2}`}, "ResourceDiffThreshold"},
		{"colocation: node ResourceDiffThreshold invalid", map[string]string{ColocationConfigKey: `{"nodeConfigs":[{"name":"n",` + sel("a", "b") + `,"resourceDiffThreshold":-1}]}`}, "ColocationCfg.NodeConfigs[0].ColocationStrategy.ResourceDiffThreshold"},
		{"colocation: config valid", map[string]string{ColocationConfigKey: `{"metricAggregateDurationSeconds":30,"cpuReclaimThresholdPercent":70,"memoryReclaimThresholdPercent":80,"updateTimeThresholdSeconds":300,"degradeTimeMinutes":5,"resourceDiffThreshold":0.1,"nodeConfigs":[{"name":"n",` + sel("a", "b") + `,"resourceDiffThreshold":0.1}]}`}, ""},
		{"colocation: unparsable", map[string]string{ColocationConfigKey: `{"enable":"yes"}`}, `"reason":"ParseConfigFail","message":"Failed to parse colocation config in configmap koordinator-system/slo-controller-config, err: json: cannot unmarshal string`},
		{"colocation: case-insensitive field names, as encoding/json", map[string]string{ColocationConfigKey: `{"CPURECLAIMTHRESHOLDPERCENT":-1}`}, "CPUReclaimThresholdPercent"},
		// cpu_burst_checker_test.go:240-355
		{"cpuburst: cluster CPUBurstPercent invalid", map[string]string{CPUBurstConfigKey: `{"clusterStrategy":{"cpuBurstPercent":0}}`}, "CPUBurstPercent must be 1 or greater"},
		{"cpuburst: cluster CFSQuotaBurstPercent invalid", map[string]string{CPUBurstConfigKey: `{"clusterStrategy":{"cfsQuotaBurstPercent":-1}}`}, "CFSQuotaBurstPercent"},
		{"cpuburst: cluster CFSQuotaBurstPeriodSeconds invalid", map[string]string{CPUBurstConfigKey: `{"clusterStrategy":{"cfsQuotaBurstPeriodSeconds":-2}}`}, "CFSQuotaBurstPeriodSeconds"},
		{"cpuburst: node CFSQuotaBurstPeriodSeconds invalid", map[string]string{CPUBurstConfigKey: `{"nodeStrategies":[{"name":"n",` + sel("a", "b") + `,"cfsQuotaBurstPeriodSeconds":-2}]}`}, "CFSQuotaBurstPeriodSeconds"},
		{"cpuburst: config valid", map[string]string{CPUBurstConfigKey: `{"clusterStrategy":{"policy":"auto","cpuBurstPercent":100,"cfsQuotaBurstPercent":200,"cfsQuotaBurstPeriodSeconds":10000},"nodeStrategies":[{"name":"n",` + sel("a", "b") + `,"cpuBurstPercent":100}]}`}, ""},
		// system_config_checker_test.go:236-316
		{"system: cluster MinFreeKbytesFactor invalid", map[string]string{SystemConfigKey: `{"clusterStrategy":{"minFreeKbytesFactor":-1}}`}, "MinFreeKbytesFactor"},
		{"system: cluster WatermarkScaleFactor invalid", map[string]string{SystemConfigKey: `{"clusterStrategy":{"watermarkScaleFactor":0}}`}, "WatermarkScaleFactor must be greater than 0"},
		{"system: cluster MemcgReapBackGround invalid", map[string]string{SystemConfigKey: `{"clusterStrategy":{"memcgReapBackGround":2}}`}, "MemcgReapBackGround"},
		{"system: config valid", map[string]string{SystemConfigKey: `{"clusterStrategy":{"minFreeKbytesFactor":100,"watermarkScaleFactor":150,"totalNetworkBandwidth":"1000M"},"nodeStrategies":[{"name":"n",` + sel("a", "b") + `,"minFreeKbytesFactor":100}]}`}, ""},
		{"system: bandwidth out of kadmit's quantity range", map[string]string{SystemConfigKey: `{"clusterStrategy":{"totalNetworkBandwidth":"1e9999999"}}`}, "out of range"},
		// resource_qos_checker_test.go:273-697
		{"qos: cluster CPUQOS GroupIdentity invalid", map[string]string{SystemConfigKey: sys, ResourceQOSConfigKey: `{"clusterStrategy":{"lsrClass":{"cpuQOS":{"groupIdentity":3}}}}`}, "GroupIdentity"},
		{"qos: cluster MemoryQOS OomKillGroup invalid", map[string]string{SystemConfigKey: sys, ResourceQOSConfigKey: `{"clusterStrategy":{"lsrClass":{"memoryQOS":{"oomKillGroup":2}}}}`}, "OomKillGroup"},
		{"qos: cluster ResctrlQOS CATRangeStartPercent invalid", map[string]string{SystemConfigKey: sys, ResourceQOSConfigKey: `{"clusterStrategy":{"lsrClass":{"resctrlQOS":{"catRangeStartPercent":-1,"catRangeEndPercent":50}}}}`}, "CATRangeStartPercent"},
		{"qos: node ResctrlQOS CATRangeStartPercent invalid", map[string]string{SystemConfigKey: sys, ResourceQOSConfigKey: `{"nodeStrategies":[{"name":"n",` + sel("a", "b") + `,"beClass":{"resctrlQOS":{"catRangeStartPercent":101}}}]}`}, "CATRangeStartPercent"},
		{"qos: config valid", map[string]string{SystemConfigKey: sys, ResourceQOSConfigKey: `{"clusterStrategy":{"lsrClass":{"cpuQOS":{"enable":true,"groupIdentity":-1}}},"nodeStrategies":[{"name":"n",` + sel("a", "b") + `,"beClass":{"cpuQOS":{"groupIdentity":-1}}}]}`}, ""},
		{"qos: netqos percentage less than 0", map[string]string{SystemConfigKey: sys, ResourceQOSConfigKey: `{"clusterStrategy":{"lsrClass":{"networkQOS":{"ingressRequest":-1}}}}`}, "ResourceQOSCfg.ClusterStrategy.LSRClass.IngressRequest: Invalid value: -1: must be percentage value just in 0-100'"},
		{"qos: netqos percentage more than 100", map[string]string{SystemConfigKey: sys, ResourceQOSConfigKey: `{"clusterStrategy":{"lsrClass":{"networkQOS":{"ingressRequest":101}}}}`}, "must be percentage value"},
		{"qos: netqos percentage valid (total bandwidth from system-config)", map[string]string{SystemConfigKey: `{"clusterStrategy":{"totalNetworkBandwidth":"1000M"}}`, ResourceQOSConfigKey: `{"clusterStrategy":{"lsrClass":{"networkQOS":{"ingressRequest":50}}}}`}, ""},
		{"qos: netqos quantity invalid", map[string]string{SystemConfigKey: sys, ResourceQOSConfigKey: `{"clusterStrategy":{"lsrClass":{"networkQOS":{"ingressRequest":"50a"}}}}`}, "IngressRequest"},
		{"qos: netqos quantity empty", map[string]string{SystemConfigKey: sys, ResourceQOSConfigKey: `{"clusterStrategy":{"lsrClass":{"networkQOS":{"ingressRequest":""}}}}`}, "IngressRequest"},
		{"qos: netqos quantity valid", map[string]string{SystemConfigKey: `{"clusterStrategy":{"totalNetworkBandwidth":"1000M"}}`, ResourceQOSConfigKey: `{"clusterStrategy":{"lsrClass":{"networkQOS":{"ingressRequest":"50m"}}}}`}, ""},
		{"qos: cluster total percentage over 100", map[string]string{SystemConfigKey: `{"clusterStrategy":{"totalNetworkBandwidth":"1000M"}}`, ResourceQOSConfigKey: `{"clusterStrategy":{"lsrClass":{"networkQOS":{"ingressRequest":50}},"lsClass":{"networkQOS":{"ingressRequest":60}}}}`}, "ClusterStrategy total net bandwidth percentage already over 100"},
		{"qos: node total percentage over 100", map[string]string{SystemConfigKey: sys, ResourceQOSConfigKey: `{"nodeStrategies":[{"name":"n",` + sel("a", "b") + `,"lsrClass":{"networkQOS":{"ingressRequest":50}},"lsClass":{"networkQOS":{"ingressRequest":60}}}]}`}, "cfg.NodeStrategies[0] total net bandwidth percentage already over 100"},
		{"qos: node total quantity over total bandwidth", map[string]string{
			SystemConfigKey:      `{"nodeStrategies":[{"name":"n",` + sel("a", "b") + `,"totalNetworkBandwidth":"1000M"}]}`,
			ResourceQOSConfigKey: `{"nodeStrategies":[{"name":"n",` + sel("a", "b") + `,"lsrClass":{"networkQOS":{"ingressRequest":"500M"}},"lsClass":{"networkQOS":{"ingressRequest":"600M"}}}]}`},
			"percentage already over 100"}, // upstream: the percentage check runs first and subtracts quantities from 100 too
		{"qos: cluster total quantity over total bandwidth", map[string]string{SystemConfigKey: `{"clusterStrategy":{"totalNetworkBandwidth":"1000M"}}`, ResourceQOSConfigKey: `{"clusterStrategy":{"lsrClass":{"networkQOS":{"ingressRequest":"500M"}},"lsClass":{"networkQOS":{"ingressRequest":"600M"}}}}`}, "over 100"},
		{"qos: cluster requests within 100 but over a total bandwidth of 50", map[string]string{SystemConfigKey: `{"clusterStrategy":{"totalNetworkBandwidth":"50"}}`, ResourceQOSConfigKey: `{"clusterStrategy":{"lsrClass":{"networkQOS":{"ingressRequest":60}}}}`}, "total net bandwidth over total network bandwidth in clusterStrategy"},
		{"qos: node requests over the bandwidth of the system strategy with the same selector", map[string]string{
			SystemConfigKey:      `{"nodeStrategies":[{"name":"n",` + sel("a", "b") + `,"totalNetworkBandwidth":"50"},{"name":"m",` + sel("c", "d") + `,"totalNetworkBandwidth":"100"}]}`,
			ResourceQOSConfigKey: `{"nodeStrategies":[{"name":"n",` + sel("a", "b") + `,"lsrClass":{"networkQOS":{"egressRequest":60}}}]}`},
			"total net bandwidth quantity already over total network bandwidth in cfg.NodeStrategies[0]"},
		{"qos: only one format in cluster strategy", map[string]string{SystemConfigKey: sys, ResourceQOSConfigKey: `{"clusterStrategy":{"lsrClass":{"networkQOS":{"ingressRequest":"500M"}},"lsClass":{"networkQOS":{"ingressRequest":60}}}}`}, "only one type can be used for percentages or quantity in clusterStrategy"},
		{"qos: only one format in node strategy", map[string]string{SystemConfigKey: sys, ResourceQOSConfigKey: `{"nodeStrategies":[{"name":"n",` + sel("a", "b") + `,"lsrClass":{"networkQOS":{"ingressRequest":"500M"}},"lsClass":{"networkQOS":{"ingressRequest":60}}}]}`}, "only one type can be used for percentages or quantity in nodeStrategy[0]"},
		{"qos: without system-config (upstream parses it too)", map[string]string{ResourceQOSConfigKey: `{"clusterStrategy":{"lsrClass":{"cpuQOS":{"groupIdentity":1}}}}`}, "Failed to parse System config"},
		// checker_test.go:220-410: selector overlap
		{"overlap: not overlap", map[string]string{ColocationConfigKey: `{"nodeConfigs":[{"name":"1",` + sel("xxx", "xxx") + `},{"name":"2",` + sel("yyy", "yyy") + `}]}`}, ""},
		{"overlap: strategy1(xxx:xxx), strategy2(xxx:xxx,yyy:yyy)", map[string]string{ColocationConfigKey: `{"nodeConfigs":[{"name":"1",` + sel("xxx", "xxx") + `},{"name":"2","nodeSelector":{"matchLabels":{"xxx":"xxx","yyy":"yyy"}}}]}`}, `___{"reason":"NodeStrategiesOverlap","message":{"config":"colocation-config","strategies":["1","2"]}}___`},
		{"overlap: strategy1(xxx:xxx), strategy2(xxx in xxx|yyy)", map[string]string{ColocationConfigKey: `{"nodeConfigs":[{"name":"1",` + sel("xxx", "xxx") + `},{"name":"2","nodeSelector":{"matchExpressions":[{"key":"xxx","operator":"In","values":["xxx","yyy"]}]}}]}`}, "NodeStrategiesOverlap"},
		{"overlap: strategy1(xxx:xxx), strategy2(xxx NotIn yyy)", map[string]string{ColocationConfigKey: `{"nodeConfigs":[{"name":"1",` + sel("xxx", "xxx") + `},{"name":"2","nodeSelector":{"matchExpressions":[{"key":"xxx","operator":"NotIn","values":["yyy"]}]}}]}`}, "NodeStrategiesOverlap"},
		{"overlap: strategy1(xxx:xxx), strategy2(xxx Exists)", map[string]string{ColocationConfigKey: `{"nodeConfigs":[{"name":"1",` + sel("xxx", "xxx") + `},{"name":"2","nodeSelector":{"matchExpressions":[{"key":"xxx","operator":"Exists"}]}}]}`}, "NodeStrategiesOverlap"},
		{"not overlap: strategy1(xxx:xxx), strategy2(xxx DoesNotExist)", map[string]string{ColocationConfigKey: `{"nodeConfigs":[{"name":"1",` + sel("xxx", "xxx") + `},{"name":"2","nodeSelector":{"matchExpressions":[{"key":"xxx","operator":"DoesNotExist"}]}}]}`}, ""},
		{"overlap: strategy1(xxx:xxx), strategy2(yyy DoesNotExist)", map[string]string{ColocationConfigKey: `{"nodeConfigs":[{"name":"1",` + sel("xxx", "xxx") + `},{"name":"2","nodeSelector":{"matchExpressions":[{"key":"yyy","operator":"DoesNotExist"}]}}]}`}, "NodeStrategiesOverlap"},
		{"invalid selector", map[string]string{ColocationConfigKey: `{"nodeConfigs":[{"name":"1","nodeSelector":{"matchExpressions":[{"key":"xxx","operator":"Bogus"}]}}]}`}, "failed to parse node selector"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPolicy(t, DefaultConfig(), nil)
			v := p.ValidateConfigMap(context.Background(), cmReq(admissionv1.Create, tc.data, nil))
			if tc.deny == "" {
				if !v.Allowed {
					t.Fatalf("denied: %s", v.Message)
				}
				return
			}
			if v.Allowed || v.Code != 400 || !strings.Contains(v.Message, tc.deny) {
				t.Fatalf("got allowed=%v code=%d %q, want 400 containing %q", v.Allowed, v.Code, v.Message, tc.deny)
			}
		})
	}
}
