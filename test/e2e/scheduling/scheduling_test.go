package scheduling

import (
	"context"
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
