package sloconfig

import (
	"context"
	"fmt"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
)

// worstCase is a colocation-config at every bound: 64 node strategies, the
// first with an expression set that builds 8×8×8×7 = 3584 label sets for the
// overlap check, the others one label each (3647 of MaxVirtualNodes 4096).
func worstCase() map[string]string {
	var s []string
	var vals []string
	for i := 0; i < 8; i++ {
		vals = append(vals, fmt.Sprintf("%q", fmt.Sprint(i)))
	}
	var exprs []string
	for i := 0; i < 4; i++ {
		vs := vals
		if i == 3 {
			vs = vals[:7]
		}
		exprs = append(exprs, fmt.Sprintf(`{"key":"e%d","operator":"In","values":[%s]}`, i, strings.Join(vs, ",")))
	}
	s = append(s, `{"name":"wide","nodeSelector":{"matchExpressions":[`+strings.Join(exprs, ",")+`]}}`)
	for i := 1; i < MaxNodeStrategies; i++ {
		s = append(s, fmt.Sprintf(`{"name":"s%d","nodeSelector":{"matchLabels":{"k%d":"v"}}}`, i, i))
	}
	return colocation(s...)
}

// BenchmarkValidateConfigMap: a typical config (every key, one node
// strategy each) and the bounded worst case with 5000 nodes to check.
//
//	go test ./internal/policy/koordinator/sloconfig/ -run '^$' -bench . -benchtime 20x
func BenchmarkValidateConfigMap(b *testing.B) {
	nodes := fakeNodes{}
	for i := 0; i < 5000; i++ {
		nodes[fmt.Sprintf("node-%04d", i)] = map[string]string{"kubernetes.io/hostname": fmt.Sprint(i), fmt.Sprintf("k%d", i%200): "v"}
	}
	typical := map[string]string{
		ColocationConfigKey:        `{"enable":true,"metricAggregateDurationSeconds":300,"cpuReclaimThresholdPercent":60,"nodeConfigs":[{"name":"a","nodeSelector":{"matchLabels":{"pool":"a"}},"cpuReclaimThresholdPercent":70}]}`,
		ResourceThresholdConfigKey: `{"clusterStrategy":{"enable":true,"cpuSuppressThresholdPercent":65},"nodeStrategies":[{"name":"a","nodeSelector":{"matchLabels":{"pool":"a"}},"cpuSuppressThresholdPercent":60}]}`,
		ResourceQOSConfigKey:       `{"clusterStrategy":{"lsrClass":{"cpuQOS":{"enable":true,"groupIdentity":2},"networkQOS":{"ingressRequest":20}}}}`,
		SystemConfigKey:            `{"clusterStrategy":{"minFreeKbytesFactor":100,"totalNetworkBandwidth":"10G"}}`,
		CPUBurstConfigKey:          `{"clusterStrategy":{"policy":"auto","cpuBurstPercent":1000}}`,
	}
	for _, c := range []struct {
		name string
		data map[string]string
	}{{"typical", typical}, {"worst-case-5000-nodes", worstCase()}} {
		b.Run(c.name, func(b *testing.B) {
			p, err := New(DefaultConfig(), nodes, nil)
			if err != nil {
				b.Fatal(err)
			}
			req := cmReq(admissionv1.Create, c.data, nil)
			b.ReportAllocs()
			for b.Loop() {
				if v := p.ValidateConfigMap(context.Background(), req); !v.Allowed {
					b.Fatal(v.Message)
				}
			}
		})
	}
}

// FuzzValidateConfigMap: whatever a key holds, the policy answers (never
// panics) with an allowance or a 400.
func FuzzValidateConfigMap(f *testing.F) {
	for _, s := range []string{`{}`, `null`, `{"nodeConfigs":[{"nodeSelector":{}}]}`, `{"clusterStrategy":{"lsrClass":{"networkQOS":{"ingressRequest":"1e9999999"}}}}`,
		`{"nodeStrategies":[{"name":"a","nodeSelector":{"matchExpressions":[{"key":"a","operator":"In","values":["x"]}]}},{"nodeSelector":{"matchLabels":{"a":"x"}}}]}`} {
		f.Add(s)
	}
	p, err := New(Config{Namespace: DefaultNamespace, Name: DefaultName, NodeStrategyNameCheck: true}, fakeNodes{"n": {"a": "x"}}, nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, k := range kinds {
			data := map[string]string{k.key: s, SystemConfigKey: s}
			v := p.ValidateConfigMap(context.Background(), cmReq(admissionv1.Create, data, nil))
			if !v.Allowed && v.Code != 400 {
				t.Fatalf("%s=%q: %+v", k.key, s, v)
			}
		}
	})
}
