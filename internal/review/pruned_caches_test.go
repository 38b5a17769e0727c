package review

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/builtin"
	"github.com/kadmit/kadmit/internal/clustercache"
	"github.com/kadmit/kadmit/internal/policy"
)

// wholeStateWebhooks is stateWebhooks with caches that keep whole objects:
// the reference the declared fields are checked against.
func wholeStateWebhooks(t *testing.T, cfgYAML, stateDir string) []*admission.Webhook {
	t.Helper()
	cfg, err := builtin.Config.Parse([]byte(cfgYAML))
	if err != nil {
		t.Fatal(err)
	}
	var reads []clustercache.Read
	for _, r := range builtin.Caches(cfg) {
		reads = append(reads, r.Resource.Whole())
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	env := policy.Env{}
	if env.Cluster, err = LoadState(ctx, stateDir, reads); err != nil {
		t.Fatal(err)
	}
	whs, err := builtin.Webhooks(cfg, env)
	if err != nil {
		t.Fatal(err)
	}
	return whs
}

// junk is what a user may add to any object the caches hold: a large
// annotation no policy reads.
var junk = `junk.example.com/blob: "` + strings.Repeat("x", 64<<10) + `"`

// junkEnv is a container env no policy reads.
var junkEnv = `env: [{name: A, value: "` + strings.Repeat("e", 16<<10) + `"}, {name: B, value: b}]`

// TestPrunedCachesSameVerdicts is the differential test of the declared
// cache fields (policy.Definition.Caches): for each policy that reads the
// cluster, every review gets the same answer (verdict, message, warnings,
// patch) from caches that keep only the declared fields as from caches
// that keep whole objects. Each case also asserts its reviews do not all
// get the same answer, so a field the policy reads matters to the outcome.
func TestPrunedCachesSameVerdicts(t *testing.T) {
	cases := []struct {
		name    string
		cfg     string
		state   map[string]string
		reviews []string
	}{{
		// Used: a (1 cpu + a 1 cpu sidecar + 500m overhead = 2.5); b has
		// Succeeded and c is past its deletion grace: neither counts.
		// Max 6: a 3 cpu pod fits, a 4 cpu pod does not. Read without
		// phase, b counts; without restartPolicy, a's sidecar is a plain
		// init container and a counts 1.5.
		name: "elasticQuota",
		cfg:  "apiVersion: kadmit.io/v1alpha1\nkind: Configuration\npolicies:\n  elasticQuota: {enabled: true, quotaAdmission: true}\n",
		state: map[string]string{
			"quota.yaml": `apiVersion: scheduling.sigs.k8s.io/v1alpha1
kind: ElasticQuota
metadata: {name: team-a, namespace: team, annotations: {` + junk + `}}
spec: {min: {cpu: "1"}, max: {cpu: "6"}}
`,
			"a.yaml": `apiVersion: v1
kind: Pod
metadata: {name: a, namespace: team, labels: {quota.scheduling.koordinator.sh/name: team-a, app: a}, annotations: {` + junk + `}}
spec:
  overhead: {cpu: 500m}
  initContainers: [{name: side, image: pause, restartPolicy: Always, resources: {requests: {cpu: "1"}}, ` + junkEnv + `}]
  containers: [{name: c, image: pause, resources: {requests: {cpu: "1"}}, ` + junkEnv + `}]
  volumes: [{name: v, emptyDir: {}}]
status: {phase: Running, podIP: 10.0.0.1}
`,
			"b.yaml": `apiVersion: v1
kind: Pod
metadata: {name: b, namespace: team, labels: {quota.scheduling.koordinator.sh/name: team-a}}
spec:
  containers: [{name: c, image: pause, resources: {requests: {cpu: "3"}}}]
status: {phase: Succeeded}
`,
			"c.yaml": `apiVersion: v1
kind: Pod
metadata: {name: c, namespace: team, labels: {quota.scheduling.koordinator.sh/name: team-a}, deletionTimestamp: "2020-01-01T00:00:00Z", deletionGracePeriodSeconds: 1}
spec:
  containers: [{name: c, image: pause, resources: {limits: {cpu: "3"}}}]
status: {phase: Running}
`,
		},
		reviews: []string{
			"apiVersion: v1\nkind: Pod\nmetadata: {name: fits, namespace: team, labels: {quota.scheduling.koordinator.sh/name: team-a}}\nspec:\n  containers: [{name: c, image: pause, resources: {requests: {cpu: \"3\"}}}]\n",
			"apiVersion: v1\nkind: Pod\nmetadata: {name: over, namespace: team, labels: {quota.scheduling.koordinator.sh/name: team-a}}\nspec:\n  containers: [{name: c, image: pause, resources: {requests: {cpu: \"4\"}}}]\n",
		},
	}, {
		// A LocalQueue is looked up by name (requireQueue); namespaces by
		// labels (managedJobsNamespaceSelector): only team is managed, so
		// only there is a job without a queue suspended.
		name: "jobQueue",
		cfg:  "apiVersion: kadmit.io/v1alpha1\nkind: Configuration\npolicies:\n  jobQueue: {enabled: true, requireQueue: true, manageJobsWithoutQueueName: true, managedJobsNamespaceSelector: {matchLabels: {kueue: managed}}}\n",
		state: map[string]string{
			"ns.yaml":  "apiVersion: v1\nkind: Namespace\nmetadata: {name: team, labels: {kueue: managed}, annotations: {" + junk + "}}\n",
			"ns2.yaml": "apiVersion: v1\nkind: Namespace\nmetadata: {name: other, labels: {kueue: \"off\"}}\n",
			"lq.yaml":  "apiVersion: kueue.x-k8s.io/v1beta1\nkind: LocalQueue\nmetadata: {name: main, namespace: team, annotations: {" + junk + "}}\nspec: {clusterQueue: cq}\n",
		},
		reviews: []string{
			plainJob,
			strings.Replace(plainJob, "namespace: team", "namespace: other", 1),
			strings.Replace(plainJob, "metadata: {name: j, namespace: team}", "metadata: {name: j, namespace: team, labels: {kueue.x-k8s.io/queue-name: main}}", 1),
			strings.Replace(plainJob, "metadata: {name: j, namespace: team}", "metadata: {name: j, namespace: team, labels: {kueue.x-k8s.io/queue-name: gone}}", 1),
		},
	}, {
		// Colocation reads namespace labels (namespaceSelector) and the
		// PriorityClass's value and preemptionPolicy.
		name: "colocation",
		cfg: `apiVersion: kadmit.io/v1alpha1
kind: Configuration
policies:
  colocation:
    enabled: true
    profiles:
    - {name: batch, namespaceSelector: {matchLabels: {colo: "on"}}, selector: {matchLabels: {qos: be}}, qosClass: BE, priorityClassName: koord-batch}
`,
		state: map[string]string{
			"ns.yaml": "apiVersion: v1\nkind: Namespace\nmetadata: {name: team, labels: {colo: \"on\"}, annotations: {" + junk + "}}\n",
			"pc.yaml": "apiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\nmetadata: {name: koord-batch, annotations: {" + junk + "}}\nvalue: 5500\npreemptionPolicy: Never\ndescription: batch\n",
		},
		reviews: []string{
			"apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: team, labels: {qos: be}}\nspec:\n  containers: [{name: c, image: pause}]\n",
			"apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: elsewhere, labels: {qos: be}}\nspec:\n  containers: [{name: c, image: pause}]\n",
		},
	}, {
		// checkAllocations reads a Reservation's status phase, allocatable
		// and allocated: 1 cpu is left.
		name: "reservation",
		cfg:  "apiVersion: kadmit.io/v1alpha1\nkind: Configuration\npolicies:\n  reservation: {enabled: true, checkAllocations: true}\n",
		state: map[string]string{
			"r.yaml": `apiVersion: scheduling.koordinator.sh/v1alpha1
kind: Reservation
metadata: {name: r1, annotations: {` + junk + `}}
spec: {template: {spec: {containers: [{name: c, image: pause, ` + junkEnv + `}]}}}
status: {phase: Available, allocatable: {cpu: "4"}, allocated: {cpu: "3"}}
`,
		},
		reviews: []string{
			"apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: team, annotations: {scheduling.koordinator.sh/reservation-affinity: '{\"name\":\"r1\"}'}}\nspec:\n  containers: [{name: c, image: pause, resources: {requests: {cpu: \"1\"}}}]\n",
			"apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: team, annotations: {scheduling.koordinator.sh/reservation-affinity: '{\"name\":\"r1\"}'}}\nspec:\n  containers: [{name: c, image: pause, resources: {requests: {cpu: \"2\"}}}]\n",
		},
	}, {
		// slo-config's conflict check reads node labels: n1 is matched by
		// both strategies of the first review, by one of the second's.
		name: "sloConfig",
		cfg:  "apiVersion: kadmit.io/v1alpha1\nkind: Configuration\npolicies:\n  sloConfig: {enabled: true, namespace: koordinator-system, name: slo-controller-config, nodeCheck: true}\n",
		state: map[string]string{
			"gpu.yaml": "apiVersion: v1\nkind: Node\nmetadata: {name: n1, labels: {node-pool: gpu, size: big}, annotations: {" + junk + "}}\n",
			"cm.yaml":  "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: other, namespace: koordinator-system, annotations: {" + junk + "}}\ndata: {a: b}\n",
		},
		reviews: []string{
			`apiVersion: v1
kind: ConfigMap
metadata: {name: slo-controller-config, namespace: koordinator-system}
data:
  resource-threshold-config: '{"nodeStrategies": [{"name": "gpu", "nodeSelector": {"matchLabels": {"node-pool": "gpu"}}}, {"name": "big", "nodeSelector": {"matchLabels": {"size": "big"}}}]}'
`,
			`apiVersion: v1
kind: ConfigMap
metadata: {name: slo-controller-config, namespace: koordinator-system}
data:
  resource-threshold-config: '{"nodeStrategies": [{"name": "gpu", "nodeSelector": {"matchLabels": {"node-pool": "gpu"}}}, {"name": "cpu", "nodeSelector": {"matchLabels": {"node-pool": "cpu"}}}]}'
`,
		},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, body := range tc.state {
				write(t, dir, name, body)
			}
			pruned, whole := stateWebhooks(t, tc.cfg, dir), wholeStateWebhooks(t, tc.cfg, dir)
			var answers []string
			for i, m := range tc.reviews {
				got, want := answer(t, review1(t, pruned, m)), answer(t, review1(t, whole, m))
				if got != want {
					t.Errorf("review %d: pruned caches answer\n%s\nwhole objects answer\n%s", i, got, want)
				}
				answers = append(answers, want)
			}
			if answers[0] == answers[1] {
				t.Errorf("both reviews answer %s: the case does not depend on the cached fields", answers[0])
			}
		})
	}
}

// answer is what a review returns to the API server, as JSON: verdict,
// code, message, warnings and patch.
func answer(t *testing.T, r *Result) string {
	t.Helper()
	b, err := json.Marshal(struct {
		Allowed  bool
		Code     int32
		Message  string
		Warnings []string
		Patch    any
	}{r.Allowed, r.Code, r.Message, r.Warnings, r.Patch})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
