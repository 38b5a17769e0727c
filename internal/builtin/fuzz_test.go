package builtin

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// fuzzBudget is how long one review may take under fuzzing: the handler's
// ?timeout=10s would turn anything slower into HTTP 500; a policy doing
// bounded work answers in microseconds, so this only catches runaway cost.
const fuzzBudget = 2 * time.Second

// fuzzCase is one fuzzed request: obj builds the object from the fuzzed
// quantity q, a fuzzed string s (a label, annotation or name) and n, and the
// request goes to every target.
type fuzzCase struct {
	targets []target
	obj     func(q, s string, n int64) string
	seeds   [][]string // q, s
}

// runFuzz feeds fc through the production handlers with every built-in
// policy enabled. Each call must answer within fuzzBudget with HTTP 200 (a
// recovered panic is a 500 and fails), echo the request's uid and, on
// mutating paths, return a JSONPatch that applies to the object sent and
// yields valid JSON (call checks all of it). raw, when valid JSON, is also
// sent as the object itself.
func runFuzz(f *testing.F, fc fuzzCase) {
	for _, s := range fc.seeds {
		f.Add(s[0], s[1], int64(1), "")
	}
	f.Add("1e9999999", "x", int64(3), `{"metadata":{"annotations":{"a":"b"}},"spec":null,"status":[]}`)
	hs := handlers(f)
	f.Fuzz(func(t *testing.T, q, s string, n int64, raw string) {
		objects := []string{fc.obj(q, s, n)}
		if json.Valid([]byte(raw)) {
			objects = append(objects, raw)
		}
		for _, obj := range objects {
			for _, tg := range fc.targets {
				start := time.Now()
				call(t, hs, tg, "uid-"+tg.path, obj, obj)
				if d := time.Since(start); d > fuzzBudget {
					t.Errorf("%s: answered after %v, over the %v budget: %.200s", tg.path, d, fuzzBudget, obj)
				}
			}
		}
	})
}

// js quotes s as a JSON string.
func js(s string) string { return mustJSON(s) }

var quantitySeeds = [][]string{
	{"4", "3"}, {"3500m", "15"}, {"1e9999999", "be"}, {"-1e9999999", ""}, {"1E-9999999", "offensive"},
	{"1" + strings.Repeat("0", 100), "a/b"}, {"8Gi", `{"cpu":"1.5"}`}, {"0.5", `{"allocatable":{"cpu":"1"},"capacity":{"cpu":"2"}}`},
}

func FuzzPodName(f *testing.F) {
	runFuzz(f, fuzzCase{targets: []target{podValidate}, seeds: quantitySeeds, obj: func(q, s string, n int64) string {
		return `{"metadata":{"name":` + js(s) + `,"generateName":` + js(q) + `,"namespace":"team-a"},"spec":{"containers":[{"name":"c","image":"i"}]}}`
	}})
}

func FuzzLifespan(f *testing.F) {
	runFuzz(f, fuzzCase{targets: []target{podCreate}, seeds: quantitySeeds, obj: func(q, s string, n int64) string {
		return `{"metadata":{"name":"p","namespace":"team-a","labels":{"acme.com/lifespan-requested":` + js(s) + `}},"spec":{"containers":[{"name":"c","image":"i"}],"tolerations":[{"key":` + js(q) + `,"operator":"Exists"}]}}`
	}})
}

func FuzzColocation(f *testing.F) {
	runFuzz(f, fuzzCase{targets: []target{podCreate}, seeds: quantitySeeds, obj: func(q, s string, n int64) string {
		return `{"metadata":{"name":"p","namespace":"team-a","labels":{"qos":` + js(s) + `},"annotations":{"x":` + js(q) + `}},"spec":{"priority":` + mustJSON(n) + `,"nodeSelector":{"a":` + js(s) + `},"containers":[{"name":"c","image":"i","resources":{"requests":{"cpu":` + js(q) + `}}}]}}`
	}})
}

func FuzzNodeOvercommit(f *testing.F) {
	runFuzz(f, fuzzCase{targets: []target{nodeStatus, nodeValidate}, seeds: quantitySeeds, obj: func(q, s string, n int64) string {
		return `{"metadata":{"name":"n","annotations":{"kadmit.io/overcommit-ratio":` + js(s) + `,"kadmit.io/raw-allocatable":` + js(`{"allocatable":{"cpu":`+js(q)+`},"capacity":{"cpu":"4"}}`) + `}},` +
			`"status":{"capacity":{"cpu":` + js(q) + `,"memory":"8Gi"},"allocatable":{"cpu":` + mustJSON(n) + `,"memory":` + js(q) + `}}}`
	}})
}

func FuzzJobQueue(f *testing.F) {
	runFuzz(f, fuzzCase{targets: []target{jobMutate, jobValidate}, seeds: quantitySeeds, obj: func(q, s string, n int64) string {
		return `{"metadata":{"name":"j","namespace":"team-a","labels":{"kueue.x-k8s.io/queue-name":` + js(s) + `}},"spec":{"parallelism":` + mustJSON(n%(1<<31)) + `,"suspend":false,"template":{"spec":{"containers":[{"name":"c","image":"i","resources":{"requests":{"cpu":` + js(q) + `},"limits":{"memory":` + js(q) + `}}}],"overhead":{"cpu":` + js(q) + `}}}}}`
	}})
}

func FuzzElasticQuota(f *testing.F) {
	runFuzz(f, fuzzCase{targets: []target{quotaMutate, quotaValidate, podValidate}, seeds: quantitySeeds, obj: func(q, s string, n int64) string {
		return `{"metadata":{"name":"q","namespace":"team-a","labels":{"quota.scheduling.koordinator.sh/parent":` + js(s) + `,"quota.scheduling.sigs.k8s.io/name":` + js(s) + `},"annotations":{"quota.scheduling.koordinator.sh/shared-weight":` + js(`{"cpu":`+js(q)+`}`) + `}},` +
			`"spec":{"min":{"cpu":` + js(q) + `},"max":{"cpu":` + js(q) + `,"memory":` + mustJSON(n) + `},"containers":[{"name":"c","resources":{"requests":{"cpu":` + js(q) + `}}}]}}`
	}})
}

func FuzzResourceFlavor(f *testing.F) {
	runFuzz(f, fuzzCase{targets: []target{flavorMutate, flavorValid}, seeds: quantitySeeds, obj: func(q, s string, n int64) string {
		return `{"metadata":{"name":` + js(s) + `},"spec":{"nodeLabels":{` + js(s) + `:` + js(q) + `},"nodeTaints":[{"key":` + js(s) + `,"value":` + js(q) + `,"effect":"NoSchedule"}]}}`
	}})
}

func FuzzKadmitConfig(f *testing.F) {
	runFuzz(f, fuzzCase{targets: []target{configMapVal}, seeds: quantitySeeds, obj: func(q, s string, n int64) string {
		cfg := "apiVersion: kadmit.io/v1alpha1\nkind: Configuration\npolicies:\n  jobQueue: {enabled: true, queues: [{name: main, quota: {cpu: " + js(q) + "}}]}\n  podName: {words: [" + js(s) + "]}\n"
		return `{"metadata":{"name":"kadmit","namespace":"kadmit-config"},"data":{"config.yaml":` + js(cfg) + `}}`
	}})
}
