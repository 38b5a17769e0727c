package sloconfig

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/testkit"
)

func colocation(strategies ...string) map[string]string {
	return map[string]string{ColocationConfigKey: `{"enable":true,"nodeConfigs":[` + strings.Join(strategies, ",") + `]}`, SystemConfigKey: sys}
}

// TestPluginUpstreamTable ports slo_config_plugin_test.go (v1.8.0):
// operations, changed keys and the conflict check against nodes.
func TestPluginUpstreamTable(t *testing.T) {
	manyNodes := fakeNodes{}
	for i := 0; i < 500; i++ {
		n := fmt.Sprint(i)
		manyNodes[n] = map[string]string{n: n, "name": n}
	}
	s1 := `{"name":"1","nodeSelector":{"matchLabels":{"1":"1"}}}`
	s2 := `{"name":"2","nodeSelector":{"matchLabels":{"2":"2"}}}`
	bad := map[string]string{ColocationConfigKey: `{"metricAggregateDurationSeconds":-1}`}
	for _, tc := range []struct {
		name      string
		op        admissionv1.Operation
		data, old map[string]string
		nodes     fakeNodes
		deny      string
	}{
		{"delete slo-controller-config", admissionv1.Delete, nil, bad, nil, ""},
		{"create and config invalid", admissionv1.Create, bad, nil, nil, "MetricAggregateDurationSeconds"},
		{"create and colocation not configured", admissionv1.Create, map[string]string{SystemConfigKey: sys}, nil, nil, ""},
		{"update and config not changed", admissionv1.Update, bad, bad, nil, ""},
		{"update and config changed", admissionv1.Update, bad, map[string]string{}, nil, "MetricAggregateDurationSeconds"},
		{"5 nodes, strategy1(1:1), strategy2(2:2)", admissionv1.Create, colocation(s1, s2), nil, fakeNodes{"1": {"1": "1"}, "2": {"2": "2"}, "3": {"3": "3"}, "4": {}, "5": {"5": "5"}}, ""},
		{"500 nodes, strategy1(1:1), strategy2(2:2)", admissionv1.Create, colocation(s1, s2), nil, manyNodes, ""},
		{"500 nodes, strategy1(name:30), strategy2(30:30)", admissionv1.Create, colocation(`{"name":"1","nodeSelector":{"matchLabels":{"name":"30"}}}`, `{"name":"2","nodeSelector":{"matchLabels":{"30":"30"}}}`), nil, manyNodes,
			`___{"reason":"ExistNodeConfict","message":{"config":"colocation-config","strategies":["1","2"],"exampleNodes":["30"]}}___`},
		{"500 nodes, strategy1(name in (50,51)), strategy2(name:50)", admissionv1.Create, colocation(`{"name":"1","nodeSelector":{"matchExpressions":[{"key":"name","operator":"In","values":["50","51"]}]}}`, `{"name":"2","nodeSelector":{"matchLabels":{"50":"50"}}}`), nil, manyNodes, "ExistNodeConfict"},
		{"one node strategy: nodes not checked", admissionv1.Create, colocation(s1), nil, fakeNodes{"x": {"1": "1"}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var nodes Nodes
			if tc.nodes != nil {
				nodes = tc.nodes
			}
			p := newPolicy(t, DefaultConfig(), nodes)
			v := p.ValidateConfigMap(context.Background(), cmReq(tc.op, tc.data, tc.old))
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

func TestOnlyItsConfigMap(t *testing.T) {
	p := newPolicy(t, DefaultConfig(), nil)
	bad := map[string]string{ColocationConfigKey: `{"metricAggregateDurationSeconds":-1}`}
	ctx := context.Background()
	for _, r := range []*admission.Request{
		func() *admission.Request { r := cmReq(admissionv1.Create, bad, nil); r.Namespace = "other"; return r }(),
		func() *admission.Request { r := cmReq(admissionv1.Create, bad, nil); r.Name = "other"; return r }(),
		func() *admission.Request {
			r := cmReq(admissionv1.Create, bad, nil)
			r.Resource.Resource = "secrets"
			return r
		}(),
	} {
		if v := p.ValidateConfigMap(ctx, r); !v.Allowed {
			t.Fatalf("%s/%s %s denied: %s", r.Namespace, r.Name, r.Resource.Resource, v.Message)
		}
	}
	// The configured location is what counts.
	cfg := DefaultConfig()
	cfg.Namespace, cfg.Name = "koord", "slo"
	p = newPolicy(t, cfg, nil)
	r := cmReq(admissionv1.Create, bad, nil)
	r.Namespace, r.Name = "koord", "slo"
	r.Object.Raw = cmRaw("koord", "slo", bad)
	if v := p.ValidateConfigMap(ctx, r); v.Allowed {
		t.Fatal("configured ConfigMap allowed")
	}
	if v := p.ValidateConfigMap(ctx, cmReq(admissionv1.Create, bad, nil)); !v.Allowed {
		t.Fatal("default location judged under a configured one")
	}
}

// TestNameCheck ports checker_test.go's name cases (profile name empty,
// conflict), active with nodeStrategyNameCheck (upstream
// --node-strategy-name-need-check).
func TestNameCheck(t *testing.T) {
	cfg := DefaultConfig()
	ctx := context.Background()
	unnamed := colocation(`{"nodeSelector":{"matchLabels":{"a":"a"}}}`)
	dup := colocation(`{"name":"x","nodeSelector":{"matchLabels":{"a":"a"}}}`, `{"name":"x","nodeSelector":{"matchLabels":{"b":"b"}}}`)
	if v := newPolicy(t, cfg, nil).ValidateConfigMap(ctx, cmReq(admissionv1.Create, unnamed, nil)); !v.Allowed {
		t.Fatalf("name check off: %s", v.Message)
	}
	cfg.NodeStrategyNameCheck = true
	p := newPolicy(t, cfg, nil)
	if v := p.ValidateConfigMap(ctx, cmReq(admissionv1.Create, unnamed, nil)); v.Allowed || !strings.Contains(v.Message, "nodeConfig Name need! configType:colocation-config") {
		t.Fatalf("unnamed: %+v", v)
	}
	if v := p.ValidateConfigMap(ctx, cmReq(admissionv1.Create, dup, nil)); v.Allowed || !strings.Contains(v.Message, "nodeConfig Name confilict") {
		t.Fatalf("duplicate: %+v", v)
	}
}

// TestBounds: what one ConfigMap controls is bounded, each bound with a
// message naming it.
func TestBounds(t *testing.T) {
	p := newPolicy(t, DefaultConfig(), nil)
	ctx := context.Background()
	strategies := func(n int) []string {
		var out []string
		for i := 0; i < n; i++ {
			out = append(out, fmt.Sprintf(`{"name":"s%d","nodeSelector":{"matchLabels":{"k%d":"v"}}}`, i, i))
		}
		return out
	}
	values := func(n int) string {
		var vs []string
		for i := 0; i < n; i++ {
			vs = append(vs, fmt.Sprintf("%q", fmt.Sprint(i)))
		}
		return strings.Join(vs, ",")
	}
	var exprs []string
	for i := 0; i < 4; i++ {
		exprs = append(exprs, fmt.Sprintf(`{"key":"k%d","operator":"In","values":[%s]}`, i, values(10)))
	}
	var labels []string
	for i := 0; i < MaxSelectorRequirements+1; i++ {
		labels = append(labels, fmt.Sprintf(`"k%d":"v"`, i))
	}
	for _, tc := range []struct {
		name string
		data map[string]string
		want string
	}{
		{"value size", map[string]string{ColocationConfigKey: `{"extensions":{"x":"` + strings.Repeat("a", MaxValueBytes) + `"}}`}, "more than 262144"},
		{"node strategies", colocation(strategies(MaxNodeStrategies + 1)...), "65 node strategies, more than 64"},
		{"selector requirements", colocation(`{"name":"a","nodeSelector":{"matchLabels":{` + strings.Join(labels, ",") + `}}}`), "33 requirements, more than 32"},
		{"values per expression", colocation(`{"name":"a","nodeSelector":{"matchExpressions":[{"key":"k","operator":"In","values":[` + values(MaxSelectorValues+1) + `]}]}}`), "65 values, more than 64"},
		{"virtual nodes (10^4 label sets)", colocation(`{"name":"a","nodeSelector":{"matchExpressions":[` + strings.Join(exprs, ",") + `]}}`), "more than 4096 label sets"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := p.ValidateConfigMap(ctx, cmReq(admissionv1.Create, tc.data, nil))
			if v.Allowed || v.Code != 400 || !strings.Contains(v.Message, tc.want) {
				t.Fatalf("got %+v, want 400 containing %q", v, tc.want)
			}
		})
	}
	// At the bounds, accepted.
	if v := p.ValidateConfigMap(ctx, cmReq(admissionv1.Create, colocation(strategies(MaxNodeStrategies)...), nil)); !v.Allowed {
		t.Fatalf("64 strategies: %s", v.Message)
	}
}

// TestNullConfig: upstream panics on a key holding JSON null
// (a nil config dereferenced); kadmit refuses it with a message.
func TestNullConfig(t *testing.T) {
	p := newPolicy(t, DefaultConfig(), nil)
	v := p.ValidateConfigMap(context.Background(), cmReq(admissionv1.Create, map[string]string{CPUBurstConfigKey: "null"}, nil))
	if v.Allowed || !strings.Contains(v.Message, "must be a JSON object, got null") {
		t.Fatalf("%+v", v)
	}
}

type fakeConfigMaps map[string]map[string]string

func (f fakeConfigMaps) Data(ns, name string) (map[string]string, bool) {
	d, ok := f[ns+"/"+name]
	return d, ok
}

func nodeReq(op admissionv1.Operation, labels, oldLabels map[string]string) *admission.Request {
	raw := func(l map[string]string) []byte {
		b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"name": "n1", "labels": l}})
		return b
	}
	var old []byte
	if op == admissionv1.Update {
		old = raw(oldLabels)
	}
	return testkit.Request(op, testkit.Nodes, raw(labels), old, testkit.Name("n1"))
}

// TestValidateNode ports pkg/webhook/node/plugins/sloconfig/
// slo_plugin_test.go (v1.8.0): a label change making the node match two
// node strategies of one key is refused on UPDATE; CREATE, unchanged
// labels, a missing ConfigMap and keys that do not parse are allowed.
func TestValidateNode(t *testing.T) {
	data := colocation(`{"name":"1","nodeSelector":{"matchLabels":{"xxx":"xxx"}}}`, `{"name":"2","nodeSelector":{"matchLabels":{"yyy":"yyy"}}}`)
	data[CPUBurstConfigKey] = `{"nodeStrategies":[{"name":"a"}]}` // no selector: skipped, as upstream
	cms := fakeConfigMaps{DefaultNamespace + "/" + DefaultName: data}
	p, err := New(DefaultConfig(), nil, cms)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	both := map[string]string{"xxx": "xxx", "yyy": "yyy"}
	for _, tc := range []struct {
		name string
		req  *admission.Request
		deny bool
	}{
		{"create with conflicting labels: only logged upstream", nodeReq(admissionv1.Create, both, nil), false},
		{"update, labels unchanged", nodeReq(admissionv1.Update, both, both), false},
		{"update to conflicting labels", nodeReq(admissionv1.Update, both, map[string]string{"xxx": "xxx"}), true},
		{"update to one strategy", nodeReq(admissionv1.Update, map[string]string{"yyy": "yyy"}, map[string]string{"xxx": "xxx"}), false},
	} {
		v := p.ValidateNode(ctx, tc.req)
		if v.Allowed == tc.deny {
			t.Fatalf("%s: %+v", tc.name, v)
		}
		if tc.deny && (v.Code != 400 || !strings.Contains(v.Message, `"exampleNodes":["n1"]`)) {
			t.Fatalf("%s: %+v", tc.name, v)
		}
	}
	p, _ = New(DefaultConfig(), nil, fakeConfigMaps{})
	if v := p.ValidateNode(ctx, nodeReq(admissionv1.Update, both, nil)); !v.Allowed {
		t.Fatalf("no ConfigMap: %+v", v)
	}
	status := nodeReq(admissionv1.Update, both, nil)
	status.SubResource = "status"
	if v := p.ValidateNode(ctx, status); !v.Allowed {
		t.Fatal("nodes/status judged")
	}
}

func TestHooks(t *testing.T) {
	p := newPolicy(t, DefaultConfig(), nil)
	hs := p.Hooks()
	if len(hs) != 2 || hs[0].Path != "/validate-configmap" || hs[1].Path != "/validate-node" ||
		string(hs[0].FailurePolicy) != "Fail" || string(hs[1].FailurePolicy) != "Ignore" ||
		len(hs[0].Rules[0].Operations) != 3 || hs[0].Namespaces[0] != DefaultNamespace {
		t.Fatalf("%+v", hs)
	}
	cfg := DefaultConfig()
	cfg.NodeCheck = false
	if hs := newPolicy(t, cfg, nil).Hooks(); len(hs) != 1 {
		t.Fatalf("nodeCheck off: %d hooks", len(hs))
	}
	for _, bad := range []Config{{Namespace: "kube-system", Name: "x"}, {Namespace: "A", Name: "x"}, {Namespace: "a", Name: ""}} {
		if bad.Validate() == nil {
			t.Fatalf("%+v accepted", bad)
		}
	}
}

// TestNodeCheckDeadline: a request whose deadline passes during the node
// check gets 500 (no decision), not a verdict on the config.
func TestNodeCheckDeadline(t *testing.T) {
	p := newPolicy(t, DefaultConfig(), informerNodesFor(t, 1000))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	v := p.ValidateConfigMap(ctx, cmReq(admissionv1.Create, colocation(
		`{"name":"1","nodeSelector":{"matchLabels":{"1":"1"}}}`, `{"name":"2","nodeSelector":{"matchLabels":{"2":"2"}}}`), nil))
	if v.Allowed || v.Code != 500 || !strings.Contains(v.Message, "context canceled") {
		t.Fatalf("%+v", v)
	}
}

// TestValidateNodeUpstreamTable ports
// pkg/webhook/node/plugins/sloconfig/slo_plugin_test.go (v1.8.0): the
// stored slo-controller-config and a node label change (old labels {}).
func TestValidateNodeUpstreamTable(t *testing.T) {
	colo := `{"enable":true,"metricAggregateDurationSeconds":60,"cpuReclaimThresholdPercent":70,"memoryReclaimThresholdPercent":80,"updateTimeThresholdSeconds":300,"degradeTimeMinutes":5,"resourceDiffThreshold":0.1%s}`
	two := fmt.Sprintf(colo, `,"nodeConfigs":[{"nodeSelector":{"matchLabels":{"xxx":"xxx"}},"enable":true},{"nodeSelector":{"matchLabels":{"yyy":"yyy"}},"enable":true}]`)
	others := map[string]string{
		ResourceThresholdConfigKey: `{"clusterStrategy":{"enable":true,"cpuSuppressThresholdPercent":60}}`,
		ResourceQOSConfigKey:       `{"clusterStrategy":{"enable":true,"beClass":{"cpuQOS":{"groupIdentity":0}}}}`,
		SystemConfigKey:            `{"clusterStrategy":{"minFreeKbytesFactor":150}}`,
	}
	with := func(kv ...string) map[string]string {
		out := map[string]string{}
		for k, v := range others {
			out[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			out[kv[i]] = kv[i+1]
		}
		return out
	}
	xy := map[string]string{"xxx": "xxx", "yyy": "yyy"}
	for _, tc := range []struct {
		name       string
		op         admissionv1.Operation
		data       map[string]string
		old, label map[string]string
		deny       bool
	}{
		{"update node, config invalid", admissionv1.Update, map[string]string{ResourceThresholdConfigKey: "invalid_content", ResourceQOSConfigKey: "invalid_content", CPUBurstConfigKey: "invalid_content", SystemConfigKey: "invalid_content"}, map[string]string{}, map[string]string{"xxx": "xxx"}, false},
		{"update node, colocation not configured", admissionv1.Update, with(), map[string]string{}, map[string]string{"xxx": "xxx"}, false},
		{"update node, config has no node strategies", admissionv1.Update, with(ColocationConfigKey, fmt.Sprintf(colo, "")), map[string]string{}, map[string]string{"xxx": "xxx"}, false},
		{"update node, node strategies but no conflict", admissionv1.Update, with(ColocationConfigKey, two), map[string]string{}, map[string]string{"xxx": "xxx"}, false},
		{"update node, node strategies conflict", admissionv1.Update, with(ColocationConfigKey, two, CPUBurstConfigKey, `{"clusterStrategy":{"cfsQuotaBurstPeriodSeconds":60}}`), map[string]string{}, xy, true},
		{"update node, cpuburst invalid, other config conflicts", admissionv1.Update, with(ColocationConfigKey, two), map[string]string{}, xy, true},
		{"update node, labels not changed", admissionv1.Update, with(ColocationConfigKey, two), xy, xy, false},
		{"create node: conflict only logged", admissionv1.Create, with(ColocationConfigKey, two), nil, xy, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := New(DefaultConfig(), nil, fakeConfigMaps{DefaultNamespace + "/" + DefaultName: tc.data})
			if err != nil {
				t.Fatal(err)
			}
			v := p.ValidateNode(context.Background(), nodeReq(tc.op, tc.label, tc.old))
			if v.Allowed == tc.deny {
				t.Fatalf("%+v", v)
			}
			if tc.deny && (v.Code != 400 || !strings.Contains(v.Message, `"reason":"ExistNodeConfict"`)) {
				t.Fatalf("%+v", v)
			}
		})
	}
}
