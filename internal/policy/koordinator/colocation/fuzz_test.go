package colocation

import (
	"encoding/json"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"

	"github.com/kadmit/kadmit/internal/jsonedit"
)

// FuzzPod feeds fuzzed pods to the mutator (profiles that set QoS BE and a
// batch priority, so the translation and the extended-resource-spec run)
// and to the validator at CREATE and UPDATE: every answer is an allow, a
// 400 or a 500 within the budget, and a patch applies to the pod sent and
// gives valid JSON.
func FuzzPod(f *testing.F) {
	for _, s := range [][]string{{"500m", "BE"}, {"1e9999999", "LSR"}, {"2", "LSE"}, {"1Gi", "\\u0042E"}, {"0", ""}} {
		f.Add(s[0], s[1], int64(5500), "")
	}
	f.Add("1", "BE", int64(9000), `{"metadata":{"annotations":{"node.koordinator.sh/extended-resource-spec":"{\"containers\":{\"c\":{\"limits\":{\"kubernetes.io/batch-cpu\":\"1e9999999\"}}}}"}},"spec":null}`)
	p, err := New(Config{Profiles: []Profile{
		{Name: "be", QoSClass: "BE", PriorityClassName: "koord-batch", LabelKeysMapping: map[string]string{"qos": "copy"}, LabelSuffixes: map[string]string{"copy": "-x"}},
		{Name: "mid", Labels: map[string]string{"koordinator.sh/priority-class": "koord-mid"}, Probability: nil},
	}}, nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, q, s string, n int64, raw string) {
		obj := `{"metadata":{"name":"p","labels":{"koordinator.sh/qosClass":` + mustJS(s) + `,"qos":` + mustJS(s) + `},"annotations":{"x":` + mustJS(q) + `}},` +
			`"spec":{"priority":` + mustJS(n) + `,"overhead":{"memory":` + mustJS(q) + `},"initContainers":[{"name":"i","resources":{"limits":{"cpu":` + mustJS(q) + `}}}],` +
			`"containers":[{"name":"c","resources":{"requests":{"cpu":` + mustJS(q) + `,"kubernetes.io/batch-memory":` + mustJS(q) + `},"limits":{"memory":` + mustJS(q) + `}}}]}}`
		objects := []string{obj}
		if json.Valid([]byte(raw)) {
			objects = append(objects, raw)
		}
		for _, o := range objects {
			start := time.Now()
			ops, v := p.Mutate(t.Context(), podReq("ns", admissionv1.Create, []byte(o), nil))
			check(t, "mutate", v.Allowed, v.Code, o)
			if len(ops) > 0 {
				out, err := jsonedit.Apply([]byte(o), ops)
				if err != nil || !json.Valid(out) {
					t.Fatalf("patch %v on %s: %v", ops, o, err)
				}
			}
			for _, op := range []admissionv1.Operation{admissionv1.Create, admissionv1.Update} {
				v := p.Validate(t.Context(), podReq("ns", op, []byte(o), []byte(obj)))
				check(t, "validate", v.Allowed, v.Code, o)
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Fatalf("%v for %.200s", d, o)
			}
		}
	})
}

func check(t *testing.T, what string, allowed bool, code int32, obj string) {
	t.Helper()
	if !allowed && code != 400 && code != 500 {
		t.Fatalf("%s: code %d for %.300s", what, code, obj)
	}
}

func mustJS(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}
