package nodeovercommit

import (
	"context"
	"os"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/kadmit/kadmit/internal/jsonedit"
	"github.com/kadmit/kadmit/internal/policy/policytest"
)

// TestMutateDifferential: on every node of the corpus, Mutate's operations
// applied by the API server's JSONPatch library give what making the
// planned change on a typed corev1.Node gives, and change nothing else.
func TestMutateDifferential(t *testing.T) {
	benchNode, err := os.ReadFile("../../../admission/testdata/node.json")
	if err != nil {
		t.Fatal(err)
	}
	raw := `{"allocatable":{"cpu":"3500m"},"capacity":{"cpu":"4"}}`
	corpus := map[string]string{
		"bench node":         string(benchNode),
		"no annotations":     node(t, nil, map[string]string{"cpu": "4"}, map[string]string{"cpu": "3500m"}),
		"other annotations":  node(t, map[string]string{"a/b~c": "ü", "big": strings.Repeat("y", 100000), "h": "<&>"}, map[string]string{"cpu": "4"}, map[string]string{"cpu": "3500m"}),
		"already amplified":  node(t, map[string]string{AnnotationRaw: raw}, map[string]string{"cpu": "7500m"}, map[string]string{"cpu": "7"}),
		"new raw values":     node(t, map[string]string{AnnotationRaw: raw}, map[string]string{"cpu": "8"}, map[string]string{"cpu": "8"}),
		"unreadable raw":     node(t, map[string]string{AnnotationRaw: "{"}, map[string]string{"cpu": "4"}, map[string]string{"cpu": "3500m"}),
		"stale raw, no cpu":  node(t, map[string]string{AnnotationRaw: raw}, map[string]string{"memory": "1Gi"}, map[string]string{"memory": "1Gi"}),
		"ratio override":     node(t, map[string]string{AnnotationRatio: `{"cpu":"1.5","example.com/gpu":"2"}`}, map[string]string{"cpu": "4", "example.com/gpu": "2"}, map[string]string{"cpu": "4", "example.com/gpu": "2"}),
		"bad override":       node(t, map[string]string{AnnotationRatio: `x`}, map[string]string{"cpu": "4"}, map[string]string{"cpu": "4"}),
		"no status":          `{"metadata":{"name":"n"}}`,
		"no metadata":        `{"status":{"capacity":{"cpu":"2"},"allocatable":{"cpu":"2"}}}`,
		"metadata null":      `{"metadata":null,"status":{"capacity":{"cpu":"2"},"allocatable":{"cpu":"2"}}}`,
		"annotations null":   `{"metadata":{"name":"n","annotations":null},"status":{"capacity":{"cpu":"2"},"allocatable":{"cpu":"2"}}}`,
		"numbers above 2^53": `{"metadata":{"name":"n","generation":9007199254740993},"spec":{"unknown":12345678901234567890},"status":{"capacity":{"cpu":"2"},"allocatable":{"cpu":"2"},"daemonEndpoints":{"kubeletEndpoint":{"Port":10250}}}}`,
		"escaped keys":       `{"st\u0061tus":{"c\u0061pacity":{"cpu":"2"},"allocatable":{"cpu":"2"}}}`,
		"case-variant":       `{"Metadata":{"annotations":{}},"status":{"capacity":{"cpu":"2"},"allocatable":{"cpu":"2"}}}`,
		"duplicate status":   `{"status":{"capacity":{"cpu":"9"}},"status":{"capacity":{"cpu":"2"},"allocatable":{"cpu":"2"}}}`,
	}
	cfg := DefaultConfig()
	cfg.Ratios = map[corev1.ResourceName]string{"cpu": "2", "example.com/gpu": "1.5"}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for name, in := range corpus {
		t.Run(name, func(t *testing.T) {
			ops, v := p.Mutate(context.Background(), request(admissionv1.Create, "", in, ""))
			if !v.Allowed {
				t.Fatalf("denied: %+v", v)
			}
			pl, _ := p.plan(jsonedit.NewDoc([]byte(in)))
			policytest.Check(t, []byte(in), ops, func(n *corev1.Node) {
				if pl == nil {
					return
				}
				if pl.rewrite {
					if pl.newRaw == nil {
						delete(n.Annotations, AnnotationRaw)
					} else {
						if n.Annotations == nil {
							n.Annotations = map[string]string{}
						}
						n.Annotations[AnnotationRaw] = *pl.newRaw
					}
				}
				for _, c := range pl.changes {
					n.Status.Allocatable[c.name] = c.allocatable
					n.Status.Capacity[c.name] = c.capacity
				}
			})
		})
	}
}
