package serve

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
	"weak"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/celpolicy"
	"github.com/kadmit/kadmit/internal/served"
)

// labelMAP is a MutatingAdmissionPolicy on pods setting one label.
func labelMAP(name string) string {
	return `apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicy
metadata: {name: ` + name + `}
spec:
  reinvocationPolicy: Never
  matchConstraints:
    resourceRules: [{apiGroups: [""], apiVersions: ["v1"], operations: ["CREATE", "UPDATE"], resources: ["pods"]}]
  mutations:
  - patchType: ApplyConfiguration
    applyConfiguration:
      expression: "Object{metadata: Object.metadata{labels: {'` + name + `': 'x'}}}"
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicyBinding
metadata: {name: ` + name + `}
spec: {policyName: ` + name + `}
`
}

// Issue 20 point 8, "one old engine stays live after a reload": the
// daemon assembled as Run assembles it, then a policies ConfigMap edit
// swapped in through its reloader, leaves nothing holding the start's
// engine, so the garbage collector frees it (its hooks, decoded-object
// caches and compiled programs) within a bounded wait. It was kept by
// three copies of the start's hooks: the daemon's, the server's options
// (also captured by its listeners' refusal callbacks) and the
// registrar's options. The reviews served before the reload, through the
// admission handler as the server runs them (shared decoded objects, a
// run of MAPs), must leave no cache entry, meter or context callback
// holding it either.
func TestReloadReleasesOldEngine(t *testing.T) {
	var mu sync.Mutex
	var engines []weak.Pointer[celpolicy.Engine]
	build := assemble
	assemble = func(src served.Sources) (*served.Policies, error) {
		p, err := build(src)
		if err == nil && p.Engine != nil {
			mu.Lock()
			engines = append(engines, weak.Make(p.Engine))
			mu.Unlock()
		}
		return p, err
	}
	t.Cleanup(func() { assemble = build })

	// The daemon assembled as Run assembles it (validate, loadPolicies,
	// newMetrics, newSource, newRegistrar, newRotator, newServer), with the test
	// reloader's static cluster caches and a fake client for the
	// registrar, which is built but not started.
	r, declared := testReloader(t)
	r.opts.Register, r.opts.TLSMode, r.opts.WebhookURL = true, TLSSelfSigned, "https://127.0.0.1:9443"
	d := &daemon{opts: r.opts, log: r.log, client: fake.NewSimpleClientset(), reloads: r}
	r.policyConfigMap(policyCM(map[string]string{"a.yaml": maxReplicasVAP("a", "5") + "---\n" + maxReplicasVAP("b", "6") + "---\n" + labelMAP("m1") + "---\n" + labelMAP("m2")}))
	if got := declared(); len(got) != 4 {
		t.Fatalf("declared hooks %v", got)
	}
	r.wantDocs, r.haveDocs = r.policyDocs, true
	if err := d.validate(r.ctx); err != nil {
		t.Fatal(err)
	}
	recordServe, recordRegister := r.serve, r.register
	var err error
	if d.hooks, err = r.start(r.ctx, nil); err != nil {
		t.Fatal(err)
	}
	started := d.hooks
	for _, step := range []func(context.Context) error{d.newMetrics, d.newSource, d.newRegistrar, d.newRotator, d.newServer} {
		if err := step(r.ctx); err != nil {
			t.Fatal(err)
		}
	}
	// The reloader now swaps into the server and the registrar; the test
	// keeps the started webhooks to send reviews through, as the server
	// does, until the reload.
	serve, register := d.srv.SetWebhooks, d.registrar.SetHooks
	r.serve = func(whs []*admission.Webhook) { serve(whs); recordServe(whs) }
	r.register = func(hooks []admission.Hook) { register(hooks); recordRegister(hooks) }
	webhooks, err := admission.NewWebhooks(started)
	started = nil
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if len(engines) != 2 {
		t.Fatalf("%d engines built, want 2 (the first ConfigMap's, the start's)", len(engines))
	}
	old := engines[1]
	mu.Unlock()

	// Serve reviews through the old set as the server does: validating
	// (shared decoded objects) and mutating (a run of MAPs, the shared
	// meter), CREATE and UPDATE.
	limits := admission.NewLimits(0, 0)
	for _, wh := range webhooks {
		if wh.Path != celpolicy.ValidatePath && wh.Path != celpolicy.MutatePath {
			continue
		}
		h := admission.NewHandler(wh, admission.HandlerOptions{Limits: limits})
		for _, c := range []struct{ resource, group, kind, op, obj string }{
			{"deployments", "apps", "Deployment", "CREATE", `{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"d","namespace":"default"},"spec":{"replicas":3}}`},
			{"deployments", "apps", "Deployment", "UPDATE", `{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"d","namespace":"default"},"spec":{"replicas":9}}`},
			{"pods", "", "Pod", "CREATE", `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"default"},"spec":{"containers":[{"name":"c","image":"nginx"}]}}`},
			{"pods", "", "Pod", "UPDATE", `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"default"},"spec":{"containers":[{"name":"c","image":"nginx"}]}}`},
		} {
			old := ""
			if c.op == "UPDATE" {
				old = `,"oldObject":` + c.obj
			}
			body := fmt.Sprintf(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u",
"kind":{"group":%[1]q,"version":"v1","kind":%[2]q},"resource":{"group":%[1]q,"version":"v1","resource":%[3]q},
"namespace":"default","name":"x","operation":%[4]q,"userInfo":{"username":"u"},"object":%[5]s%[6]s}}`, c.group, c.kind, c.resource, c.op, c.obj, old)
			req := httptest.NewRequest(http.MethodPost, wh.Path+"?timeout=10s", bytes.NewReader([]byte(body)))
			req.Header.Set("Content-Type", "application/json")
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			if w.Code != 200 {
				t.Fatalf("%s %s %s: %d %s", wh.Path, c.op, c.resource, w.Code, w.Body)
			}
		}
	}
	if limits.BodyBytes() != 0 {
		t.Errorf("body bytes held after the reviews: %d", limits.BodyBytes())
	}

	r.policyConfigMap(policyCM(map[string]string{"a.yaml": maxReplicasVAP("a", "7") + "---\n" + labelMAP("m1")}))
	if got := r.policyDocs; len(got) != 1 || !strings.Contains(got[0].Data, "<= 7") {
		t.Fatalf("running documents after the reload %v", got)
	}
	if got := declared(); strings.Join(got, ",") != "map-m1,vap-a" {
		t.Fatalf("declared hooks after the reload %v", got)
	}
	webhooks = nil
	deadline := time.Now().Add(10 * time.Second)
	for old.Value() != nil {
		if time.Now().After(deadline) {
			t.Fatal("the engine of the policies before the reload is still reachable 10 s after it")
		}
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	live := engines[len(engines)-1]
	mu.Unlock()
	if live.Value() == nil {
		t.Fatal("the running engine was collected")
	}
	runtime.KeepAlive(d)
}
