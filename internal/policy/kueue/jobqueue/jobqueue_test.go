package jobqueue

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/policy/policytest"
	"github.com/kadmit/kadmit/internal/quantity"
	"github.com/kadmit/kadmit/internal/testkit"
)

type fakeLQ map[string]bool

func (f fakeLQ) HasLocalQueue(ns, name string) bool { return f[ns+"/"+name] }

func req(op admissionv1.Operation, ns, obj, old string) *admission.Request {
	return testkit.Request(op, metav1.GroupVersionResource{Group: "batch", Version: "v1", Resource: "jobs"}, obj, old,
		testkit.Namespace(ns), testkit.Kind(metav1.GroupVersionKind{Group: "batch", Version: "v1", Kind: "Job"}))
}

func job(labels string, spec string) string {
	if spec == "" {
		spec = `"template":{"spec":{"containers":[{"name":"c","image":"x","resources":{"requests":{"cpu":"1","memory":"1Gi"}}}],"restartPolicy":"Never"}}`
	}
	return `{"apiVersion":"batch/v1","kind":"Job","metadata":{"name":"j","labels":{` + labels + `}},"spec":{` + spec + `}}`
}

func must(t *testing.T, cfg Config, opts Options) *Policy {
	t.Helper()
	p, err := New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"default", DefaultConfig(), ""},
		{"good", Config{DefaultQueues: map[string]string{"team-a": "main"}, Queues: []Queue{{Name: "main", Quota: quantity.List{"cpu": resource.MustParse("4")}}}}, ""},
		{"bad namespace", Config{DefaultQueues: map[string]string{"Team": "main"}}, "defaultQueues[Team]: namespace:"},
		{"empty default", Config{DefaultQueues: map[string]string{"a": ""}}, "defaultQueues[a]: queue name must not be empty"},
		{"bad queue name", Config{Queues: []Queue{{Name: "bad name"}}}, `queues[0].name: queue name "bad name": a lowercase RFC 1123 subdomain`},
		{"bad framework", Config{Frameworks: []string{"batch/job", "kubeflow.org/nope"}}, `frameworks[1]: unknown Kueue integration "kubeflow.org/nope"`},
		{"bad selector", Config{ManagedJobsNamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "k", Operator: "Bogus"}}}}, "managedJobsNamespaceSelector: "},
		{"duplicate", Config{Queues: []Queue{{Name: "q"}, {Name: "q"}}}, `queues[1]: duplicate queue "q"`},
		{"negative quota", Config{Queues: []Queue{{Name: "q", Quota: quantity.List{"cpu": resource.MustParse("-1")}}}}, "queues[0].quota.cpu: must be >= 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.want)) {
				t.Fatalf("Validate() = %v, want prefix %q", err, tc.want)
			}
		})
	}
}

func TestHooks(t *testing.T) {
	hs := must(t, DefaultConfig(), Options{}).Hooks()
	if len(hs) != 2 || hs[0].Path != MutatePath || hs[0].Type != admission.Mutating || hs[1].Path != ValidatePath ||
		hs[1].Type != admission.Validating || hs[0].FailurePolicy != "Fail" || len(hs[1].Rules[0].Operations) != 2 {
		t.Fatalf("hooks = %+v", hs)
	}
	if hs[0].Rules[0].APIGroups[0] != "batch" || hs[0].Rules[0].Resources[0] != "jobs" {
		t.Fatalf("rules = %+v", hs[0].Rules)
	}
}

func decode(t *testing.T, raw []byte) (labels map[string]string, suspend *bool) {
	t.Helper()
	var j struct {
		Metadata struct{ Labels map[string]string } `json:"metadata"`
		Spec     struct{ Suspend *bool }            `json:"spec"`
	}
	if err := json.Unmarshal(raw, &j); err != nil {
		t.Fatal(err)
	}
	return j.Metadata.Labels, j.Spec.Suspend
}

// mutate runs p.Mutate and returns the patched job, nil when unchanged.
func mutate(t *testing.T, p *Policy, r *admission.Request) ([]byte, admission.Verdict) {
	t.Helper()
	return policytest.Mutate(t, p, r)
}

func TestMutate(t *testing.T) {
	p := must(t, Config{DefaultQueues: map[string]string{"team-a": "main"}, ManagedLabel: true}, Options{})

	out, v := mutate(t, p, req(admissionv1.Create, "team-a", job(``, ""), ""))
	if !v.Allowed || out == nil {
		t.Fatalf("verdict %+v, out %s", v, out)
	}
	labels, suspend := decode(t, out)
	if labels[QueueLabel] != "main" || labels[ManagedLabel] != "true" || suspend == nil || !*suspend {
		t.Fatalf("labels %v suspend %v", labels, suspend)
	}
	// Idempotent: the API server may call again on the output.
	if again, v := mutate(t, p, req(admissionv1.Create, "team-a", string(out), "")); again != nil || !v.Allowed {
		t.Fatalf("second mutation changed %s", again)
	}
	// An explicit queue is kept.
	out, _ = mutate(t, p, req(admissionv1.Create, "team-a", job(`"`+QueueLabel+`":"other"`, ""), ""))
	if labels, _ := decode(t, out); labels[QueueLabel] != "other" {
		t.Fatalf("queue overwritten: %v", labels)
	}
	// No default in this namespace and no queue: untouched.
	if out, v := mutate(t, p, req(admissionv1.Create, "team-b", job(``, ""), "")); out != nil || !v.Allowed {
		t.Fatalf("job in team-b mutated: %s", out)
	}
	// A queue named anywhere makes the job managed and suspended.
	out, _ = mutate(t, p, req(admissionv1.Create, "team-b", job(`"`+QueueLabel+`":"q"`, ""), ""))
	if labels, s := decode(t, out); labels[ManagedLabel] != "true" || s == nil || !*s {
		t.Fatalf("labels %v suspend %v", labels, s)
	}
	// UPDATE is never mutated.
	if out, _ := mutate(t, p, req(admissionv1.Update, "team-a", job(``, ""), job(``, ""))); out != nil {
		t.Fatal("UPDATE mutated")
	}
	// suspend: false leaves spec.suspend alone.
	no := false
	p2 := must(t, Config{DefaultQueues: map[string]string{"team-a": "main"}, ManagedLabel: true, Suspend: &no}, Options{})
	out, _ = mutate(t, p2, req(admissionv1.Create, "team-a", job(``, ""), ""))
	if _, s := decode(t, out); s != nil {
		t.Fatalf("suspend set to %v", *s)
	}
	// Unknown fields survive.
	out, _ = mutate(t, p, req(admissionv1.Create, "team-a", `{"metadata":{"name":"j"},"spec":{"futureField":{"a":1}}}`, ""))
	if !strings.Contains(string(out), `"futureField":{"a":1}`) {
		t.Fatalf("unknown field lost: %s", out)
	}
	if _, v := mutate(t, p, req(admissionv1.Create, "team-a", `{`, "")); v.Allowed || v.Code != 400 {
		t.Fatalf("bad JSON: %+v", v)
	}
}

func TestValidate(t *testing.T) {
	cfg := Config{Queues: []Queue{
		{Name: "small", Quota: quantity.List{"cpu": resource.MustParse("4"), "memory": resource.MustParse("8Gi")}},
		{Name: "ns-only", Namespace: "team-a"},
	}}
	cfg.RequireQueue = true
	p := must(t, cfg, Options{LocalQueues: fakeLQ{"team-a/lq": true}})
	ctx := context.Background()
	q := func(name string) string { return `"` + QueueLabel + `":"` + name + `"` }
	tmpl := func(cpu string) string {
		return `"template":{"spec":{"initContainers":[{"name":"i","image":"x","resources":{"requests":{"cpu":"` + cpu + `"}}}],"containers":[{"name":"c","image":"x","resources":{"requests":{"cpu":"1"}}}]}}`
	}
	for _, tc := range []struct {
		name, ns, obj, old string
		op                 admissionv1.Operation
		code               int32 // 0: allowed
		msg                string
	}{
		{"no queue", "team-a", job(``, ""), "", admissionv1.Create, 0, ""},
		{"configured queue fits", "team-a", job(q("small"), `"parallelism":4,`+tmpl("500m")), "", admissionv1.Create, 0, ""},
		{"parallelism over quota", "team-a", job(q("small"), `"parallelism":5,`+tmpl("500m")), "", admissionv1.Create, 403,
			`job requests cpu 5 (5 pods × 1), more than queue "small" quota of 4`},
		// The init container (3) dominates the container (1): 2 × 3 = 6 > 4.
		{"init container effective request", "team-a", job(q("small"), `"parallelism":2,`+tmpl("3")), "", admissionv1.Create, 403,
			`job requests cpu 6 (2 pods × 3), more than queue "small" quota of 4`},
		{"completions cap parallelism", "team-a", job(q("small"), `"parallelism":10,"completions":4,`+tmpl("1")), "", admissionv1.Create, 0, ""},
		{"resource not in quota", "team-a", job(q("small"), `"template":{"spec":{"containers":[{"name":"c","image":"x","resources":{"requests":{"nvidia.com/gpu":"1"}}}]}}`), "", admissionv1.Create, 403,
			`queue "small" has no quota for nvidia.com/gpu`},
		{"local queue exists", "team-a", job(q("lq"), ""), "", admissionv1.Create, 0, ""},
		{"local queue other namespace", "team-b", job(q("lq"), ""), "", admissionv1.Create, 403, `queue "lq" does not exist in namespace "team-b"`},
		{"namespaced configured queue", "team-b", job(q("ns-only"), ""), "", admissionv1.Create, 403, `queue "ns-only" does not exist`},
		// Kueue's rules come first: a malformed name is refused before
		// kadmit looks the queue up.
		{"bad label value", "team-a", job(q("-bad-"), ""), "", admissionv1.Create, 403, `metadata.labels[kueue.x-k8s.io/queue-name]: Invalid value: "-bad-": a lowercase RFC 1123 subdomain`},
		{"queue change while suspended", "team-a", job(q("lq"), `"suspend":true,`+tmpl("1")), job(q("small"), `"suspend":true,`+tmpl("1")), admissionv1.Update, 0, ""},
		{"moved to a queue that does not exist", "team-a", job(q("nope"), `"suspend":true,`+tmpl("1")), job(q("small"), `"suspend":true,`+tmpl("1")), admissionv1.Update, 403, `queue "nope" does not exist in namespace "team-a"`},
		{"moved to a queue it does not fit", "team-a", job(q("small"), `"suspend":true,"parallelism":5,`+tmpl("1")), job(q("lq"), `"suspend":true,"parallelism":5,`+tmpl("1")), admissionv1.Update, 403, `more than queue "small" quota of 4`},
		// Same queue, same template: the queue is not looked up again.
		{"unchanged update of vanished queue", "team-a", job(q("gone")+`,"x":"y"`, ""), job(q("gone"), ""), admissionv1.Update, 0, ""},
		{"bad json", "team-a", `{`, "", admissionv1.Create, 400, "cannot parse the job"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := p.Validate(ctx, req(tc.op, tc.ns, tc.obj, tc.old))
			if tc.code == 0 {
				if !v.Allowed {
					t.Fatalf("denied: %+v", v)
				}
				return
			}
			if v.Allowed || v.Code != tc.code || !strings.Contains(v.Message, tc.msg) {
				t.Fatalf("verdict %+v, want %d %q", v, tc.code, tc.msg)
			}
		})
	}
}

func TestValidateWithoutLocalQueues(t *testing.T) {
	ctx := context.Background()
	obj := job(`"`+QueueLabel+`":"lq"`, "")
	// Kueue's default: no queue is looked up at admission.
	if v := must(t, DefaultConfig(), Options{LocalQueues: fakeLQ{}}).Validate(ctx, req(admissionv1.Create, "a", obj, "")); !v.Allowed {
		t.Fatalf("unknown queue denied by default: %+v", v)
	}
	req := Config{RequireQueue: true}
	// Online without the CRD: only configured queues exist.
	if v := must(t, req, Options{}).Validate(ctx, req2(admissionv1.Create, "a", obj)); v.Allowed {
		t.Fatal("unknown queue admitted online")
	}
	// Offline: admitted with a warning.
	v := must(t, req, Options{Offline: true}).Validate(ctx, req2(admissionv1.Create, "a", obj))
	if !v.Allowed || len(v.Warnings) != 1 || !strings.Contains(v.Warnings[0], "not checked offline") {
		t.Fatalf("offline verdict %+v", v)
	}
}

func req2(op admissionv1.Operation, ns, obj string) *admission.Request { return req(op, ns, obj, "") }
