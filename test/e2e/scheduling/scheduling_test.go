package scheduling

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/kadmit/kadmit/test/e2e/e2eenv"
	"github.com/kadmit/kadmit/test/poll"
)

var (
	localQueueGVR   = schema.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta1", Resource: "localqueues"}
	flavorGVR       = schema.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta1", Resource: "resourceflavors"}
	elasticQuotaGVR = schema.GroupVersionResource{Group: "scheduling.sigs.k8s.io", Version: "v1alpha1", Resource: "elasticquotas"}
)

const (
	queueLabel = "kueue.x-k8s.io/queue-name"
	eqPrefix   = "quota.scheduling.koordinator.sh/"
)

var dryRun = metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}

func newJob(name string, labels map[string]string, parallelism int32, cpu string) *batchv1.Job {
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: batchv1.JobSpec{
			Parallelism: &parallelism,
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				Containers: []corev1.Container{{Name: "work", Image: "registry.k8s.io/pause:3.10",
					Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu)}}}},
			}},
		},
	}
}

// wantDenied fails unless err is an admission denial whose message
// contains msg.
func wantDenied(t *testing.T, err error, msg string) {
	t.Helper()
	if err == nil {
		t.Fatalf("admitted, want denial containing %q", msg)
	}
	if !strings.Contains(err.Error(), msg) {
		t.Fatalf("error %q, want it to contain %q", err, msg)
	}
}

func TestJobGetsDefaultQueueAndIsSuspended(t *testing.T) {
	e := world(t)
	ctx := e2eenv.TestCtx(t, time.Minute)
	got, err := e.Client.BatchV1().Jobs(e.jobs).Create(ctx, newJob("plain", nil, 2, "1"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Labels[queueLabel] != "main" || got.Labels["kueue.x-k8s.io/managed"] != "true" || got.Spec.Suspend == nil || !*got.Spec.Suspend {
		t.Fatalf("stored job labels %v suspend %v", got.Labels, got.Spec.Suspend)
	}
}

func TestJobOverQueueQuotaIsDenied(t *testing.T) {
	e := world(t)
	ctx := e2eenv.TestCtx(t, time.Minute)
	// Per pod: max(init 3, container 1) = 3 cpu; 2 pods = 6 > 4.
	j := newJob("too-big", nil, 2, "1")
	j.Spec.Template.Spec.InitContainers = []corev1.Container{{Name: "init", Image: "registry.k8s.io/pause:3.10",
		Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("3")}}}}
	_, err := e.Client.BatchV1().Jobs(e.jobs).Create(ctx, j, metav1.CreateOptions{})
	wantDenied(t, err, `job requests cpu 6 (2 pods × 3), more than queue "main" quota of 4`)
	if !apierrors.IsForbidden(err) {
		t.Fatalf("code: %v", err)
	}
}

func TestJobQueueMustExistAsLocalQueue(t *testing.T) {
	e := world(t)
	ctx := e2eenv.TestCtx(t, time.Minute)
	jobs := e.Client.BatchV1().Jobs(e.jobs)
	_, err := jobs.Create(ctx, newJob("lq-job", map[string]string{queueLabel: "team-lq"}, 1, "1"), dryRun)
	wantDenied(t, err, `queue "team-lq" does not exist in namespace "`+e.jobs+`"`)

	lq := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue",
		"metadata": map[string]any{"name": "team-lq"}, "spec": map[string]any{"clusterQueue": "cq"},
	}}
	if _, err := e.dyn.Resource(localQueueGVR).Namespace(e.jobs).Create(ctx, lq, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// kadmit's informer sees the LocalQueue shortly after.
	if err := poll.Until(ctx, cacheWait, func(ctx context.Context) error {
		_, err := jobs.Create(ctx, newJob("lq-job", map[string]string{queueLabel: "team-lq"}, 1, "1"), metav1.CreateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	// A malformed queue name never reaches kadmit's validator: the API
	// server's own label validation refuses it first (the policy's check is
	// for offline review and is unit-tested).
}

func TestJobQueueNameChangesOnlyWhileSuspended(t *testing.T) {
	e := world(t)
	ctx := e2eenv.TestCtx(t, time.Minute)
	jobs := e.Client.BatchV1().Jobs(e.jobs)
	j, err := jobs.Create(ctx, newJob("moves", nil, 1, "1"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Suspended (kadmit set it): the queue may change.
	j.Labels[queueLabel] = "spare"
	if j, err = jobs.Update(ctx, j, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// What Kueue's controller does on admission: unsuspend.
	f := false
	j.Spec.Suspend = &f
	if j, err = jobs.Update(ctx, j, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	j.Labels[queueLabel] = "main"
	_, err = jobs.Update(ctx, j, metav1.UpdateOptions{})
	wantDenied(t, err, `metadata.labels[kueue.x-k8s.io/queue-name]: Invalid value: "main": field is immutable`)
	stored, err := jobs.Get(ctx, "moves", metav1.GetOptions{})
	if err != nil || stored.Labels[queueLabel] != "spare" {
		t.Fatalf("stored %v, %v", stored.Labels, err)
	}
}

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

func TestElasticQuotaTreeAndPods(t *testing.T) {
	e := world(t)
	ctx := e2eenv.TestCtx(t, 3*time.Minute)
	eq := e.dyn.Resource(elasticQuotaGVR).Namespace(e.quotas)
	org := "org-" + e.suffix
	teamA, teamB := "team-a-"+e.suffix, "team-b-"+e.suffix

	if _, err := eq.Create(ctx, quota(org, e.quotas, map[string]string{eqPrefix + "is-parent": "true", eqPrefix + "tree-id": "t1"}, nil,
		cpu("10"), cpu("20")), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The child is created once kadmit's cache knows its parent.
	var a *unstructured.Unstructured
	claims, _ := json.Marshal([]string{e.podsNS})
	if err := poll.Until(ctx, cacheWait, func(ctx context.Context) error {
		var err error
		a, err = eq.Create(ctx, quota(teamA, e.quotas, map[string]string{eqPrefix + "parent": org}, map[string]string{eqPrefix + "namespaces": string(claims)},
			cpu("4"), cpu("8")), metav1.CreateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	// Defaults: tree-id from the parent, shared-weight = max.
	if a.GetLabels()[eqPrefix+"tree-id"] != "t1" || a.GetAnnotations()[eqPrefix+"shared-weight"] != `{"cpu":"8"}` {
		t.Fatalf("team-a labels %v annotations %v", a.GetLabels(), a.GetAnnotations())
	}
	top, err := eq.Create(ctx, quota("top-"+e.suffix, e.quotas, nil, nil, nil, cpu("1")), metav1.CreateOptions{})
	if err != nil || top.GetLabels()[eqPrefix+"parent"] != "koordinator-root-quota" {
		t.Fatalf("top-level quota: %v %v", top, err)
	}

	// A dry run that fits changes nothing: afterwards a real sibling that
	// only fits if the dry run left no trace is admitted.
	waitQuota := func(name string) {
		t.Helper()
		// Until kadmit's cache has team-a, siblings would be checked
		// against a parent with no children; probe with a sibling that only
		// fails when team-a's min is counted.
		if err := poll.Until(ctx, cacheWait, func(ctx context.Context) error {
			_, err := eq.Create(ctx, quota("probe", e.quotas, map[string]string{eqPrefix + "parent": org}, nil, cpu("7"), cpu("8")), dryRun)
			if err == nil {
				return fmt.Errorf("%s not in kadmit's cache yet", name)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	waitQuota(teamA)
	_, err = eq.Create(ctx, quota(teamB, e.quotas, map[string]string{eqPrefix + "parent": org}, nil, cpu("7"), cpu("8")), dryRun)
	wantDenied(t, err, "the min cpu of "+org+"'s children would sum to 11, more than its min 10")
	if _, err := eq.Create(ctx, quota("dry", e.quotas, map[string]string{eqPrefix + "parent": org}, nil, cpu("6"), cpu("8")), dryRun); err != nil {
		t.Fatal(err)
	}
	if _, err := eq.Create(ctx, quota(teamB, e.quotas, map[string]string{eqPrefix + "parent": org}, nil, cpu("6"), cpu("8")), metav1.CreateOptions{}); err != nil {
		t.Fatalf("sibling after a dry run: %v", err)
	}

	_, err = eq.Create(ctx, quota("x-"+e.suffix, e.quotas, map[string]string{eqPrefix + "parent": org}, nil, map[string]any{"memory": "1Gi"}, cpu("2")), dryRun)
	wantDenied(t, err, "spec.min.memory has no matching spec.max.memory")
	_, err = eq.Create(ctx, quota("y-"+e.suffix, e.quotas, map[string]string{eqPrefix + "parent": "missing"}, nil, nil, cpu("2")), dryRun)
	wantDenied(t, err, `parent ElasticQuota "missing" does not exist`)
	_, err = eq.Create(ctx, quota("z-"+e.suffix, e.quotas, nil, map[string]string{eqPrefix + "namespaces": string(claims)}, nil, cpu("2")), dryRun)
	wantDenied(t, err, "is already claimed by ElasticQuota "+teamA)

	// Pods in the claimed namespace count against team-a's max of 8 cpu.
	pods := e.Client.CoreV1().Pods(e.podsNS)
	p := func(name, c string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "c", Image: "registry.k8s.io/pause:3.10",
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(c)}}}}}}
	}
	if _, err := pods.Create(ctx, p("first", "5"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := poll.Until(ctx, cacheWait, func(ctx context.Context) error {
		_, err := pods.Create(ctx, p("second", "4"), dryRun)
		if err == nil {
			return fmt.Errorf("pod first not counted yet")
		}
		if !strings.Contains(err.Error(), "pod requests cpu 4 but ElasticQuota "+teamA+" has 5 of max 8 in use") {
			return fmt.Errorf("unexpected error: %w", err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := pods.Create(ctx, p("third", "3"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("pod that fits: %v", err)
	}

	// Deletion guards.
	err = eq.Delete(ctx, org, metav1.DeleteOptions{})
	wantDenied(t, err, "ElasticQuota "+org+" has 2 child quota(s) ("+teamA+", "+teamB+")")
	if err := poll.Until(ctx, cacheWait, func(ctx context.Context) error {
		err := eq.Delete(ctx, teamA, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
		if err == nil || !strings.Contains(err.Error(), "has 2 bound pod(s) ("+e.podsNS+"/first, "+e.podsNS+"/third)") {
			return fmt.Errorf("delete team-a: %v", err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// is-parent cannot drop while children exist; tree-id is immutable.
	cur, err := eq.Get(ctx, org, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	l := cur.GetLabels()
	l[eqPrefix+"is-parent"] = "false"
	cur.SetLabels(l)
	_, err = eq.Update(ctx, cur, metav1.UpdateOptions{})
	wantDenied(t, err, "cannot be false while it has children")
	cur, _ = eq.Get(ctx, org, metav1.GetOptions{})
	l = cur.GetLabels()
	l[eqPrefix+"tree-id"] = "t2"
	cur.SetLabels(l)
	_, err = eq.Update(ctx, cur, metav1.UpdateOptions{})
	wantDenied(t, err, "tree-id is immutable")

	// The built-in root quota cannot be deleted.
	root, err := e.dyn.Resource(elasticQuotaGVR).Namespace(e.quotas).Create(ctx, quota("koordinator-root-quota", e.quotas, nil, nil, nil, cpu("1000")), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	err = eq.Delete(ctx, root.GetName(), metav1.DeleteOptions{})
	wantDenied(t, err, "is built in and cannot be deleted")
}

func TestColocationProfile(t *testing.T) {
	e := world(t)
	ctx := e2eenv.TestCtx(t, time.Minute)
	mk := func() *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "batch", Labels: map[string]string{"qos": "be"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}}}
	}
	got, err := e.Client.CoreV1().Pods(e.mixed).Create(ctx, mk(), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	hasTol := false
	for _, tol := range got.Spec.Tolerations {
		hasTol = hasTol || tol.Key == "colocation"
	}
	if got.Labels["koordinator.sh/qosClass"] != "BE" || got.Spec.SchedulerName != "koord-scheduler" ||
		got.Spec.NodeSelector["node-pool"] != "mixed" || !hasTol || got.Annotations["kadmit.io/colocation-profiles"] != "batch" {
		t.Fatalf("stored pod: labels %v scheduler %q nodeSelector %v tolerations %v annotations %v",
			got.Labels, got.Spec.SchedulerName, got.Spec.NodeSelector, got.Spec.Tolerations, got.Annotations)
	}
	plain, err := e.Client.CoreV1().Pods(e.plain).Create(ctx, mk(), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if plain.Spec.SchedulerName != corev1.DefaultSchedulerName || plain.Labels["koordinator.sh/qosClass"] != "" {
		t.Fatalf("pod outside the profile's namespaces changed: %v %q", plain.Labels, plain.Spec.SchedulerName)
	}
}

func TestKadmitConfigMapIsValidated(t *testing.T) {
	e := world(t)
	ctx := e2eenv.TestCtx(t, time.Minute)
	cms := e.Client.CoreV1().ConfigMaps(e.config)
	good := "apiVersion: kadmit.io/v1alpha1\nkind: Configuration\npolicies:\n  lifespan: {max: 7}\n"
	cm, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kadmit"}, Data: map[string]string{"config.yaml": good}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data["config.yaml"] = "apiVersion: kadmit.io/v1alpha1\nkind: Configuration\npolicies:\n  lifespan: {max: -1}\n"
	_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
	wantDenied(t, err, "ConfigMap "+e.config+"/kadmit data[config.yaml]: invalid kadmit configuration: policies.lifespan.max:")
	stored, err := cms.Get(ctx, "kadmit", metav1.GetOptions{})
	if err != nil || stored.Data["config.yaml"] != good {
		t.Fatalf("stored config changed: %v %v", stored.Data, err)
	}
	// Another ConfigMap with the same bad text is none of kadmit's business.
	if _, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "other"}, Data: map[string]string{"config.yaml": "junk: ["}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}
