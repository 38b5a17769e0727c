package review

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/builtin"
	"github.com/kadmit/kadmit/internal/clustercache"
	"github.com/kadmit/kadmit/internal/manifests"
	"github.com/kadmit/kadmit/internal/policy"
)

// stateWebhooks builds the webhooks of the configuration cfg (YAML) as
// `kadmit review --config --state` does: without state when stateDir is
// "", else with the caches LoadState builds from it.
func stateWebhooks(t *testing.T, cfgYAML, stateDir string) []*admission.Webhook {
	t.Helper()
	cfg, err := builtin.Config.Parse([]byte(cfgYAML))
	if err != nil {
		t.Fatal(err)
	}
	env := policy.Env{}
	if stateDir != "" {
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		if env.Cluster, err = LoadState(ctx, stateDir, builtin.Caches(cfg)); err != nil {
			t.Fatal(err)
		}
	}
	whs, err := builtin.Webhooks(cfg, env)
	if err != nil {
		t.Fatal(err)
	}
	return whs
}

func review1(t *testing.T, whs []*admission.Webhook, manifest string) *Result {
	t.Helper()
	docs, err := Read("-", strings.NewReader(manifest))
	if err != nil || len(docs) != 1 {
		t.Fatalf("Read: %v, %d docs", err, len(docs))
	}
	res, err := Run(context.Background(), whs, docs[0], Options{})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

const jobQueueConfig = `apiVersion: kadmit.io/v1alpha1
kind: Configuration
policies:
  jobQueue: {enabled: true}
`

const plainJob = `apiVersion: batch/v1
kind: Job
metadata: {name: j, namespace: team}
spec:
  suspend: false
  template:
    spec:
      restartPolicy: Never
      containers: [{name: c, image: pause}]
`

const defaultLocalQueue = `apiVersion: kueue.x-k8s.io/v1beta1
kind: LocalQueue
metadata: {name: default, namespace: team}
spec: {clusterQueue: cq}
`

// TestStateLocalQueueDefaulting: Kueue's LocalQueueDefaulting needs to know
// whether namespace team holds a LocalQueue named default. Without --state
// the job is left alone with a warning; with a state holding that
// LocalQueue it gets queue-name default and is suspended.
func TestStateLocalQueueDefaulting(t *testing.T) {
	res := review1(t, stateWebhooks(t, jobQueueConfig, ""), plainJob)
	if !res.Allowed || len(res.Patch) != 0 || len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], "--state") {
		t.Fatalf("without state: %+v", res)
	}
	dir := t.TempDir()
	write(t, dir, "queues.yaml", defaultLocalQueue)
	res = review1(t, stateWebhooks(t, jobQueueConfig, dir), plainJob)
	if !res.Allowed || len(res.Warnings) != 0 || !strings.Contains(string(res.Object), `"kueue.x-k8s.io/queue-name":"default"`) ||
		!strings.Contains(string(res.Object), `"suspend":true`) {
		t.Fatalf("with state: %+v\n%s", res, res.Object)
	}
	// A state without that LocalQueue: decided, no warning, no change.
	empty := t.TempDir()
	write(t, empty, "other.yaml", strings.Replace(defaultLocalQueue, "name: default", "name: other", 1))
	res = review1(t, stateWebhooks(t, jobQueueConfig, empty), plainJob)
	if !res.Allowed || len(res.Patch) != 0 || len(res.Warnings) != 0 {
		t.Fatalf("state without the default queue: %+v", res)
	}
}

// TestStateRequireQueue: kadmit's requireQueue switch denies a job whose
// LocalQueue is not in the state; without state it warns.
func TestStateRequireQueue(t *testing.T) {
	cfg := strings.Replace(jobQueueConfig, "{enabled: true}", "{enabled: true, requireQueue: true}", 1)
	queued := strings.Replace(plainJob, "metadata: {name: j, namespace: team}", "metadata: {name: j, namespace: team, labels: {kueue.x-k8s.io/queue-name: default}}", 1)
	res := review1(t, stateWebhooks(t, cfg, ""), queued)
	if !res.Allowed || len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], "not checked offline") {
		t.Fatalf("without state: %+v", res)
	}
	dir := t.TempDir()
	write(t, dir, "q.yaml", defaultLocalQueue)
	if res = review1(t, stateWebhooks(t, cfg, dir), queued); !res.Allowed || len(res.Warnings) != 0 {
		t.Fatalf("with the LocalQueue: %+v", res)
	}
	if res = review1(t, stateWebhooks(t, cfg, t.TempDir()), queued); res.Allowed || res.Code != 403 ||
		!strings.Contains(res.Message, `queue "default" does not exist in namespace "team"`) {
		t.Fatalf("without the LocalQueue: %+v", res)
	}
}

// TestStateElasticQuota: the elastic-quota pod fit check (quotaAdmission,
// upstream's EnableQuotaAdmission gate) sums the quota's pods; offline it
// cannot, with --state it denies a pod that does not fit.
func TestStateElasticQuota(t *testing.T) {
	cfg := `apiVersion: kadmit.io/v1alpha1
kind: Configuration
policies:
  elasticQuota: {enabled: true, quotaAdmission: true}
`
	pod := `apiVersion: v1
kind: Pod
metadata: {name: new, namespace: team, labels: {quota.scheduling.koordinator.sh/name: team-a}}
spec:
  containers: [{name: c, image: pause, resources: {requests: {cpu: "3"}}}]
`
	dir := t.TempDir()
	write(t, dir, "quota.yaml", `apiVersion: scheduling.sigs.k8s.io/v1alpha1
kind: ElasticQuota
metadata: {name: team-a, namespace: team}
spec:
  min: {cpu: "1"}
  max: {cpu: "4"}
`)
	write(t, dir, "pods/running.yaml", `apiVersion: v1
kind: Pod
metadata: {name: old, namespace: team, labels: {quota.scheduling.koordinator.sh/name: team-a}}
spec:
  containers: [{name: c, image: pause, resources: {requests: {cpu: "2"}}}]
status: {phase: Running}
`)
	if res := review1(t, stateWebhooks(t, cfg, ""), pod); !res.Allowed {
		t.Fatalf("without state: %+v", res)
	}
	if res := review1(t, stateWebhooks(t, cfg, dir), pod); res.Allowed || !strings.Contains(res.Message, "team-a") {
		t.Fatalf("with state: %+v", res)
	}
}

func TestReadStateErrors(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "a.yaml", defaultLocalQueue+"---\n"+strings.Replace(defaultLocalQueue, "name: default", "name: b", 1))
	write(t, dir, "b.yaml", strings.Replace(defaultLocalQueue, "name: default", "name: c", 1))
	if docs, err := readState(dir, 1<<20, 3); err != nil || len(docs) != 3 {
		t.Fatalf("within bounds: %v, %d docs", err, len(docs))
	}
	for _, tc := range []struct {
		name     string
		path     string
		maxBytes int64
		maxObjs  int
		want     string
	}{
		{"stdin", "-", 1 << 20, 10, "not stdin"},
		{"missing", filepath.Join(dir, "nope"), 1 << 20, 10, "no such file"},
		{"too many objects", dir, 1 << 20, 2, filepath.Join(dir, "b.yaml") + " (document 0): cluster state has more than 2 objects"},
		{"too many bytes", dir, 100, 10, filepath.Join(dir, "a.yaml") + ": cluster state is larger than 100 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := readState(tc.path, tc.maxBytes, tc.maxObjs)
			if !errors.Is(err, ErrInput) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrInput containing %q", err, tc.want)
			}
		})
	}
	// A state object that is not a valid pod names its file and document.
	bad := t.TempDir()
	p := write(t, bad, "pods.yaml", "apiVersion: v1\nkind: Namespace\nmetadata: {name: ok}\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: n}\nspec: {containers: 5}\n")
	_, err := LoadState(context.Background(), bad, []clustercache.Read{clustercache.Pods.Whole()})
	if !errors.Is(err, ErrInput) || !errors.Is(err, clustercache.ErrStatic) || !strings.Contains(err.Error(), p+` (document 1): Pod "p"`) {
		t.Fatalf("bad pod: %v", err)
	}
}

// TestReadStateRefusesHugeListEarly: the object bound is enforced while a
// List is decoded, one item at a time: a 40 MB List of 400,000 items under
// a bound of 1,000 is refused having allocated a small fraction of its
// size (decoding it whole first cost about 20 times its size), and so is a
// single YAML document past manifests.MaxYAMLDocumentBytes.
func TestReadStateRefusesHugeListEarly(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "huge.json")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriter(f)
	w.WriteString(`{"apiVersion":"v1","kind":"List","items":[`)
	const items = 400_000
	for i := range items {
		if i > 0 {
			w.WriteByte(',')
		}
		fmt.Fprintf(w, `{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"ns-%07d","labels":{"a":"b"}}}`, i)
	}
	w.WriteString(`]}`)
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	info, _ := os.Stat(p)

	alloc := func(fn func()) uint64 {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		fn()
		runtime.ReadMemStats(&after)
		return after.TotalAlloc - before.TotalAlloc
	}
	var err2 error
	n := alloc(func() { _, err2 = readState(p, clustercache.MaxStaticBytes, 1000) })
	if !errors.Is(err2, ErrInput) || !strings.Contains(err2.Error(), p+" (document 1000): cluster state has more than 1000 objects") {
		t.Fatalf("err = %v", err2)
	}
	if limit := uint64(info.Size() / 10); n > limit {
		t.Fatalf("refusing a %d-byte List of %d items at 1000 allocated %d bytes, want under %d", info.Size(), items, n, limit)
	}
	t.Logf("%d-byte List refused after allocating %d bytes", info.Size(), n)

	// Under the bound, the same List is read whole, item by item.
	docs, err := readState(p, clustercache.MaxStaticBytes, items)
	if err != nil || len(docs) != items || !strings.Contains(string(docs[items-1].Object), "ns-0399999") {
		t.Fatalf("within bounds: %v, %d docs", err, len(docs))
	}

	y := filepath.Join(dir, "huge.yaml")
	var b strings.Builder
	b.WriteString("apiVersion: v1\nkind: List\nitems:\n")
	for i := 0; b.Len() <= manifests.MaxYAMLDocumentBytes+1<<20; i++ {
		fmt.Fprintf(&b, "- {apiVersion: v1, kind: Namespace, metadata: {name: ns-%07d}}\n", i)
	}
	if err := os.WriteFile(y, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	size := b.Len()
	b = strings.Builder{}
	n = alloc(func() { _, err2 = readState(y, clustercache.MaxStaticBytes, clustercache.MaxStaticObjects) })
	if !errors.Is(err2, ErrInput) || !strings.Contains(err2.Error(), y+" (document 0): YAML document larger than") {
		t.Fatalf("YAML err = %v", err2)
	}
	// Reading up to the cap line by line (k8s.io/apimachinery's
	// YAMLReader) allocates about 5 times the cap; converting the document
	// would cost 20 times its size.
	if limit := uint64(6 * manifests.MaxYAMLDocumentBytes); n > limit {
		t.Fatalf("refusing a %d-byte YAML document allocated %d bytes, want under %d", size, n, limit)
	}
	t.Logf("%d-byte YAML document refused after allocating %d bytes", size, n)
}
