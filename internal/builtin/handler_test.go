package builtin

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/policy"
)

// handlers are the production handlers, one per path, over the webhooks
// builtin.Webhooks builds with every built-in policy enabled (offline: no
// cluster caches), exactly what `kadmit serve` routes requests to.
func handlers(t testing.TB) map[string]http.Handler {
	t.Helper()
	cfg, err := Config.Parse([]byte(schedulingConfig))
	if err != nil {
		t.Fatal(err)
	}
	whs, err := Webhooks(cfg, policy.Env{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]http.Handler{}
	for _, wh := range whs {
		out[wh.Path] = admission.NewHandler(wh, admission.HandlerOptions{})
	}
	return out
}

// reviewBody is an AdmissionReview v1 request for object (raw JSON).
func reviewBody(uid, group, version, resource, subresource, kind, op, namespace, object, oldObject string) []byte {
	req := map[string]any{
		"uid":       uid,
		"kind":      map[string]string{"group": group, "version": version, "kind": kind},
		"resource":  map[string]string{"group": group, "version": version, "resource": resource},
		"operation": op,
		"namespace": namespace,
		"userInfo":  map[string]any{"username": "fuzz"},
		"object":    json.RawMessage(object),
	}
	if subresource != "" {
		req["subResource"] = subresource
	}
	if oldObject != "" {
		req["oldObject"] = json.RawMessage(oldObject)
	}
	b, err := json.Marshal(map[string]any{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req})
	if err != nil {
		panic(err)
	}
	return b
}

// target is one production path with the request shape its rules match.
type target struct {
	path, group, version, resource, subresource, kind, op, namespace string
	mutating                                                         bool
}

var (
	podCreate     = target{"/mutate-pod", "", "v1", "pods", "", "Pod", "CREATE", "team-a", true}
	podValidate   = target{"/validate-pod", "", "v1", "pods", "", "Pod", "CREATE", "team-a", false}
	nodeStatus    = target{"/mutate-node-status", "", "v1", "nodes", "status", "Node", "UPDATE", "", true}
	nodeValidate  = target{"/validate-node", "", "v1", "nodes", "", "Node", "CREATE", "", false}
	jobMutate     = target{"/mutate-batch-v1-job", "batch", "v1", "jobs", "", "Job", "CREATE", "team-a", true}
	jobValidate   = target{"/validate-batch-v1-job", "batch", "v1", "jobs", "", "Job", "CREATE", "team-a", false}
	quotaMutate   = target{"/mutate-scheduling-sigs-k8s-io-v1alpha1-elasticquota", "scheduling.sigs.k8s.io", "v1alpha1", "elasticquotas", "", "ElasticQuota", "CREATE", "team-a", true}
	quotaValidate = target{"/validate-scheduling-sigs-k8s-io-v1alpha1-elasticquota", "scheduling.sigs.k8s.io", "v1alpha1", "elasticquotas", "", "ElasticQuota", "CREATE", "team-a", false}
	flavorMutate  = target{"/mutate-kueue-x-k8s-io-v1beta1-resourceflavor", "kueue.x-k8s.io", "v1beta1", "resourceflavors", "", "ResourceFlavor", "CREATE", "", true}
	flavorValid   = target{"/validate-kueue-x-k8s-io-v1beta1-resourceflavor", "kueue.x-k8s.io", "v1beta1", "resourceflavors", "", "ResourceFlavor", "CREATE", "", false}
	configMapVal  = target{"/validate-configmap", "", "v1", "configmaps", "", "ConfigMap", "CREATE", "kadmit-config", false}
)

// answer is what one review returned, checked for the handler's contract.
type answer struct {
	code    int
	body    string
	resp    *admissionv1.AdmissionResponse
	patched []byte // the object with the response's JSONPatch applied
}

// call sends object to tg's production handler and checks the contract every
// answer must keep: HTTP 200 (a 500 from a recovered panic or a missed
// deadline fails), response.uid equal to the request's, and on mutating paths
// a JSONPatch that applies to the object sent and yields valid JSON. Failures
// are reported with t.Errorf and a nil answer.
func call(t testing.TB, hs map[string]http.Handler, tg target, uid, object, oldObject string) *answer {
	t.Helper()
	h := hs[tg.path]
	if h == nil {
		t.Fatalf("no handler for %s", tg.path)
	}
	body := reviewBody(uid, tg.group, tg.version, tg.resource, tg.subresource, tg.kind, tg.op, tg.namespace, object, oldObject)
	r := httptest.NewRequest(http.MethodPost, tg.path+"?timeout=10s", bytes.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	a := &answer{code: w.Code, body: w.Body.String()}
	if w.Code != http.StatusOK {
		// A 400 for a body the codec refuses is a fine answer; anything
		// else (500: panic, deadline) is not.
		if w.Code == http.StatusBadRequest && !json.Valid([]byte(object)) {
			return a
		}
		t.Errorf("%s: HTTP %d: %s", tg.path, w.Code, w.Body.String())
		return nil
	}
	var rev struct {
		Response *admissionv1.AdmissionResponse `json:"response"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &rev); err != nil || rev.Response == nil {
		t.Errorf("%s: 200 without a review response (%v): %s", tg.path, err, w.Body.String())
		return nil
	}
	a.resp = rev.Response
	if string(a.resp.UID) != uid {
		t.Errorf("%s: response.uid = %q, want the request's %q", tg.path, a.resp.UID, uid)
		return nil
	}
	if len(a.resp.Patch) > 0 {
		if !tg.mutating {
			t.Errorf("%s: a validating path returned a patch %s", tg.path, a.resp.Patch)
			return nil
		}
		if !a.resp.Allowed {
			t.Errorf("%s: a denial carries a patch %s", tg.path, a.resp.Patch)
			return nil
		}
		p, err := jsonpatch.DecodePatch(a.resp.Patch)
		if err != nil {
			t.Errorf("%s: patch %s does not decode: %v", tg.path, a.resp.Patch, err)
			return nil
		}
		out, err := p.Apply([]byte(object))
		if err != nil || !json.Valid(out) {
			t.Errorf("%s: patch %s does not apply to %s: %v", tg.path, a.resp.Patch, object, err)
			return nil
		}
		a.patched = out
	}
	return a
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// TestHandlerPathsWithRealPolicies drives the production handlers with the
// built-in policies: every answer echoes the request's uid, patches apply to
// the object sent and do what the policy says, and denials (including a
// mutator's) reach the response. A constant uid, a dropped patch or an
// ignored denial on /mutate-pod or /mutate-node-status fails here.
func TestHandlerPathsWithRealPolicies(t *testing.T) {
	hs := handlers(t)

	// /mutate-pod: lifespan adds tolerations, colocation its profile's
	// changes; a bad lifespan label is a mutator's 400 denial.
	pod := `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"team-a","labels":{"acme.com/lifespan-requested":"3","qos":"be"}},"spec":{"containers":[{"name":"c","image":"i"}]}}`
	a := call(t, hs, podCreate, "uid-pod-1", pod, "")
	if a != nil {
		if !a.resp.Allowed || a.patched == nil || !strings.Contains(string(a.patched), `"tolerations"`) {
			t.Errorf("/mutate-pod: allowed=%v patched=%s", a.resp.Allowed, a.patched)
		}
	}
	bad := strings.Replace(pod, `"acme.com/lifespan-requested":"3"`, `"acme.com/lifespan-requested":"15"`, 1)
	if a := call(t, hs, podCreate, "uid-pod-2", bad, ""); a != nil {
		if a.resp.Allowed || a.resp.Result == nil || a.resp.Result.Code != 400 || !strings.Contains(a.resp.Result.Message, "lifespan-requested") {
			t.Errorf("/mutate-pod: a bad lifespan label must be denied with 400, got %s", a.body)
		}
	}
	// /validate-pod: pod-name denies its words.
	if a := call(t, hs, podValidate, "uid-pod-3", strings.Replace(pod, `"name":"p"`, `"name":"offensive-p"`, 1), ""); a != nil && a.resp.Allowed {
		t.Errorf("/validate-pod: offensive name allowed: %s", a.body)
	}

	// /mutate-node-status: cpu 3500m/4 with ratio 2 becomes 7/7.5.
	node := `{"apiVersion":"v1","kind":"Node","metadata":{"name":"n"},"status":{"capacity":{"cpu":"4","memory":"8Gi"},"allocatable":{"cpu":"3500m","memory":"7Gi"}}}`
	if a := call(t, hs, nodeStatus, "uid-node-1", node, node); a != nil {
		var got struct {
			Status struct{ Capacity, Allocatable map[string]string }
		}
		if a.patched == nil || json.Unmarshal(a.patched, &got) != nil || got.Status.Allocatable["cpu"] != "7" || got.Status.Capacity["cpu"] != "7500m" {
			t.Errorf("/mutate-node-status: allowed=%v patched=%s", a.resp.Allowed, a.patched)
		}
	}
	hostile := strings.Replace(node, `"allocatable":{"cpu":"3500m"`, `"allocatable":{"cpu":"1e9999999"`, 1)
	for _, tg := range []target{nodeStatus, nodeValidate} {
		if a := call(t, hs, tg, "uid-node-2", hostile, ""); a != nil {
			if a.resp.Allowed || a.resp.Result == nil || a.resp.Result.Code != 400 || !strings.Contains(a.resp.Result.Message, "status.allocatable.cpu: quantity 1e9999999 is out of range") {
				t.Errorf("%s: an out-of-range quantity must be a 400 naming the field, got %s", tg.path, a.body)
			}
		}
	}
}

// processCPU is this process's user+system CPU time.
func processCPU(t testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestHugeQuantitiesAnsweredAtOnce is issue 11's huge-exponent attack through
// the production handlers: before internal/quantity, a node with
// allocatable cpu 1e9999999 was answered with HTTP 500 after 9 s and the
// abandoned review kept burning CPU for minutes. Each hostile spelling must
// now be a denial naming the field, every quantity refused from the string
// alone (internal/quantity's tests prove no arithmetic runs); the bounds here
// are coarse sanity checks, two orders of magnitude above the expected cost.
func TestHugeQuantitiesAnsweredAtOnce(t *testing.T) {
	hs := handlers(t)
	huge := []string{"1e9999999", "-1e9999999", "1E-9999999", "1" + strings.Repeat("0", 10000)}
	type place struct {
		tg    target
		field string
		obj   func(q string) string
	}
	nodeWith := func(where string) func(string) string {
		return func(q string) string {
			qs := mustJSON(q)
			switch where {
			case "allocatable":
				return `{"metadata":{"name":"n"},"status":{"capacity":{"cpu":"4"},"allocatable":{"cpu":` + qs + `}}}`
			case "capacity":
				return `{"metadata":{"name":"n"},"status":{"capacity":{"cpu":` + qs + `},"allocatable":{"cpu":"4"}}}`
			default:
				raw := mustJSON(`{"allocatable":{"cpu":` + qs + `},"capacity":{"cpu":"4"}}`)
				return `{"metadata":{"name":"n","annotations":{"kadmit.io/raw-allocatable":` + raw + `}},"status":{"capacity":{"cpu":"8"},"allocatable":{"cpu":"8"}}}`
			}
		}
	}
	places := []place{
		{nodeStatus, "status.allocatable.cpu", nodeWith("allocatable")},
		{nodeValidate, "status.allocatable.cpu", nodeWith("allocatable")},
		{nodeValidate, "status.capacity.cpu", nodeWith("capacity")},
		{nodeStatus, "raw-allocatable", nodeWith("annotation")},
		{nodeValidate, "kadmit.io/raw-allocatable: allocatable.cpu", nodeWith("annotation")},
	}
	podWith := func(q string) string {
		return `{"metadata":{"name":"p","namespace":"team-a"},"spec":{"containers":[{"name":"c","image":"i","resources":{"requests":{"cpu":` + mustJSON(q) + `}}}]}}`
	}
	places = append(places,
		place{podValidate, "spec.containers[0].resources.requests.cpu", podWith},
		place{jobValidate, "spec.template.spec.containers[0].resources.requests.cpu", func(q string) string {
			return `{"metadata":{"name":"j","namespace":"team-a","labels":{"kueue.x-k8s.io/queue-name":"main"}},"spec":{"template":` + podWith(q) + `}}`
		}},
		place{quotaValidate, "spec.max.cpu", func(q string) string {
			return `{"metadata":{"name":"q","namespace":"team-a"},"spec":{"max":{"cpu":` + mustJSON(q) + `}}}`
		}},
		place{quotaMutate, "spec.max.cpu", func(q string) string {
			return `{"metadata":{"name":"q","namespace":"team-a"},"spec":{"max":{"cpu":` + mustJSON(q) + `}}}`
		}},
	)
	goroutines := runtime.NumGoroutine()
	for _, pl := range places {
		for _, q := range huge {
			start := time.Now()
			a := call(t, hs, pl.tg, "uid-huge", pl.obj(q), "")
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("%s %s=%.20s: answered after %v", pl.tg.path, pl.field, q, d)
			}
			if a == nil {
				continue
			}
			msg := ""
			if a.resp.Result != nil {
				msg = a.resp.Result.Message
			}
			text := msg + strings.Join(a.resp.Warnings, "; ")
			if !strings.Contains(text, pl.field) || !strings.Contains(text, "out of range") {
				t.Errorf("%s %s=%.20s: answer does not name the field and the bound: %s", pl.tg.path, pl.field, q, a.body)
			}
			if a.resp.Allowed && len(a.resp.Patch) > 0 && strings.Contains(string(a.patched), "e9999999") && pl.field != "raw-allocatable" {
				t.Errorf("%s: amplified an out-of-range value: %s", pl.tg.path, a.patched)
			}
		}
	}
	// Nothing keeps working once the answers are in: the goroutine count is
	// back and the process is idle.
	before := processCPU(t)
	time.Sleep(500 * time.Millisecond)
	if used := processCPU(t) - before; used > 200*time.Millisecond {
		t.Errorf("%v of CPU in the 500 ms after the answers", used)
	}
	if n := runtime.NumGoroutine(); n > goroutines+2 {
		t.Errorf("%d goroutines after the answers, %d before", n, goroutines)
	}
}
