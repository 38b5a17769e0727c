package scheduling

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/kadmit/kadmit/test/e2e/e2eenv"
	"github.com/kadmit/kadmit/test/poll"
)

// The elastic-quota policy against a real API server, with upstream's
// defaults (Koordinator v1.8.0) plus quotaAdmission (upstream's
// EnableQuotaAdmission gate), which main_test.go's config turns on.

func quota(name, ns string, labels, annotations map[string]string, min, max map[string]any) *unstructured.Unstructured {
	spec := map[string]any{}
	if min != nil {
		spec["min"] = min
	}
	if max != nil {
		spec["max"] = max
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
		"metadata": map[string]any{"name": name, "namespace": ns}, "spec": spec,
	}}
	u.SetLabels(labels)
	u.SetAnnotations(annotations)
	return u
}

func cpu(v string) map[string]any { return map[string]any{"cpu": v} }

// wantQuotaDenial fails unless err is a webhook denial with status code 400
// (Koordinator answers admission.Errored(400) for every quota error) whose
// message contains msg.
func wantQuotaDenial(t *testing.T, err error, msg string) {
	t.Helper()
	wantDenied(t, err, msg)
	var st apierrors.APIStatus
	if !errors.As(err, &st) || st.Status().Code != 400 {
		t.Fatalf("denial %v: want status code 400", err)
	}
}

// eventually retries f until kadmit's informers have caught up with what
// the test wrote (f returns nil).
func eventually(ctx context.Context, t *testing.T, f func(ctx context.Context) error) {
	t.Helper()
	if err := poll.Until(ctx, cacheWait, f); err != nil {
		t.Fatal(err)
	}
}

// denialContaining is for eventually: nil once err is a denial with msg.
func denialContaining(err error, msg string) error {
	if err == nil {
		return fmt.Errorf("admitted, want %q", msg)
	}
	if !strings.Contains(err.Error(), msg) {
		return fmt.Errorf("got %v, want %q", err, msg)
	}
	return nil
}

func TestElasticQuotaTree(t *testing.T) {
	e := world(t)
	ctx := e2eenv.TestCtx(t, 3*time.Minute)
	eq := e.dyn.Resource(elasticQuotaGVR).Namespace(e.quotas)
	org := "org-" + e.suffix
	teamA, teamB := "team-a-"+e.suffix, "team-b-"+e.suffix

	if _, err := eq.Create(ctx, quota(org, e.quotas, map[string]string{eqPrefix + "is-parent": "true", eqPrefix + "tree-id": "t1"}, nil,
		cpu("10"), cpu("20")), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Until kadmit's cache holds org, defaulting the child's tree id fails
	// (quota_topology.go:236-240).
	var a *unstructured.Unstructured
	claims, _ := json.Marshal([]string{e.podsNS})
	eventually(ctx, t, func(ctx context.Context) error {
		var err error
		a, err = eq.Create(ctx, quota(teamA, e.quotas, map[string]string{eqPrefix + "parent": org}, map[string]string{eqPrefix + "namespaces": string(claims)},
			cpu("4"), cpu("8")), metav1.CreateOptions{})
		return err
	})
	if a.GetLabels()[eqPrefix+"tree-id"] != "t1" || a.GetAnnotations()[eqPrefix+"shared-weight"] != `{"cpu":"8"}` {
		t.Fatalf("team-a labels %v annotations %v", a.GetLabels(), a.GetAnnotations())
	}
	top, err := eq.Create(ctx, quota("top-"+e.suffix, e.quotas, nil, map[string]string{eqPrefix + "shared-weight": `{"cpu":"1","gpu":"2"}`},
		nil, map[string]any{"cpu": "1", "memory": "1Gi"}), metav1.CreateOptions{})
	if err != nil || top.GetLabels()[eqPrefix+"parent"] != "koordinator-root-quota" ||
		top.GetAnnotations()[eqPrefix+"shared-weight"] != `{"cpu":"1","memory":"1Gi"}` {
		t.Fatalf("top-level quota: %v %v", top, err)
	}

	// A dry run that fits changes nothing: afterwards a real sibling that
	// only fits if the dry run left no trace is admitted.
	const brothers = "checkMinQuotaSum all brothers' MinQuota > parent MinQuota, parent: "
	eventually(ctx, t, func(ctx context.Context) error {
		_, err := eq.Create(ctx, quota(teamB, e.quotas, map[string]string{eqPrefix + "parent": org}, nil, cpu("7"), cpu("8")), dryRun)
		return denialContaining(err, brothers+org)
	})
	if _, err := eq.Create(ctx, quota("dry", e.quotas, map[string]string{eqPrefix + "parent": org}, nil, cpu("6"), cpu("8")), dryRun); err != nil {
		t.Fatal(err)
	}
	if _, err := eq.Create(ctx, quota(teamB, e.quotas, map[string]string{eqPrefix + "parent": org}, nil, cpu("6"), cpu("8")), metav1.CreateOptions{}); err != nil {
		t.Fatalf("sibling after a dry run: %v", err)
	}
	_, err = eq.Create(ctx, quota("x-"+e.suffix, e.quotas, map[string]string{eqPrefix + "parent": org}, nil, map[string]any{"memory": "1Gi"}, cpu("2")), dryRun)
	wantQuotaDenial(t, err, "resourceKey memory of quota x-"+e.suffix+" is included in min, which is not included in max")
	_, err = eq.Create(ctx, quota("z-"+e.suffix, e.quotas, nil, map[string]string{eqPrefix + "namespaces": string(claims)}, nil, cpu("2")), dryRun)
	wantQuotaDenial(t, err, "annotation namespace "+e.podsNS+" is already bound to quota "+teamA)
	// One tree across namespaces: the name is taken.
	_, err = e.dyn.Resource(elasticQuotaGVR).Namespace(e.podsNS).Create(ctx, quota(teamA, e.podsNS, nil, nil, nil, cpu("1")), dryRun)
	wantQuotaDenial(t, err, "AddQuota quota already exist:"+teamA)

	// Annotation-only updates pass; tree-id is immutable; is-parent cannot
	// drop while children exist.
	cur, err := eq.Get(ctx, org, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ann := cur.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	ann[eqPrefix+"runtime"] = `{"cpu":"3"}`
	cur.SetAnnotations(ann)
	if cur, err = eq.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("annotation-only update: %v", err)
	}
	l := cur.GetLabels()
	l[eqPrefix+"tree-id"] = "t2"
	cur.SetLabels(l)
	_, err = eq.Update(ctx, cur, metav1.UpdateOptions{})
	wantQuotaDenial(t, err, org+" tree id changed [t1] vs [t2]")
	cur, _ = eq.Get(ctx, org, metav1.GetOptions{})
	l = cur.GetLabels()
	l[eqPrefix+"is-parent"] = "false"
	cur.SetLabels(l)
	_, err = eq.Update(ctx, cur, metav1.UpdateOptions{})
	wantQuotaDenial(t, err, "quota has children, isParent is forbidden to modify as false, quotaName:"+org)
	err = eq.Delete(ctx, org, metav1.DeleteOptions{})
	wantQuotaDenial(t, err, "delete quota failed, quota "+org+" has 2 child quotas")

	// The built-in root quota: koord-scheduler's annotation writes pass,
	// a spec change and a delete do not.
	rootQ, err := eq.Create(ctx, quota("koordinator-root-quota", e.quotas, nil, nil, nil, cpu("1000")), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rootQ.SetAnnotations(map[string]string{eqPrefix + "runtime": `{"cpu":"5"}`})
	if rootQ, err = eq.Update(ctx, rootQ, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("root annotation update: %v", err)
	}
	_ = unstructured.SetNestedField(rootQ.Object, "999", "spec", "max", "cpu")
	_, err = eq.Update(ctx, rootQ, metav1.UpdateOptions{})
	wantQuotaDenial(t, err, "invalid quota koordinator-root-quota")
	err = eq.Delete(ctx, rootQ.GetName(), metav1.DeleteOptions{})
	wantQuotaDenial(t, err, "can not delete quotaGroup :koordinator-root-quota")
}

func TestElasticQuotaPods(t *testing.T) {
	e := world(t)
	ctx := e2eenv.TestCtx(t, 3*time.Minute)
	eq := e.dyn.Resource(elasticQuotaGVR).Namespace(e.quotas)
	parent, leaf := "pp-"+e.suffix, "pl-"+e.suffix
	claimed := e.podsNS + "-p"
	if _, err := e.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: claimed}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := eq.Create(ctx, quota(parent, e.quotas, map[string]string{eqPrefix + "is-parent": "true"}, nil, cpu("8"), cpu("8")), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	claims, _ := json.Marshal([]string{claimed})
	eventually(ctx, t, func(ctx context.Context) error {
		_, err := eq.Create(ctx, quota(leaf, e.quotas, map[string]string{eqPrefix + "parent": parent}, map[string]string{eqPrefix + "namespaces": string(claims)},
			cpu("2"), cpu("8")), metav1.CreateOptions{})
		return err
	})
	p := func(name, c string, labels map[string]string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "c", Image: "registry.k8s.io/pause:3.10",
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(c)}}}}}}
	}
	pods := e.Client.CoreV1().Pods(claimed)

	// A pod bound to a parent quota is refused (pod_check.go:56-58).
	eventually(ctx, t, func(ctx context.Context) error {
		_, err := e.Client.CoreV1().Pods(e.plain).Create(ctx, p("to-parent", "1", map[string]string{eqPrefix + "name": parent}), dryRun)
		return denialContaining(err, "pod can not be linked to a parentQuotaGroup,quota:"+parent+", pod:to-parent")
	})

	// Pods in the claimed namespace count against the leaf's max of 8 cpu.
	first, err := pods.Create(ctx, p("first", "5", map[string]string{eqPrefix + "preemptible": "true"}), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	eventually(ctx, t, func(ctx context.Context) error {
		_, err := pods.Create(ctx, p("second", "4", nil), dryRun)
		return denialContaining(err, "exceeded quota: "+e.quotas+"/"+leaf+", requested: cpu=4, used: cpu=5, limited: cpu=8")
	})
	if _, err := pods.Create(ctx, p("third", "3", nil), metav1.CreateOptions{}); err != nil {
		t.Fatalf("pod that fits: %v", err)
	}
	// A quota merely living in a namespace binds none of its pods: the
	// quotas namespace holds every quota, and a big pod there is admitted.
	if _, err := e.Client.CoreV1().Pods(e.quotas).Create(ctx, p("big", "50", nil), dryRun); err != nil {
		t.Fatalf("pod in the quotas' own namespace: %v", err)
	}

	// Pod UPDATE: the preemptible label is immutable; other labels are not.
	first.Labels[eqPrefix+"preemptible"] = "false"
	_, err = pods.Update(ctx, first, metav1.UpdateOptions{})
	wantQuotaDenial(t, err, "Preemptible label is forbidden modify now.")
	first, _ = pods.Get(ctx, "first", metav1.GetOptions{})
	first.Labels["team"] = "x"
	if _, err := pods.Update(ctx, first, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("label update: %v", err)
	}

	// is-parent cannot become true while pods are bound.
	cur, err := eq.Get(ctx, leaf, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	l := cur.GetLabels()
	l[eqPrefix+"is-parent"] = "true"
	cur.SetLabels(l)
	_, err = eq.Update(ctx, cur, metav1.UpdateOptions{})
	wantQuotaDenial(t, err, "quota has bound pods, isParent is forbidden to modify as true, quotaName: "+leaf)

	// A pod labelled with the quota's name (requesting nothing, as the
	// quota is full) blocks deleting it, even once
	// finished (quota_topology.go:181-202 lists every labelled pod).
	labelled, err := e.Client.CoreV1().Pods(e.plain).Create(ctx, p("labelled", "0", map[string]string{eqPrefix + "name": leaf}), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	labelled.Status.Phase = corev1.PodSucceeded
	if _, err := e.Client.CoreV1().Pods(e.plain).UpdateStatus(ctx, labelled, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(ctx, t, func(ctx context.Context) error {
		err := eq.Delete(ctx, leaf, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
		return denialContaining(err, "delete quota failed, quota "+leaf+" has 1 child pods: labelled")
	})
	if err := e.Client.CoreV1().Pods(e.plain).Delete(ctx, "labelled", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	// Pods bound through the namespaces annotation do not block it.
	eventually(ctx, t, func(ctx context.Context) error {
		return eq.Delete(ctx, leaf, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
	})
}
