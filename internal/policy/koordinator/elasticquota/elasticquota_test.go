package elasticquota

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kadmit/kadmit/internal/policy/policytest"
)

// orgTree: root <- org (parent, tree t1, min cpu 10) <- team-a, team-b.
func orgTree() []*qb {
	return []*qb{
		mq("org").Parent(root).Tree("t1").IsParent(true).Min("cpu=10,memory=20Gi").Max("cpu=20,memory=40Gi"),
		mq("team-a").Parent("org").Tree("t1").IsParent(false).Min("cpu=4").Max("cpu=8,memory=16Gi").Namespaces("a1", "a2"),
		mq("team-b").Parent("org").Tree("t1").IsParent(false).Min("cpu=4").Max("cpu=8,memory=16Gi"),
	}
}

// TestBuiltinQuotas: koord-scheduler's annotation and status writes to the
// root and system quotas pass; a change of their tree fields does not
// (quota_topology.go:108-116).
func TestBuiltinQuotas(t *testing.T) {
	for _, name := range []string{DefaultRootQuota, DefaultSystemQuota} {
		old := mq(name).Max("cpu=1000")
		p, _ := world(t, DefaultConfig(), []*qb{old})
		annotated := old.copy().Ann(Prefix+"runtime", `{"cpu":"3"}`).Ann(AnnotationSharedWeight, `{"cpu":"1"}`).Label("team", "x")
		annotated.hasUsed, annotated.used = true, "cpu=5"
		verdict(t, update(t, p, nil, old.JSON(), annotated.JSON()), "")
		verdict(t, update(t, p, nil, old.JSON(), old.copy().Max("cpu=999").JSON()), "invalid quota "+name)
		verdict(t, update(t, p, nil, old.JSON(), old.copy().IsParent(true).JSON()), "invalid quota "+name)
		verdict(t, update(t, p, nil, old.JSON(), old.copy().Namespaces("x").JSON()), "invalid quota "+name)
	}
	// The system quota is defaulted like any other; the root is not.
	p, fc := world(t, DefaultConfig(), nil)
	sys, v := create(t, p, fc, mq(DefaultSystemQuota).Max("cpu=1"))
	verdict(t, v, "")
	if q, _ := Parse([]byte(sys)); q.Parent != root || q.annotations[AnnotationSharedWeight] != `{"cpu":"1"}` {
		t.Fatalf("system quota not defaulted: %s", sys)
	}
	_, v = create(t, p, fc, mq(root).Max("cpu=1"))
	verdict(t, v, "")
}

// TestInconsistentTreeAdmitsAnnotationUpdates: a tree whose sums no longer
// hold (written while no webhook looked) still takes annotation-only
// updates, and a real change is checked.
func TestInconsistentTreeAdmitsAnnotationUpdates(t *testing.T) {
	tree := orgTree()
	tree[1].Min("cpu=9") // 9 + 4 > org's 10
	p, _ := world(t, DefaultConfig(), tree)
	a := tree[1]
	verdict(t, update(t, p, nil, a.JSON(), a.copy().Ann(Prefix+"runtime", `{"cpu":"1"}`).Label("x", "y").JSON()), "")
	verdict(t, update(t, p, nil, a.JSON(), a.copy().Max("cpu=9,memory=16Gi").JSON()),
		"checkMinQuotaSum all brothers' MinQuota > parent MinQuota, parent: org")
}

// TestSameNameOtherNamespace: quotas are one tree keyed by name; a second
// quota of an existing name is denied wherever it lives
// (quota_topology.go:70-72).
func TestSameNameOtherNamespace(t *testing.T) {
	p, fc := world(t, DefaultConfig(), orgTree())
	_, v := create(t, p, fc, mq("team-a").NS("elsewhere").Parent("org").Tree("t1").Max("cpu=1,memory=1"))
	verdict(t, v, "AddQuota quota already exist:team-a")
	if fc.snap.Get("team-a").Namespace != "quotas" {
		t.Fatal("the tree changed")
	}
}

// TestIsParentParsing: only "true" makes a parent
// (apis/extension/elastic_quota.go:69-71); "yes" is a leaf, and a quota
// under it is denied.
func TestIsParentParsing(t *testing.T) {
	for v, parent := range map[string]bool{"true": true, "yes": false, "True": false, "1": false, "": false} {
		q, err := Parse([]byte(mq("x").Label(LabelIsParent, v).JSON()))
		if err != nil || q.IsParent != parent {
			t.Fatalf("is-parent %q: %v %v", v, q.IsParent, err)
		}
	}
	p, fc := world(t, DefaultConfig(), []*qb{mq("y").Label(LabelIsParent, "yes").Max("cpu=1").Min("cpu=1")})
	_, v := create(t, p, fc, mq("c").Parent("y").Max("cpu=1"))
	verdict(t, v, "c has parentName y but the parentQuotaInfo's IsParent is false")
}

// TestMutateParentMissing: defaulting needs the parent's tree id, so a
// missing parent is refused by the mutating hook (quota_topology.go:236-240).
func TestMutateParentMissing(t *testing.T) {
	p, _ := world(t, DefaultConfig(), orgTree())
	_, v := p.Mutate(context.Background(), qreq(admissionv1.Create, mq("x").Parent("missing").Max("cpu=1").JSON(), ""))
	verdict(t, v, "fill quota x failed, parent not exist")
	_, v = p.Mutate(context.Background(), qreq(admissionv1.Create, mq("x").Ann(AnnotationSharedWeight, "cpu").Max("cpu=1").JSON(), ""))
	if v.Allowed || v.Code != 400 || !strings.HasPrefix(v.Message, "fillDefaultQuotaInfo unmarshal sharedWeight failed:") {
		t.Fatalf("bad shared-weight: %+v", v)
	}
	// Validation refuses the same (quota_topology_check.go:51-54).
	v = p.Validate(context.Background(), qreq(admissionv1.Create, mq("x").Ann(AnnotationSharedWeight, "cpu").Max("cpu=1").JSON(), ""))
	if v.Allowed || v.Code != 400 {
		t.Fatalf("bad shared-weight validated: %+v", v)
	}
}

// TestParentCycles: upstream admits a quota that becomes its own ancestor;
// denyParentCycles refuses it.
func TestParentCycles(t *testing.T) {
	tree := orgTree()
	tree[2].IsParent(true).Min("cpu=4,memory=1Gi")
	self := tree[2].copy().Parent("team-b")
	// allow-force-update skips the min sums: the cycle is the only fault.
	loop := tree[0].copy().Parent("team-b").Label(LabelAllowForceUpdate, "true")
	p, _ := world(t, DefaultConfig(), tree)
	verdict(t, update(t, p, nil, tree[2].JSON(), self.JSON()), "")
	verdict(t, update(t, p, nil, tree[0].JSON(), loop.JSON()), "")
	cfg := DefaultConfig()
	cfg.DenyParentCycles = true
	pc, _ := world(t, cfg, tree)
	verdict(t, update(t, pc, nil, tree[2].JSON(), self.JSON()), "ElasticQuota team-b: cannot be its own parent")
	verdict(t, update(t, pc, nil, tree[0].JSON(), loop.JSON()), "ElasticQuota org: parent team-b is its own descendant")
}

// typedQuota is an ElasticQuota as its Go type would decode it, for the
// differential test's typed round trip.
type typedQuota struct {
	APIVersion        string `json:"apiVersion,omitempty"`
	Kind              string `json:"kind,omitempty"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              struct {
		Min corev1.ResourceList `json:"min,omitempty"`
		Max corev1.ResourceList `json:"max,omitempty"`
	} `json:"spec"`
}

// TestMutateDifferential: the patch applied by the API server's library
// gives what defaulting the typed quota gives, and changes nothing else.
func TestMutateDifferential(t *testing.T) {
	p, _ := world(t, DefaultConfig(), orgTree())
	corpus := map[string]string{
		"child of org": mq("new").Parent("org").Max("cpu=3").JSON(),
		"top level":    mq("top").Max("cpu=3,memory=9007199254740993").JSON(),
		"no metadata labels": `{"apiVersion":"scheduling.sigs.k8s.io/v1alpha1","kind":"ElasticQuota","metadata":{"name":"n","annotations":{"h":"<&>"}},` +
			`"spec":{"max":{"cpu":"2"}},"status":{"n":12345678901234567890}}`,
		"labels null":   `{"metadata":{"name":"n","labels":null,"annotations":null,"generation":9007199254740993},"spec":null}`,
		"weight given":  `{"metadata":{"name":"n","labels":{"` + LabelParent + `":"org","a/b~c":"ü"},"annotations":{"` + AnnotationSharedWeight + `":"{}"}},"spec":{}}`,
		"weight to fix": `{"metadata":{"name":"n","annotations":{"` + AnnotationSharedWeight + `":"{\"gpu\":\"1\",\"cpu\":\"1000m\"}"}},"spec":{"max":{"cpu":"4","memory":"1Gi"}}}`,
	}
	for name, in := range corpus {
		t.Run(name, func(t *testing.T) {
			ops, v := p.Mutate(context.Background(), qreq(admissionv1.Create, in, ""))
			if !v.Allowed {
				t.Fatalf("denied: %+v", v)
			}
			policytest.Check(t, []byte(in), ops, func(q *typedQuota) {
				if q.Labels == nil {
					q.Labels = map[string]string{}
				}
				if q.Labels[LabelParent] == "" {
					q.Labels[LabelParent] = DefaultRootQuota
				}
				if q.Labels[LabelParent] == "org" && q.Labels[LabelTreeID] == "" {
					q.Labels[LabelTreeID] = "t1"
				}
				if q.Annotations == nil {
					q.Annotations = map[string]string{}
				}
				switch sw := q.Annotations[AnnotationSharedWeight]; sw {
				case "":
					q.Annotations[AnnotationSharedWeight] = string(policytest.Marshal(t, q.Spec.Max))
				case "{}":
				default:
					// weight to fix: max's keys, the given cpu, max's memory.
					q.Annotations[AnnotationSharedWeight] = `{"cpu":"1","memory":"1Gi"}`
				}
			})
		})
	}
}

func TestHooksAndConfig(t *testing.T) {
	p, _ := New(DefaultConfig(), nil)
	hooks := p.Hooks()
	if len(hooks) != 3 {
		t.Fatalf("hooks: %d", len(hooks))
	}
	podOps := hooks[2].Rules[0].Operations
	if hooks[2].Path != ValidatePodPath || len(podOps) != 2 || podOps[0] != admissionregistrationv1.Create || podOps[1] != admissionregistrationv1.Update {
		t.Fatalf("pod hook %+v", hooks[2])
	}
	off := false
	p2, _ := New(Config{RootQuota: "r", SystemQuota: "s", PodCheck: &off}, nil)
	if len(p2.Hooks()) != 2 {
		t.Fatal("podCheck false still adds the pod hook")
	}
	for _, bad := range []Config{{RootQuota: "r", SystemQuota: "r", DefaultQuota: "d"}, {RootQuota: "r", SystemQuota: "s", DefaultQuota: "s"}, {RootQuota: "R", SystemQuota: "s", DefaultQuota: "d"}} {
		if err := bad.Validate(); err == nil {
			t.Fatalf("%+v accepted", bad)
		}
	}
}

func TestOffline(t *testing.T) {
	p, err := New(DefaultConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	v := p.Validate(ctx, qreq(admissionv1.Create, mq("x").Parent("missing").Max("cpu=1").JSON(), ""))
	if !v.Allowed || len(v.Warnings) != 1 {
		t.Fatalf("offline: %+v", v)
	}
	verdict(t, p.Validate(ctx, qreq(admissionv1.Create, mq("x").Min("cpu=2").Max("cpu=1").JSON(), "")), "resourceKey cpu of quota x min 2 > max 1")
	verdict(t, p.Validate(ctx, qreq(admissionv1.Update, mq("x").Tree("b").JSON(), mq("x").Tree("a").JSON())), "x tree id changed [a] vs [b]")
	verdict(t, p.Validate(ctx, qreq(admissionv1.Update, mq(root).Max("cpu=2").JSON(), mq(root).JSON())), "invalid quota "+root)
	out, v := policytest.Mutate(t, p, qreq(admissionv1.Create, mq("x").Parent("org").Max("cpu=1").JSON(), ""))
	if !v.Allowed || len(v.Warnings) != 1 || out == nil {
		t.Fatalf("offline mutate: %+v", v)
	}
}

// TestQuotaAdmissionStopsWhenCancelled: the sum over a quota's pods ends
// once the handler has given up on the review, and says so (500), instead
// of finishing work nobody waits for.
func TestQuotaAdmissionStopsWhenCancelled(t *testing.T) {
	var pods []*corev1.Pod
	for i := range 1000 {
		pods = append(pods, mkPod("a1", fmt.Sprintf("p%d", i), nil, "cpu=1m", corev1.PodRunning))
	}
	cfg := DefaultConfig()
	cfg.QuotaAdmission = true
	p, _ := world(t, cfg, orgTree(), pods...)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	v := p.ValidatePod(ctx, podReq(admissionv1.Create, mkPod("a1", "n", nil, "cpu=1", ""), nil))
	if v.Allowed || v.Code != 500 || !strings.Contains(v.Message, "context canceled") {
		t.Fatalf("verdict %+v, want a 500 naming the cancellation", v)
	}
	verdict(t, p.ValidatePod(context.Background(), podReq(admissionv1.Create, mkPod("a1", "n", nil, "cpu=1", ""), nil)), "")
	// 1000 pods of 1m plus 7.5 is 8.5 > 8.
	verdict(t, p.ValidatePod(context.Background(), podReq(admissionv1.Create, mkPod("a1", "n", nil, "cpu=7500m", ""), nil)),
		"exceeded quota: quotas/team-a, requested: cpu=7500m, used: cpu=1, limited: cpu=8")
}

// TestQuotaAdmissionCounts: finished pods, pods past their deletion grace
// and pods bound elsewhere do not count (evaluator.go:280-293).
func TestQuotaAdmissionCounts(t *testing.T) {
	gone := mkPod("a1", "gone", nil, "cpu=4", corev1.PodRunning)
	ts := metav1.NewTime(metav1.Now().Add(-3600e9))
	grace := int64(30)
	gone.DeletionTimestamp, gone.DeletionGracePeriodSeconds = &ts, &grace
	pods := []*corev1.Pod{
		mkPod("a1", "done", nil, "cpu=4", corev1.PodSucceeded),
		mkPod("a1", "failed", nil, "cpu=4", corev1.PodFailed),
		gone,
		mkPod("a1", "other", map[string]string{LabelQuotaName: "team-b"}, "cpu=4", corev1.PodRunning),
		mkPod("a2", "live", nil, "cpu=2", corev1.PodRunning),
	}
	cfg := DefaultConfig()
	cfg.QuotaAdmission = true
	p, _ := world(t, cfg, orgTree(), pods...)
	verdict(t, p.ValidatePod(context.Background(), podReq(admissionv1.Create, mkPod("a1", "n", nil, "cpu=6", ""), nil)), "")
	verdict(t, p.ValidatePod(context.Background(), podReq(admissionv1.Create, mkPod("a1", "n", nil, "cpu=7", ""), nil)),
		"exceeded quota: quotas/team-a, requested: cpu=7, used: cpu=2, limited: cpu=8")
	// A quota name carried by two quotas is ambiguous (evaluate_quota.go:73-75).
	tree := append(orgTree(), mq("team-a").NS("other").Max("cpu=1"))
	p2, _ := world(t, cfg, tree)
	verdict(t, p2.ValidatePod(context.Background(), podReq(admissionv1.Create, mkPod("a1", "n", nil, "cpu=1", ""), nil)),
		"more than one elastic quota team-a found")
}

// TestPodOutOfRange: an out-of-range request is a 400 naming the field,
// before any arithmetic, with or without quota admission (upstream answers
// 400 when it cannot decode the pod).
func TestPodOutOfRange(t *testing.T) {
	for _, admit := range []bool{false, true} {
		cfg := DefaultConfig()
		cfg.QuotaAdmission = admit
		p, _ := world(t, cfg, orgTree())
		r := podReq(admissionv1.Create, mkPod("a1", "n", nil, "cpu=1", ""), nil)
		r.Object.Raw = []byte(`{"metadata":{"name":"n","namespace":"a1"},"spec":{"initContainers":[{"name":"i","resources":{"limits":{"cpu":"1e9999999"}}}]}}`)
		v := p.ValidatePod(context.Background(), r)
		if v.Allowed || v.Code != 400 || !strings.Contains(v.Message, "spec.initContainers[0].resources.limits.cpu: quantity 1e9999999 is out of range") {
			t.Fatalf("quotaAdmission %v: verdict %+v", admit, v)
		}
	}
}

// TestPodBoundToParent: a pod bound to a parent quota through its
// namespace is refused like one bound through its label.
func TestPodBoundToParent(t *testing.T) {
	tree := append(orgTree(), mq("ops").NS("ops").IsParent(true))
	p, _ := world(t, DefaultConfig(), tree)
	verdict(t, p.ValidatePod(context.Background(), podReq(admissionv1.Create, mkPod("ops", "n", nil, "", ""), nil)),
		"pod can not be linked to a parentQuotaGroup,quota:ops, pod:n")
	verdict(t, p.ValidatePod(context.Background(), podReq(admissionv1.Create, mkPod("a1", "n", map[string]string{LabelQuotaName: "org"}, "", ""), nil)),
		"pod can not be linked to a parentQuotaGroup,quota:org, pod:n")
	verdict(t, p.ValidatePod(context.Background(), podReq(admissionv1.Create, mkPod("a1", "n", nil, "", ""), nil)), "")
	verdict(t, p.ValidatePod(context.Background(), podReq(admissionv1.Delete, mkPod("a1", "n", nil, "", ""), nil)), "")
}

// TestUpdateNumbersCompareExactly: an update changing max from 2^53 to
// 2^53+1 is a change (upstream's reflect.DeepEqual of Quantities, qt:108),
// so it is not waved through as "tree fields unchanged": on a built-in
// quota it is refused. Through float64 the two were equal.
func TestUpdateNumbersCompareExactly(t *testing.T) {
	p, err := New(DefaultConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	quota := func(max string) string {
		return `{"metadata":{"name":"` + root + `","namespace":"quotas"},"spec":{"max":{"cpu":` + max + `}}}`
	}
	verdict(t, p.Validate(ctx, qreq(admissionv1.Update, quota(`9007199254740993`), quota(`9007199254740992`))), "invalid quota "+root)
	if v := p.Validate(ctx, qreq(admissionv1.Update, quota(`9007199254740993`), quota(`9007199254740993`))); !v.Allowed {
		t.Fatalf("unchanged max refused: %+v", v)
	}
	for _, tc := range []struct {
		a, b string
		want bool
	}{
		{`{"cpu":9007199254740993}`, `{"cpu":9007199254740992}`, false},
		{`{"cpu":9007199254740993}`, `{"cpu":9007199254740993}`, true},
		{`{"cpu":"1","memory":"2Gi"}`, `{"memory":"2Gi","cpu":"1"}`, true},
		{``, `null`, true},
		{`{"cpu":1}`, `{"cpu":"1"}`, false},
	} {
		if got := jsonEqual(json.RawMessage(tc.a), json.RawMessage(tc.b)); got != tc.want {
			t.Errorf("jsonEqual(%s, %s) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}
