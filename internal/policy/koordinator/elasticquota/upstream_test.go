package elasticquota

// Upstream's own test tables, ported: koordinator-sh/koordinator v1.8.0
// pkg/webhook/elasticquota/quota_topology_test.go (qtt),
// pkg/webhook/elasticquota/{validating/validating_handler_test.go,
// mutating/mutating_handle_test.go} and
// pkg/webhook/pod/validating/evaluate_quota_test.go. Inputs and expected
// outcomes are upstream's; rows that test upstream's internal maps going
// out of sync ("bug") have no counterpart here, as kadmit's snapshot is
// rebuilt whole from the informer and cannot be half-updated.

import (
	"context"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/kadmit/kadmit/internal/policy/policytest"
)

const (
	cpu120  = "cpu=120,memory=1048576" // MakeResourceList().CPU(120).Mem(1048576)
	min64   = "cpu=64,memory=51200"
	root    = DefaultRootQuota
	swAnn   = AnnotationSharedWeight
	nsAnn   = AnnotationNamespaces
	nameLbl = LabelQuotaName
)

// TestUpstreamBasicItemCheck ports qtt:56-126 (validateQuotaSelfItem).
func TestUpstreamBasicItemCheck(t *testing.T) {
	strict := AnnotationMaxStrictCheckResourceKeys
	for _, tc := range []struct {
		name  string
		quota *qb
		want  string
	}{
		{"admit", mq("temp").Max(cpu120), ""},
		{"max < 0", mq("temp").Max("cpu=-1,memory=1048576"), "temp quota.Spec.Max's value < 0, in dimensions :[cpu]"},
		{"min < 0", mq("temp").Min("cpu=-1,memory=1048576").Max("cpu=1,memory=1048576"), "temp quota.Spec.Min's value < 0, in dimensions :[cpu]"},
		{"min dimension larger than max", mq("temp").Min("cpu=1,memory=1048576").Max("cpu=10"),
			"resourceKey memory of quota temp is included in min, which is not included in max"},
		{"min > max", mq("temp").Min("cpu=12").Max("cpu=10"), "resourceKey cpu of quota temp min 12 > max 10"},
		{"annotation sharedWeight < 0", mq("temp").SharedWeight("cpu=-1,memory=1048576").Max("cpu=0,memory=1048576"),
			"temp quota.Annotation[" + swAnn + "]'s value < 0, in dimension :[cpu]"},
		{"annotation check max >= used", mq("temp").Ann(strict, `["cpu","memory"]`).Max("cpu=0,memory=1048576").Used("cpu=0,memory=10485760"),
			"resourceKey memory of quota temp max 1048576 < used 10485760"},
		{"annotation check max >= used, ignore other resources", mq("temp").Ann(strict, `["cpu"]`).Max("cpu=0,memory=1048576").Used("cpu=0,memory=10485760"), ""},
		{"annotation check max >= used, ignore empty used", mq("temp").Ann(strict, `["cpu","memory"]`).Max("cpu=0,memory=1048576").Used("cpu=0"), ""},
		{"annotation check max >= used, check empty max", mq("temp").Ann(strict, `["cpu","memory"]`).Max("cpu=0").Used("cpu=0,memory=10485760"),
			"resourceKey memory of quota temp is included in used, which is not included in max but should check max >= used"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, fc := world(t, DefaultConfig(), nil)
			_, v := create(t, p, fc, tc.quota)
			verdict(t, v, tc.want)
		})
	}
}

// TestUpstreamFillDefaults ports qtt:128-232 (fillQuotaDefaultInformation):
// each quota is defaulted, then added to the tree as the informer would.
func TestUpstreamFillDefaults(t *testing.T) {
	type step struct {
		quota                      *qb
		parent, sharedWeight, tree string
	}
	const both = `{"cpu":"120","memory":"1048576"}`
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"parent quota without treeID", []step{
			{mq("temp2").Max(cpu120), root, both, ""},
			{mq("temp2-bu1").Parent("temp2").Max(cpu120), "temp2", both, ""},
		}},
		{"parent quota with treeID", []step{
			{mq("temp2").Max(cpu120).Tree("tree-1"), root, both, "tree-1"},
			{mq("temp2-bu1").Parent("temp2").Max(cpu120), "temp2", both, "tree-1"},
		}},
		{"SharedWeight.keys == maxQuota.keys", []step{
			{mq("temp2").SharedWeight("cpu=0,memory=0").Max(cpu120).Tree("tree-1"), root, `{"cpu":"0","memory":"0"}`, "tree-1"},
		}},
		{"SharedWeight.keys > maxQuota.keys", []step{
			{mq("temp2").SharedWeight("cpu=0,memory=0").Max("memory=1048576").Tree("tree-1"), root, `{"memory":"0"}`, "tree-1"},
		}},
		{"SharedWeight.keys < maxQuota.keys", []step{
			{mq("temp2").SharedWeight("cpu=0").Max(cpu120).Tree("tree-1"), root, `{"cpu":"0","memory":"1048576"}`, "tree-1"},
		}},
		{"same number of keys, different keys", []step{
			{mq("temp2").SharedWeight("cpu=0").Max("memory=1048576").Tree("tree-1"), root, `{"memory":"1048576"}`, "tree-1"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, fc := world(t, DefaultConfig(), nil)
			for _, s := range tc.steps {
				in := s.quota.JSON()
				out, v := policytest.Mutate(t, p, qreq(admissionv1.Create, in, ""))
				verdict(t, v, "")
				if out == nil {
					out = []byte(in)
				}
				q, err := Parse(out)
				if err != nil {
					t.Fatal(err)
				}
				if q.Parent != s.parent || q.annotations[swAnn] != s.sharedWeight || q.TreeID != s.tree {
					t.Fatalf("%s: parent %q shared-weight %s tree %q; want %q %s %q", q.Name, q.Parent, q.annotations[swAnn], q.TreeID, s.parent, s.sharedWeight, s.tree)
				}
				fc.add(t, string(out))
			}
		})
	}
}

// TestUpstreamQuotaKeys ports qtt:233-380 (checkSubAndParentGroupQuotaKey).
func TestUpstreamQuotaKeys(t *testing.T) {
	for _, tc := range []struct {
		name               string
		par, quota, sub    *qb
		enableUpdateResKey bool
		wantErr            bool
	}{
		{"no tree", nil, mq("temp").Max(cpu120).IsParent(true), mq("temp-bu1").Parent("temp").Max(cpu120).IsParent(false), false, false},
		{"parent is root", nil, mq("temp-bu1").Parent(root).Max(cpu120).IsParent(false), nil, false, false},
		{"child's max has different dimension, included, gate off", nil, mq("temp").Max("cpu=10,memory=120").IsParent(true),
			mq("temp-bu1").Parent("temp").Max("cpu=120").IsParent(false), false, true},
		{"child's max has same dimension, gate off", nil, mq("temp").Max("cpu=10").IsParent(true),
			mq("temp-bu1").Parent("temp").Max("cpu=120").IsParent(false), false, false},
		{"child's max has different dimension, included, gate on", nil, mq("temp").Max("cpu=10,memory=120").IsParent(true),
			mq("temp-bu1").Parent("temp").Max("cpu=120").IsParent(false), true, false},
		{"child's max has different dimension, not included, gate on", nil, mq("temp").Max("memory=120").IsParent(true),
			mq("temp-bu1").Parent("temp").Max("cpu=120").IsParent(false), true, true},
		{"its max differs from parent's, included, gate off", mq("temp").Max("cpu=10,memory=120").IsParent(true),
			mq("temp-bu1").Parent("temp").Max("cpu=120").IsParent(false), nil, false, true},
		{"its max same as parent's, gate off", mq("temp").Max("cpu=10").IsParent(true),
			mq("temp-bu1").Parent("temp").Max("cpu=120").IsParent(false), nil, false, false},
		{"its max differs from parent's, included, gate on", mq("temp").Max("cpu=10,memory=120").IsParent(true),
			mq("temp-bu1").Parent("temp").Max("cpu=120").IsParent(false), nil, true, false},
		{"its max differs from parent's, not included, gate on", mq("temp").Max("memory=120").IsParent(true),
			mq("temp-bu1").Parent("temp").Max("cpu=120").IsParent(false), nil, true, true},
		{"its min differs from parent's, included, gate off", mq("temp").Min("cpu=10,memory=120").IsParent(true),
			mq("temp-bu1").Parent("temp").Min("cpu=120").IsParent(false), nil, false, false},
		{"its min not all included in parent's, gate off", mq("temp").Min("cpu=10").IsParent(true),
			mq("temp-bu1").Parent("temp").Min("cpu=120,memory=120").IsParent(false), nil, false, true},
		{"its min differs from parent's, included, gate on", mq("temp").Min("cpu=10,memory=120").IsParent(true),
			mq("temp-bu1").Parent("temp").Min("cpu=120").IsParent(false), nil, true, false},
		{"its min not included in parent's, gate on", mq("temp").Min("cpu=10").IsParent(true),
			mq("temp-bu1").Parent("temp").Min("cpu=120,memory=120").IsParent(false), nil, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.EnableUpdateResourceKey = tc.enableUpdateResKey
			p, fc := world(t, cfg, []*qb{tc.par, tc.quota, tc.sub})
			q := tc.quota.quota(t)
			wantErr(t, p.checkQuotaKeys(fc.snap, q, p.parentOf(q)), tc.wantErr)
		})
	}
}

// TestUpstreamTreeID ports qtt:382-461 (checkTreeID, on CREATE).
func TestUpstreamTreeID(t *testing.T) {
	r := "cpu=10,memory=20"
	for _, tc := range []struct {
		name                 string
		parent, quota, child *qb
		wantErr              bool
	}{
		{"satisfy no tree id", mq("parent").Max(r).Min(r).IsParent(true), mq("temp").Parent("parent").Max(r).Min(r).IsParent(true),
			mq("child").Parent("temp").Max(r).Min(r).IsParent(false), false},
		{"satisfy with tree id", mq("parent").Max(r).Min(r).IsParent(true).Tree("tree-1"), mq("temp").Parent("parent").Max(r).Min(r).IsParent(true).Tree("tree-1"),
			mq("child").Parent("temp").Max(r).Min(r).IsParent(false).Tree("tree-1"), false},
		{"parent no tree id", mq("parent").Max(r).Min(r).IsParent(true), mq("temp").Parent("parent").Max(r).Min(r).IsParent(true).Tree("tree-1"),
			mq("child").Parent("temp").Max(r).Min(r).IsParent(false).Tree("tree-1"), true},
		{"self no tree id", mq("parent").Max(r).Min(r).IsParent(true).Tree("tree-1"), mq("temp").Parent("parent").Max(r).Min(r).IsParent(true),
			mq("child").Parent("temp").Max(r).Min(r).IsParent(false).Tree("tree-1"), true},
		{"child no tree id", mq("parent").Max(r).Min(r).IsParent(true).Tree("tree-1"), mq("temp").Parent("parent").Max(r).Min(r).IsParent(true).Tree("tree-1"),
			mq("child").Parent("temp").Max(r).Min(r).IsParent(false), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, fc := world(t, DefaultConfig(), []*qb{tc.parent, tc.quota, tc.child})
			wantErr(t, p.validateTopology(fc.snap, nil, tc.quota.quota(t), nil), tc.wantErr)
		})
	}
}

// TestUpstreamMinQuotaSum ports qtt:463-536 (checkMinQuotaValidate), plus
// allow-force-update and is-root, which skip it (qtc:266-273).
func TestUpstreamMinQuotaSum(t *testing.T) {
	for _, tc := range []struct {
		name               string
		parent, quota, sub *qb
		wantErr            bool
	}{
		{"quotaInfo not satisfy", nil, mq("temp").Max(cpu120).Min("cpu=10,memory=51200").IsParent(true),
			mq("sub-1").Parent("temp").Max(cpu120).Min("cpu=16,memory=12800").IsParent(false), true},
		{"parentQuotaInfo not satisfy", mq("temp").Max(cpu120).Min("cpu=10,memory=51200").IsParent(true),
			mq("sub-1").Parent("temp").Max(cpu120).Min("cpu=16,memory=12800").IsParent(false), nil, true},
		{"childQuotaInfo not satisfy", nil, mq("temp").Max(cpu120).Min("cpu=16,memory=12800").IsParent(false),
			mq("sub-1").Parent("temp").Max("cpu=120,memory=12800").Min("cpu=16,memory=12801").IsParent(false), true},
		{"satisfy", nil, mq("temp").Max(cpu120).Min("cpu=19,memory=51200").IsParent(true),
			mq("sub-1").Parent("temp").Max(cpu120).Min("cpu=16,memory=12800").IsParent(false), false},
		{"parent no resource", mq("temp-no-min").IsParent(true),
			mq("sub-1").Parent("temp-no-min").Max(cpu120).Min("cpu=19,memory=51200").IsParent(false), nil, true},
		// kadmit rows: the two labels that skip the check.
		{"allow-force-update", mq("temp").Max(cpu120).Min("cpu=10,memory=51200").IsParent(true),
			mq("sub-1").Parent("temp").Max(cpu120).Min("cpu=16,memory=12800").IsParent(false).Label(LabelAllowForceUpdate, "true"), nil, false},
		{"is-root", mq("temp").Max(cpu120).Min("cpu=10,memory=51200").IsParent(true),
			mq("sub-1").Parent("temp").Max(cpu120).Min("cpu=16,memory=12800").IsParent(false).Label(LabelIsRoot, "true"), nil, false},
		{"allow-force-update other than true", mq("temp").Max(cpu120).Min("cpu=10,memory=51200").IsParent(true),
			mq("sub-1").Parent("temp").Max(cpu120).Min("cpu=16,memory=12800").IsParent(false).Label(LabelAllowForceUpdate, "yes"), nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, fc := world(t, DefaultConfig(), []*qb{tc.parent, tc.quota, tc.sub})
			q := tc.quota.quota(t)
			wantErr(t, p.checkMinSums(fc.snap, q, p.parentOf(q)), tc.wantErr)
		})
	}
}

// TestUpstreamValidAddQuota ports qtt:538-590.
func TestUpstreamValidAddQuota(t *testing.T) {
	ctx := context.Background()
	p, fc := world(t, DefaultConfig(), nil)
	temp, v := create(t, p, fc, mq("temp").Max(cpu120).Min(min64).IsParent(true))
	verdict(t, v, "")
	if q, _ := Parse([]byte(temp)); q.Parent != root || q.annotations[swAnn] != `{"cpu":"120","memory":"1048576"}` {
		t.Fatalf("defaults: %s", temp)
	}
	verdict(t, p.Validate(ctx, qreq(admissionv1.Create, temp, "")), "AddQuota quota already exist:temp")
	_, v = create(t, p, fc, mq("sub-1").Parent("temp").Max(cpu120).Min("cpu=16,memory=12800").IsParent(false))
	verdict(t, v, "")
	_, v = create(t, p, fc, mq("sub-2").Parent("temp").Max(cpu120).Min("cpu=16,memory=12800").IsParent(false))
	verdict(t, v, "")
	if c := fc.snap.Children("temp"); len(c) != 2 {
		t.Fatalf("children %v", c)
	}
	_, v = create(t, p, fc, mq("temp2").Max(cpu120).Min(min64).IsParent(true).Tree("tree-1"))
	verdict(t, v, "")
	// Validated without defaulting: the child lacks its parent's tree id.
	v = p.Validate(ctx, qreq(admissionv1.Create, mq("sub-3").Parent("temp2").Max(cpu120).Min(min64).IsParent(true).JSON(), ""))
	verdict(t, v, "sub-3 tree id is different from parent temp2, [] vs [tree-1]")
}

// TestUpstreamValidUpdateQuota ports qtt:592-698.
func TestUpstreamValidUpdateQuota(t *testing.T) {
	p, fc := world(t, DefaultConfig(), nil)
	temp, v := create(t, p, fc, mq("temp").Max(cpu120).Min(min64).IsParent(true))
	verdict(t, v, "")
	verdict(t, update(t, p, fc, temp, temp), "")
	// An annotation-only change passes before any check (qt:108-110).
	tempQ := mq("temp").Max(cpu120).Min(min64).IsParent(true).Parent(root).Ann(swAnn, `{"cpu":96, "memory":"655360"}`)
	verdict(t, update(t, p, fc, temp, tempQ.JSON()), "")
	temp2, v := create(t, p, fc, mq("temp2").Max(cpu120).Min(min64).IsParent(true))
	verdict(t, v, "")
	sub1B := mq("sub-1").Parent("temp").Max(cpu120).Min("cpu=60,memory=12800").IsParent(false)
	oldSub1, v := create(t, p, fc, sub1B)
	verdict(t, v, "")
	if len(fc.snap.Children("temp")) != 1 || len(fc.snap.Children("temp2")) != 0 {
		t.Fatal("tree after sub-1")
	}
	moved := sub1B.copy().Parent("temp2")
	verdict(t, update(t, p, fc, oldSub1, moved.JSON()), "")
	if len(fc.snap.Children("temp")) != 0 || len(fc.snap.Children("temp2")) != 1 {
		t.Fatal("tree after moving sub-1")
	}
	back := sub1B.copy().Parent("temp").Min("cpu=121,memory=1048576")
	verdict(t, update(t, p, fc, oldSub1, back.JSON()), "resourceKey cpu of quota sub-1 min 121 > max 120")
	if len(fc.snap.Children("temp2")) != 1 {
		t.Fatal("a denied update changed the tree")
	}
	renamed := back.copy()
	renamed.name = "tmp"
	verdict(t, update(t, p, fc, oldSub1, renamed.JSON()), "UpdateQuota quota not exist in quotaInfoMap:tmp")
	renamed.name = root
	verdict(t, update(t, p, fc, oldSub1, renamed.JSON()), "invalid quota "+root)

	verdict(t, update(t, p, fc, tempQ.JSON(), tempQ.copy().IsParent(false).JSON()), "")
	verdict(t, update(t, p, fc, temp2, mq("temp2").Max(cpu120).Min(min64).IsParent(false).Parent(root).SharedWeight(cpu120).JSON()),
		"quota has children, isParent is forbidden to modify as false, quotaName:temp2")

	sub1 := sub1B.copy().Parent("temp").Min(cpu120)
	newSub1 := sub1.copy().IsParent(true)
	const bound = "quota has bound pods, isParent is forbidden to modify as true, quotaName: sub-1"
	fc.pods = []*corev1.Pod{mkPod("", "pod1", map[string]string{nameLbl: "sub-1"}, "", "")}
	verdict(t, update(t, p, fc, sub1.JSON(), newSub1.JSON()), bound)
	fc.pods = []*corev1.Pod{mkPod("sub-1", "pod2", nil, "", "")}
	verdict(t, update(t, p, fc, sub1.JSON(), newSub1.JSON()), bound)
	fc.pods = []*corev1.Pod{mkPod("sub-2", "pod3", map[string]string{nameLbl: "sub-1"}, "", "")}
	sub1.Namespaces("namespace1", "namespace2")
	verdict(t, update(t, p, fc, sub1.JSON(), newSub1.JSON()), bound)
	// kadmit row: a pod in one of the old claimed namespaces counts too.
	fc.pods = []*corev1.Pod{mkPod("namespace2", "pod4", nil, "", corev1.PodSucceeded)}
	verdict(t, update(t, p, fc, sub1.JSON(), newSub1.JSON()), bound)

	verdict(t, update(t, p, fc, sub1.JSON(), sub1.copy().Tree("tree-1").JSON()), "sub-1 tree id changed [] vs [tree-1]")
}

// TestUpstreamAnnotationNamespaces ports qtt:733-777.
func TestUpstreamAnnotationNamespaces(t *testing.T) {
	ctx := context.Background()
	p, fc := world(t, DefaultConfig(), nil)
	temp := mq("temp").Namespaces("test1", "test2")
	v := p.Validate(ctx, qreq(admissionv1.Create, temp.JSON(), ""))
	verdict(t, v, "")
	fc.add(t, temp.JSON())
	if fc.snap.Claimant("test1").Name != "temp" || fc.snap.Claimant("test2").Name != "temp" {
		t.Fatal("claims")
	}
	other := temp.copy()
	other.name = "temp2"
	verdict(t, p.Validate(ctx, qreq(admissionv1.Create, other.JSON(), "")),
		"AddQuota quota temp2's annotation namespace test1 is already bound to quota temp")
	moved := temp.copy().Namespaces("test2", "test3")
	verdict(t, update(t, p, fc, temp.JSON(), moved.JSON()), "")
	if fc.snap.Claimant("test2").Name != "temp" || fc.snap.Claimant("test3").Name != "temp" || fc.snap.Claimant("test1") != nil {
		t.Fatal("claims after update")
	}
	temp5 := temp.copy().Ann(nsAnn, "")
	temp5.name = "temp5"
	verdict(t, p.Validate(ctx, qreq(admissionv1.Create, temp5.JSON(), "")), "")
	fc.add(t, temp5.JSON())
	verdict(t, update(t, p, fc, temp5.JSON(), temp5.copy().Namespaces("test2").JSON()),
		"UpdadteQuota, quota temp5 update namespaces, but namespace test2 is already bound to quota temp")
	verdict(t, del(t, p, fc, moved.JSON()), "")
	if fc.snap.Claimant("test2") != nil || fc.snap.Claimant("test3") != nil {
		t.Fatal("claims after delete")
	}
}

// TestUpstreamValidDeleteQuota ports qtt:779-854, with kadmit rows for the
// three built-in names (qt:164-166) and a finished pod (qt:181-202 lists
// every labelled pod, in any phase).
func TestUpstreamValidDeleteQuota(t *testing.T) {
	p, fc := world(t, DefaultConfig(), nil)
	temp, v := create(t, p, fc, mq("temp").Max(cpu120).Min(min64).IsParent(true))
	verdict(t, v, "")
	temp2, v := create(t, p, fc, mq("temp2").Max(cpu120).Min(min64).IsParent(true))
	verdict(t, v, "")
	sub1, v := create(t, p, fc, mq("sub-1").Parent("temp").Max(cpu120).Min("cpu=60,memory=12800").IsParent(false))
	verdict(t, v, "")
	verdict(t, del(t, p, fc, temp), "delete quota failed, quota temp has 1 child quotas")
	verdict(t, del(t, p, fc, temp2), "")
	fc.pods = []*corev1.Pod{mkPod("sub-1", "pod1", map[string]string{nameLbl: "sub-1"}, "", "")}
	verdict(t, del(t, p, fc, sub1), "delete quota failed, quota sub-1 has 1 child pods: pod1")
	fc.pods = []*corev1.Pod{
		mkPod("a", "p1", map[string]string{nameLbl: "sub-1"}, "", corev1.PodSucceeded),
		mkPod("a", "p2", map[string]string{nameLbl: "sub-1"}, "", corev1.PodFailed),
		mkPod("b", "p3", map[string]string{nameLbl: "sub-1"}, "", corev1.PodSucceeded),
	}
	verdict(t, del(t, p, fc, sub1), "delete quota failed, quota sub-1 has 3 child pods: p1, p2, ...")
	// Pods bound only through a claimed namespace do not block deletion.
	fc.pods = []*corev1.Pod{mkPod("sub-1", "pod1", nil, "", "")}
	verdict(t, del(t, p, fc, sub1), "")
	verdict(t, del(t, p, fc, temp), "")
	verdict(t, del(t, p, fc, mq("system").JSON()), "not found quota:system")
	verdict(t, del(t, p, fc, mq("notFound").Max("cpu=1").JSON()), "not found quota:notFound")
	for _, n := range []string{DefaultRootQuota, DefaultSystemQuota, DefaultDefaultQuota} {
		fc.add(t, mq(n).JSON())
		verdict(t, del(t, p, fc, mq(n).JSON()), "can not delete quotaGroup :"+n)
	}
}

// TestUpstreamAddPodUpdatePod ports qtt:900-941 (ValidateAddPod,
// ValidateUpdatePod) through /validate-pod.
func TestUpstreamAddPodUpdatePod(t *testing.T) {
	ctx := context.Background()
	quotas := []*qb{
		mq("temp").Max(cpu120).Min(min64).IsParent(true),
		mq("sub-1").Parent("temp").Max(cpu120).Min("cpu=60,memory=12800").IsParent(false),
		mq("sub-2").Parent("temp").Max(cpu120).Min("cpu=60,memory=12800").IsParent(false),
	}
	p, _ := world(t, DefaultConfig(), quotas)
	lbl := func(q string) map[string]string { return map[string]string{nameLbl: q} }
	pod1 := mkPod("", "pod1", lbl("sub-1"), "", "")
	verdict(t, p.ValidatePod(ctx, podReq(admissionv1.Create, pod1, nil)), "")
	verdict(t, p.ValidatePod(ctx, podReq(admissionv1.Update, mkPod("", "pod1", lbl("sub-2"), "", ""), pod1)), "")
	pod2 := mkPod("", "pod2", lbl("temp"), "", "")
	const parentErr = "pod can not be linked to a parentQuotaGroup,quota:temp, pod:pod2"
	verdict(t, p.ValidatePod(ctx, podReq(admissionv1.Create, pod2, nil)), parentErr)
	pod2sub := mkPod("", "pod2", lbl("sub-2"), "", "")
	verdict(t, p.ValidatePod(ctx, podReq(admissionv1.Update, pod2sub, pod2)), "")
	verdict(t, p.ValidatePod(ctx, podReq(admissionv1.Update, pod2, pod2sub)), parentErr)

	cfg := DefaultConfig()
	cfg.SupportParentQuotaSubmitPod = true
	p2, _ := world(t, cfg, quotas)
	verdict(t, p2.ValidatePod(ctx, podReq(admissionv1.Update, pod2, pod2sub)), "")
	verdict(t, p2.ValidatePod(ctx, podReq(admissionv1.Update, mkPod("", "pod2", lbl("default"), "", ""), pod2)), "")

	// The preemptible label is immutable (pod_check.go:63-65), also when
	// added or removed, and also offline.
	pre := func(v string) *corev1.Pod {
		l := lbl("sub-1")
		if v != "" {
			l[LabelPreemptible] = v
		}
		return mkPod("", "pod1", l, "", "")
	}
	offline, _ := New(DefaultConfig(), nil)
	for _, pol := range []*Policy{p, offline} {
		verdict(t, pol.ValidatePod(ctx, podReq(admissionv1.Update, pre("false"), pre("true"))), "Preemptible label is forbidden modify now.")
		verdict(t, pol.ValidatePod(ctx, podReq(admissionv1.Update, pre("false"), pre(""))), "Preemptible label is forbidden modify now.")
		verdict(t, pol.ValidatePod(ctx, podReq(admissionv1.Update, pre("true"), pre("true"))), "")
		verdict(t, pol.ValidatePod(ctx, podReq(admissionv1.Create, pre("false"), nil)), "")
	}
}

// TestUpstreamQuotaNameOfPod ports qtt:943-1002 (getQuotaNameFromPodNoLock),
// with kadmit rows for the namespaces annotation and the rules kadmit had
// wrong (a quota merely living in the pod's namespace binds nothing).
func TestUpstreamQuotaNameOfPod(t *testing.T) {
	for _, tc := range []struct {
		name        string
		ns          string
		labels      map[string]string
		quotas      []*qb
		disableDflt bool
		want        string
	}{
		{"default quota", "", nil, nil, false, DefaultDefaultQuota},
		{"quota name from label", "test-ns", map[string]string{nameLbl: "test-quota"},
			[]*qb{mq("test-quota").NS("test-ns").IsParent(false)}, false, "test-quota"},
		{"quota name from namespace", "test-ns", nil,
			[]*qb{mq("parent-quota").NS("test-ns").IsParent(true), mq("test-ns").NS("test-ns").IsParent(false)}, false, "test-ns"},
		{"quota living in the namespace binds nothing", "test-ns", nil,
			[]*qb{mq("team").NS("test-ns")}, false, DefaultDefaultQuota},
		{"quota named after the namespace elsewhere binds nothing", "test-ns", nil,
			[]*qb{mq("test-ns").NS("other")}, false, DefaultDefaultQuota},
		{"namespaces annotation", "test-ns", nil,
			[]*qb{mq("team").NS("quotas").Namespaces("test-ns")}, false, "team"},
		{"quota named after the namespace before the annotation", "test-ns", nil,
			[]*qb{mq("team").NS("quotas").Namespaces("test-ns"), mq("test-ns").NS("test-ns")}, false, "test-ns"},
		{"label naming no quota", "test-ns", map[string]string{nameLbl: "missing"}, nil, false, DefaultDefaultQuota},
		{"disableDefaultQuota: label only", "test-ns", nil,
			[]*qb{mq("team").Namespaces("test-ns")}, true, DefaultDefaultQuota},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.DisableDefaultQuota = tc.disableDflt
			p, fc := world(t, cfg, tc.quotas)
			got := p.quotaNameOf(fc.snap, tc.ns, tc.labels)
			if fc.snap.Get(got) == nil {
				got = DefaultDefaultQuota
			}
			if got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// TestUpstreamCheckParentQuotaInfo ports qtt:1004-1020.
func TestUpstreamCheckParentQuotaInfo(t *testing.T) {
	p, fc := world(t, DefaultConfig(), []*qb{mq("temp").Max(cpu120).Min(min64).IsParent(false)})
	x := mq("x").Parent("temp").IsParent(true)
	verdict(t, p.validateTopology(fc.snap, nil, x.quota(t), nil), "x has parentName temp but the parentQuotaInfo's IsParent is false")
	fc.remove("temp")
	verdict(t, p.validateTopology(fc.snap, nil, x.quota(t), nil), "x has parentName temp but not find parentInfo in quotaInfoMap")
}

// TestUpstreamHandlers ports validating_handler_test.go:58-201 and
// mutating_handle_test.go:53-147: every denial is a 400.
func TestUpstreamHandlers(t *testing.T) {
	ctx := context.Background()
	p, fc := world(t, DefaultConfig(), nil)
	check := func(op admissionv1.Operation, obj, old string, allowed bool) {
		t.Helper()
		v := p.Validate(ctx, qreq(op, obj, old))
		wantErr(t, v, !allowed)
		if v.Allowed && op == admissionv1.Create {
			fc.add(t, obj)
		}
	}
	check(admissionv1.Create, "", "", false)
	check(admissionv1.Create, `{"metadata":{"name":"quota1"}}`, "", true)
	check(admissionv1.Update, `{"metadata":{"name":"quota1","labels":{"`+LabelTreeID+`":"tree-1"}}}`, `{"metadata":{"name":"quota1"}}`, false)
	check(admissionv1.Create, `{"metadata":{"name":"quota2","labels":{"`+LabelTreeID+`":"tree-2"}}}`, "", true)
	check(admissionv1.Update, `{"metadata":{"name":"quota2","labels":{"`+LabelTreeID+`":"tree-1"}}}`, `{"metadata":{"name":"quota2","labels":{"`+LabelTreeID+`":"tree-2"}}}`, false)
	check(admissionv1.Update, `{"metadata":{"name":"quota2"}}`, `{"metadata":{"name":"quota2","labels":{"`+LabelTreeID+`":"tree-2"}}}`, false)

	mut := func(op admissionv1.Operation, obj string, allowed bool) {
		t.Helper()
		_, v := p.Mutate(ctx, qreq(op, obj, ""))
		wantErr(t, v, !allowed)
	}
	mut(admissionv1.Create, "", false)
	mut(admissionv1.Update, `{"metadata":{"name":"pod1"}}`, true)
	mut(admissionv1.Create, `{"metadata":{"name":"quota1"}}`, true)
	if ops, v := p.Mutate(ctx, qreq(admissionv1.Create, `{"metadata":{"name":"koordinator-root-quota"}}`, "")); !v.Allowed || len(ops) != 0 {
		t.Fatalf("root quota: %v %+v", ops, v)
	}
}

// TestUpstreamEvaluateQuota ports evaluate_quota_test.go:43-330 (quota
// admission, gate EnableQuotaAdmission = quotaAdmission). Upstream's
// child-request annotation (the use it recorded) is a running pod bound to
// the quota with that request here, as kadmit sums bound pods. The
// replace-resources row needs ElasticQuotaEvaluationTransformPod, which
// kadmit does not re-create.
func TestUpstreamEvaluateQuota(t *testing.T) {
	const (
		batch = "kubernetes.io/batch-cpu=4,kubernetes.io/batch-memory=8Gi"
		pod24 = "cpu=2,memory=4Gi"
	)
	for _, tc := range []struct {
		name, podReq, podQuota string
		max, used, admissionAn string // admissionAn "-" is absent
		want                   string
	}{
		{"normal case 1", pod24, "quota1", "cpu=4,memory=8Gi", "", "-", ""},
		{"normal case 2", pod24, "quota1", "cpu=4,memory=8Gi", "cpu=2,memory=2Gi", "-", ""},
		{"cpu exceeded max", pod24, "quota1", "cpu=4,memory=8Gi", "cpu=4,memory=2Gi", "-",
			"exceeded quota: kube-system/quota1, requested: cpu=2, used: cpu=4, limited: cpu=4"},
		{"cpu and memory exceeded max", pod24, "quota1", "cpu=4,memory=8Gi", "cpu=4,memory=8Gi", "-",
			"exceeded quota: kube-system/quota1, requested: cpu=2,memory=4Gi, used: cpu=4,memory=8Gi, limited: cpu=4,memory=8Gi"},
		{"cpu exceeded max, but not admission", pod24, "quota1", "cpu=4,memory=8Gi", "cpu=4,memory=2Gi", `{"cpu":"8","memory":"16Gi"}`, ""},
		{"cpu and memory exceeded max, but not admission", pod24, "quota1", "cpu=4,memory=8Gi", "cpu=4,memory=8Gi", `{"cpu":"8","memory":"16Gi"}`, ""},
		{"quota not found", pod24, "quota2", "cpu=4,memory=8Gi", "cpu=2,memory=2Gi", "-", "elastic quota quota2 not found"},
		{"quota has batch cpu, pod not", pod24, "quota1", batch, batch, "-", ""},
		{"quota has batch cpu, pod has and exceeded", "kubernetes.io/batch-cpu=1,kubernetes.io/batch-memory=2Gi", "quota1", batch, batch, "-",
			"exceeded quota: kube-system/quota1, requested: kubernetes.io/batch-cpu=1,kubernetes.io/batch-memory=2Gi, used: kubernetes.io/batch-cpu=4,kubernetes.io/batch-memory=8Gi, limited: kubernetes.io/batch-cpu=4,kubernetes.io/batch-memory=8Gi"},
		{"admission not set, use max by default", pod24, "quota1", "cpu=1,memory=2Gi", "", "-",
			"exceeded quota: kube-system/quota1, requested: cpu=2,memory=4Gi, used: , limited: cpu=1,memory=2Gi"},
		{"admission set empty, use max by default", pod24, "quota1", "cpu=1,memory=2Gi", "", "{}",
			"exceeded quota: kube-system/quota1, requested: cpu=2,memory=4Gi, used: , limited: cpu=1,memory=2Gi"},
		{"admission set zero explicitly", pod24, "quota1", "cpu=4,memory=8Gi", "", `{"cpu":"0","memory":"0Gi"}`,
			"exceeded quota: kube-system/quota1, requested: cpu=2,memory=4Gi, used: , limited: cpu=0,memory=0"},
		{"admission set zero for non-related resource", pod24, "quota1", "cpu=4,memory=8Gi", "", `{"kubernetes.io/batch-cpu":"0"}`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := mq("quota1").NS("kube-system").Max(tc.max)
			if tc.admissionAn != "-" {
				q.Ann(AnnotationAdmission, tc.admissionAn)
			}
			var pods []*corev1.Pod
			if tc.used != "" {
				pods = append(pods, mkPod("ns0", "used", map[string]string{nameLbl: "quota1"}, tc.used, corev1.PodRunning))
			}
			cfg := DefaultConfig()
			cfg.QuotaAdmission = true
			p, _ := world(t, cfg, []*qb{q}, pods...)
			newPod := mkPod("ns1", "pod1", map[string]string{nameLbl: tc.podQuota}, tc.podReq, "")
			verdict(t, p.ValidatePod(context.Background(), podReq(admissionv1.Create, newPod, nil)), tc.want)
			// Upstream's default (gate off) never checks.
			off, _ := world(t, DefaultConfig(), []*qb{q}, pods...)
			verdict(t, off.ValidatePod(context.Background(), podReq(admissionv1.Create, newPod, nil)), "")
		})
	}
}
