package jobqueue

// The tables below carry over the cases of Kueue v0.13.0's
// pkg/controller/jobs/job/job_webhook_test.go (TestValidateCreate :67,
// TestValidateUpdate :410, TestDefault :704): each case's input job and
// expected field errors or defaulted job, run through kadmit's webhook.
// Cases for alpha feature gates that are off in v0.13.0
// (TopologyAwareScheduling, MultiKueueBatchJobWithManagedBy,
// ElasticJobsViaWorkloadSlices) are not carried over: kadmit does not
// re-create those rules (docs/policies.md).

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/kadmit/kadmit/internal/admission"
)

// jobB builds a batch/v1 Job as Kueue's testingjobs.MakeJob does
// (pkg/util/testingjobs/job/wrappers.go at v0.13.0): parallelism 1,
// suspended, one container.
type jobB struct{ batchv1.Job }

func mkJob(name, ns string) *jobB {
	one, yes := int32(1), true
	return &jobB{batchv1.Job{
		TypeMeta:   metav1.TypeMeta{APIVersion: "batch/v1", Kind: "Job"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: map[string]string{}},
		Spec: batchv1.JobSpec{Parallelism: &one, Suspend: &yes, Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{{Name: "c", Image: "pause"}},
		}}},
	}}
}

func (b *jobB) label(k, v string) *jobB {
	if b.Labels == nil {
		b.Labels = map[string]string{}
	}
	b.Labels[k] = v
	return b
}
func (b *jobB) queue(q string) *jobB       { return b.label(QueueLabel, q) }
func (b *jobB) annotate(k, v string) *jobB { b.Annotations[k] = v; return b }
func (b *jobB) suspend(s bool) *jobB       { b.Spec.Suspend = &s; return b }
func (b *jobB) parallelism(n int32) *jobB  { b.Spec.Parallelism = &n; return b }
func (b *jobB) completions(n int32) *jobB  { b.Spec.Completions = &n; return b }
func (b *jobB) owner(apiVersion, kind string) *jobB {
	yes := true
	b.OwnerReferences = append(b.OwnerReferences, metav1.OwnerReference{APIVersion: apiVersion, Kind: kind, Name: "owner", UID: "owner", Controller: &yes})
	return b
}
func (b *jobB) indexed(on bool) *jobB {
	m := batchv1.NonIndexedCompletion
	if on {
		m = batchv1.IndexedCompletion
	}
	b.Spec.CompletionMode = &m
	return b
}
func (b *jobB) raw(t *testing.T) string {
	t.Helper()
	out, err := json.Marshal(&b.Job)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// rfc1123 is IsDNS1123Subdomain's message for "queue name", as Kueue's
// test's invalidRFC1123Message.
const rfc1123 = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"

var (
	tQueueLabel   = field.NewPath("metadata", "labels").Key(QueueLabel)
	tQueueAnnot   = field.NewPath("metadata", "annotations").Key(QueueAnnotation)
	tPrebuilt     = field.NewPath("metadata", "labels").Key(PrebuiltWorkloadLabel)
	tMaxExec      = field.NewPath("metadata", "labels").Key(MaxExecTimeSecondsLabel)
	tPriority     = field.NewPath("metadata", "labels").Key(WorkloadPriorityClassLabel)
	tMinParallel  = field.NewPath("metadata", "annotations").Key(MinParallelismAnnotation)
	tSyncComplete = field.NewPath("metadata", "annotations").Key(CompletionsEqualParallelismAnnotation)
)

// wantVerdict checks v against Kueue's answer for errs: allowed when none,
// else 403 with ErrorList.ToAggregate's message (controller-runtime's
// admission.Denied for a CustomValidator error).
func wantVerdict(t *testing.T, v admission.Verdict, errs field.ErrorList) {
	t.Helper()
	if len(errs) == 0 {
		if !v.Allowed {
			t.Fatalf("denied: %d %s", v.Code, v.Message)
		}
		return
	}
	want := errs.ToAggregate().Error()
	if v.Allowed || v.Code != http.StatusForbidden || v.Reason != metav1.StatusReasonForbidden || v.Message != want {
		t.Fatalf("verdict %d %s %q\nwant 403 Forbidden %q", v.Code, v.Reason, v.Message, want)
	}
}

func TestUpstreamValidateCreate(t *testing.T) {
	p := must(t, DefaultConfig(), Options{})
	for _, tc := range []struct {
		name string
		job  *jobB
		want field.ErrorList
	}{
		{"simple", mkJob("job", "default").queue("queue"), nil},
		{"invalid queue-name label", mkJob("job", "default").queue("queue name"),
			field.ErrorList{field.Invalid(tQueueLabel, "queue name", rfc1123)}},
		{"invalid queue-name annotation (deprecated)", mkJob("job", "default").annotate(QueueAnnotation, "queue name"),
			field.ErrorList{field.Invalid(tQueueAnnot, "queue name", rfc1123)}},
		{"invalid partial admission annotation (format)", mkJob("job", "default").parallelism(4).completions(6).annotate(MinParallelismAnnotation, "NaN"),
			field.ErrorList{field.Invalid(tMinParallel, "NaN", `strconv.Atoi: parsing "NaN": invalid syntax`)}},
		{"invalid partial admission annotation (badValue)", mkJob("job", "default").parallelism(4).completions(6).annotate(MinParallelismAnnotation, "5"),
			field.ErrorList{field.Invalid(tMinParallel, 5, "should be between 0 and 3")}},
		{"valid partial admission annotation", mkJob("job", "default").parallelism(4).completions(6).annotate(MinParallelismAnnotation, "3"), nil},
		{"invalid sync completions annotation (format)", mkJob("job", "default").parallelism(4).completions(6).annotate(CompletionsEqualParallelismAnnotation, "-").indexed(true),
			field.ErrorList{field.Invalid(tSyncComplete, "-", `strconv.ParseBool: parsing "-": invalid syntax`)}},
		{"valid sync completions annotation, wrong completions count", mkJob("job", "default").parallelism(4).completions(6).annotate(CompletionsEqualParallelismAnnotation, "true").indexed(true),
			field.ErrorList{field.Invalid(field.NewPath("spec", "completions"), new(int32(6)), "should be equal to parallelism when "+CompletionsEqualParallelismAnnotation+" is annotation is true")}},
		{"valid sync completions annotation, wrong job completions type (default)", mkJob("job", "default").parallelism(4).completions(4).annotate(CompletionsEqualParallelismAnnotation, "true"),
			field.ErrorList{field.Invalid(tSyncComplete, "true", "should not be enabled for NonIndexed jobs")}},
		{"valid sync completions annotation, wrong job completions type", mkJob("job", "default").parallelism(4).completions(4).annotate(CompletionsEqualParallelismAnnotation, "true").indexed(false),
			field.ErrorList{field.Invalid(tSyncComplete, "true", "should not be enabled for NonIndexed jobs")}},
		{"valid sync completions annotation", mkJob("job", "default").parallelism(4).completions(4).annotate(CompletionsEqualParallelismAnnotation, "true").indexed(true), nil},
		{"invalid prebuilt workload", mkJob("job", "default").parallelism(4).completions(4).label(PrebuiltWorkloadLabel, "workload name").indexed(true),
			field.ErrorList{field.Invalid(tPrebuilt, "workload name", rfc1123)}},
		{"valid prebuilt workload", mkJob("job", "default").parallelism(4).completions(4).label(PrebuiltWorkloadLabel, "workload-name").indexed(true), nil},
		{"invalid maximum execution time", mkJob("job", "default").parallelism(4).completions(4).label(MaxExecTimeSecondsLabel, "NaN").indexed(true),
			field.ErrorList{field.Invalid(tMaxExec, "NaN", `strconv.Atoi: parsing "NaN": invalid syntax`)}},
		{"zero maximum execution time", mkJob("job", "default").parallelism(4).completions(4).label(MaxExecTimeSecondsLabel, "0").indexed(true),
			field.ErrorList{field.Invalid(tMaxExec, 0, "should be greater than 0")}},
		{"negative maximum execution time", mkJob("job", "default").parallelism(4).completions(4).label(MaxExecTimeSecondsLabel, "-10").indexed(true),
			field.ErrorList{field.Invalid(tMaxExec, -10, "should be greater than 0")}},
		{"valid maximum execution time", mkJob("job", "default").parallelism(4).completions(4).label(MaxExecTimeSecondsLabel, "10").indexed(true), nil},
		// kadmit's own cases for the same rules.
		{"several errors are aggregated", mkJob("job", "default").queue("Q").label(MaxExecTimeSecondsLabel, "0"),
			field.ErrorList{field.Invalid(tQueueLabel, "Q", rfc1123), field.Invalid(tMaxExec, 0, "should be greater than 0")}},
		{"empty queue-name label", mkJob("job", "default").queue(""),
			field.ErrorList{field.Invalid(tQueueLabel, "", rfc1123)}},
		{"completions-equal-parallelism false needs nothing", mkJob("job", "default").parallelism(4).annotate(CompletionsEqualParallelismAnnotation, "false"), nil},
		{"min-parallelism 1 of a single pod", mkJob("job", "default").annotate(MinParallelismAnnotation, "1"),
			field.ErrorList{field.Invalid(tMinParallel, 1, "should be between 0 and 0")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := p.Validate(context.Background(), req(admissionv1.Create, "default", tc.job.raw(t), ""))
			wantVerdict(t, v, tc.want)
		})
	}
}

func TestUpstreamValidateUpdate(t *testing.T) {
	p := must(t, DefaultConfig(), Options{})
	for _, tc := range []struct {
		name     string
		old, new *jobB
		want     field.ErrorList
	}{
		{"normal update", mkJob("job", "default").queue("queue"), mkJob("job", "default").queue("queue").suspend(false), nil},
		{"add queue name with suspend is false", mkJob("job", "default"), mkJob("job", "default").queue("queue").suspend(false),
			field.ErrorList{field.Invalid(tQueueLabel, "queue", apivalidation.FieldImmutableErrorMsg)}},
		{"add queue name with suspend is true", mkJob("job", "default"), mkJob("job", "default").queue("queue").suspend(true), nil},
		{"change queue name with suspend is false", mkJob("job", "default").queue("queue"), mkJob("job", "default").queue("queue2").suspend(false),
			field.ErrorList{field.Invalid(tQueueLabel, "queue2", apivalidation.FieldImmutableErrorMsg)}},
		{"change queue name with suspend is true", mkJob("job", "default"), mkJob("job", "default").queue("queue").suspend(true), nil},
		{"change queue name with suspend is true, but invalid value", mkJob("job", "default"), mkJob("job", "default").queue("queue name").suspend(true),
			field.ErrorList{field.Invalid(tQueueLabel, "queue name", rfc1123)}},
		{"immutable parallelism while unsuspended with partial admission enabled",
			mkJob("job", "default").suspend(false).parallelism(4).completions(6).annotate(MinParallelismAnnotation, "3"),
			mkJob("job", "default").suspend(false).parallelism(5).completions(6).annotate(MinParallelismAnnotation, "3"),
			field.ErrorList{field.Forbidden(field.NewPath("spec", "parallelism"), "cannot change when partial admission is enabled and the job is not suspended")}},
		{"mutable parallelism while suspended with partial admission enabled",
			mkJob("job", "default").parallelism(4).completions(6).annotate(MinParallelismAnnotation, "3").annotate(StoppingAnnotation, "true"),
			mkJob("job", "default").parallelism(5).completions(6).annotate(MinParallelismAnnotation, "3"), nil},
		{"immutable sync completion annotation while unsuspended",
			mkJob("job", "default").suspend(false).parallelism(4).completions(6).annotate(CompletionsEqualParallelismAnnotation, "true"),
			mkJob("job", "default").suspend(false).parallelism(5).completions(6).annotate(CompletionsEqualParallelismAnnotation, "false"),
			field.ErrorList{field.Forbidden(tSyncComplete, apivalidation.FieldImmutableErrorMsg+" while the job is not suspended")}},
		{"mutable sync completion annotation while suspended",
			mkJob("job", "default").suspend(true).parallelism(4).completions(6).annotate(CompletionsEqualParallelismAnnotation, "true"),
			mkJob("job", "default").suspend(false).parallelism(5).completions(6).annotate(CompletionsEqualParallelismAnnotation, "false"), nil},
		{"workloadPriorityClassName is mutable when job is suspended",
			mkJob("job", "default").label(WorkloadPriorityClassLabel, "test-1"), mkJob("job", "default").label(WorkloadPriorityClassLabel, "test-2"), nil},
		{"workloadPriorityClassName is immutable when job is running",
			mkJob("job", "default").label(WorkloadPriorityClassLabel, "test-1").suspend(false), mkJob("job", "default").label(WorkloadPriorityClassLabel, "test-2").suspend(false),
			field.ErrorList{field.Invalid(tPriority, "test-2", apivalidation.FieldImmutableErrorMsg)}},
		{"immutable prebuilt workload",
			mkJob("job", "default").suspend(true).label(PrebuiltWorkloadLabel, "old-workload"),
			mkJob("job", "default").suspend(false).label(PrebuiltWorkloadLabel, "new-workload"),
			field.ErrorList{field.Invalid(tPrebuilt, "new-workload", apivalidation.FieldImmutableErrorMsg)}},
		{"immutable queue name not suspend",
			mkJob("job", "default").suspend(false).queue("old-queue"), mkJob("job", "default").suspend(false).queue("new-queue"),
			field.ErrorList{field.Invalid(tQueueLabel, "new-queue", apivalidation.FieldImmutableErrorMsg)}},
		{"queue name can changes when it is suspend",
			mkJob("job", "default").suspend(true).queue("old-queue"), mkJob("job", "default").suspend(true).queue("new-queue"), nil},
		{"can update the job-min-parallelism annotation",
			mkJob("job", "default").parallelism(4).completions(6).annotate(MinParallelismAnnotation, "3"),
			mkJob("job", "default").parallelism(4).completions(6).annotate(MinParallelismAnnotation, "2"), nil},
		{"validates job-min-parallelism annotation value (bad format)",
			mkJob("job", "default").parallelism(4).completions(6).annotate(MinParallelismAnnotation, "3"),
			mkJob("job", "default").parallelism(4).completions(6).annotate(MinParallelismAnnotation, "NaN"),
			field.ErrorList{field.Invalid(tMinParallel, "NaN", `strconv.Atoi: parsing "NaN": invalid syntax`)}},
		{"immutable max exec time while unsuspended",
			mkJob("job", "default").suspend(false).label(MaxExecTimeSecondsLabel, "10"), mkJob("job", "default").suspend(false).label(MaxExecTimeSecondsLabel, "20"),
			field.ErrorList{field.Invalid(tMaxExec, "20", apivalidation.FieldImmutableErrorMsg)}},
		{"immutable max exec time while transitioning to unsuspended",
			mkJob("job", "default").suspend(true).label(MaxExecTimeSecondsLabel, "10"), mkJob("job", "default").suspend(false).label(MaxExecTimeSecondsLabel, "20"),
			field.ErrorList{field.Invalid(tMaxExec, "20", apivalidation.FieldImmutableErrorMsg)}},
		{"mutable max exec time while suspended",
			mkJob("job", "default").suspend(true).label(MaxExecTimeSecondsLabel, "10"), mkJob("job", "default").suspend(true).label(MaxExecTimeSecondsLabel, "20"), nil},
		// kadmit's own cases: the rule reads the NEW job's suspend only
		// (issue 12: kadmit used to require the old job suspended too).
		{"queue set while being unsuspended is refused",
			mkJob("job", "default").suspend(true).queue("a"), mkJob("job", "default").suspend(false).queue("b"),
			field.ErrorList{field.Invalid(tQueueLabel, "b", apivalidation.FieldImmutableErrorMsg)}},
		{"queue changed in the update that suspends a running job",
			mkJob("job", "default").suspend(false).queue("a"), mkJob("job", "default").suspend(true).queue("b"), nil},
		{"stopping job counts as running",
			mkJob("job", "default").queue("a"), mkJob("job", "default").queue("b").annotate(StoppingAnnotation, "true"),
			field.ErrorList{field.Invalid(tQueueLabel, "b", apivalidation.FieldImmutableErrorMsg)}},
		{"deprecated annotation counts as the queue name",
			mkJob("job", "default").suspend(false).annotate(QueueAnnotation, "a"), mkJob("job", "default").suspend(false).annotate(QueueAnnotation, "b"),
			field.ErrorList{field.Invalid(tQueueLabel, "b", apivalidation.FieldImmutableErrorMsg)}},
		{"priority class removed from a suspended job",
			mkJob("job", "default").label(WorkloadPriorityClassLabel, "p"), mkJob("job", "default"),
			field.ErrorList{field.Invalid(tPriority, "", apivalidation.FieldImmutableErrorMsg)}},
		{"prebuilt workload checked twice while suspended",
			mkJob("job", "default"), mkJob("job", "default").label(PrebuiltWorkloadLabel, "bad name"),
			field.ErrorList{field.Invalid(tPrebuilt, "bad name", rfc1123), field.Invalid(tPrebuilt, "bad name", rfc1123)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := p.Validate(context.Background(), req(admissionv1.Update, "default", tc.new.raw(t), tc.old.raw(t)))
			wantVerdict(t, v, tc.want)
		})
	}
}

// TestUpstreamValidateUpdateDefaultQueue is validateUpdateForQueueName's
// LocalQueueDefaulting rule (jobframework/validation.go:128-132).
func TestUpstreamValidateUpdateDefaultQueue(t *testing.T) {
	old := mkJob("job", "ns").queue("default")
	removed := mkJob("job", "ns")
	want := field.ErrorList{field.Invalid(tQueueLabel, "", "queue-name must not be empty in namespace with default queue")}
	p := must(t, DefaultConfig(), Options{LocalQueues: fakeLQ{"ns/default": true}})
	wantVerdict(t, p.Validate(context.Background(), req(admissionv1.Update, "ns", removed.raw(t), old.raw(t))), want)
	// No default LocalQueue, or the gate off: allowed.
	p = must(t, DefaultConfig(), Options{LocalQueues: fakeLQ{}})
	wantVerdict(t, p.Validate(context.Background(), req(admissionv1.Update, "ns", removed.raw(t), old.raw(t))), nil)
	off := false
	p = must(t, Config{LocalQueueDefaulting: &off}, Options{LocalQueues: fakeLQ{"ns/default": true}})
	wantVerdict(t, p.Validate(context.Background(), req(admissionv1.Update, "ns", removed.raw(t), old.raw(t))), nil)
}

// TestUpstreamDefault carries over TestDefault's cases: the job after
// Kueue's defaulting.
func TestUpstreamDefault(t *testing.T) {
	for name, tc := range map[string]struct {
		job            *jobB
		cfg            Config
		defaultLqExist bool
		want           *jobB
	}{
		"update the suspend field with 'manageJobsWithoutQueueName=false'": {
			job: mkJob("job", "default").queue("queue").suspend(false), want: mkJob("job", "default").queue("queue")},
		"update the suspend field 'manageJobsWithoutQueueName=true'": {
			job: mkJob("job", "default").suspend(false), cfg: Config{ManageJobsWithoutQueueName: true,
				ManagedJobsNamespaceSelector: &metav1.LabelSelector{}}, want: mkJob("job", "default")},
		"no change in managed by: features.MultiKueueBatchJobWithManagedBy disabled": {
			job: mkJob("job", "default").queue("queue").suspend(false), want: mkJob("job", "default").queue("queue")},
		"invalid queue name": {
			job: mkJob("job", "default").queue("invalid-local-queue").suspend(false), want: mkJob("job", "default").queue("invalid-local-queue")},
		"LocalQueueDefaulting enabled, default lq is created, job doesn't have queue label": {
			defaultLqExist: true, job: mkJob("test-job", "default"), want: mkJob("test-job", "default").queue("default")},
		"LocalQueueDefaulting enabled, default lq is created, job has queue label": {
			defaultLqExist: true, job: mkJob("test-job", "default").queue("test-queue"), want: mkJob("test-job", "default").queue("test-queue")},
		"LocalQueueDefaulting enabled, default lq isn't created, job doesn't have queue label": {
			job: mkJob("test-job", "default"), want: mkJob("test-job", "default")},
		"LocalQueueDefaulting enabled, job is managed by Kueue managed owner, job doesn't have queue label": {
			defaultLqExist: true, cfg: Config{Frameworks: []string{"batch/job", "kubeflow.org/mpijob"}},
			job:  mkJob("test-job", "default").owner("kubeflow.org/v2beta1", "MPIJob"),
			want: mkJob("test-job", "default").owner("kubeflow.org/v2beta1", "MPIJob")},
		"LocalQueueDefaulting enabled, job is managed by non Kueue managed owner, job has queue label": {
			defaultLqExist: true,
			job:            mkJob("test-job", "default").owner("jobset.x-k8s.io/v1alpha2", "JobSet"),
			want:           mkJob("test-job", "default").owner("jobset.x-k8s.io/v1alpha2", "JobSet").queue("default")},
		// kadmit's own cases.
		"LocalQueueDefaulting off": {
			defaultLqExist: true, cfg: Config{LocalQueueDefaulting: new(false)}, job: mkJob("j", "default").suspend(false), want: mkJob("j", "default").suspend(false)},
		"empty queue label is defaulted": {
			defaultLqExist: true, job: mkJob("j", "default").queue("").suspend(false), want: mkJob("j", "default").queue("default")},
		"deprecated annotation is a queue name": {
			defaultLqExist: true, job: mkJob("j", "default").annotate(QueueAnnotation, "q").suspend(false), want: mkJob("j", "default").annotate(QueueAnnotation, "q")},
		"job owned by a Job is not suspended": {
			job: mkJob("j", "default").queue("q").suspend(false).owner("batch/v1", "Job"), want: mkJob("j", "default").queue("q").suspend(false).owner("batch/v1", "Job")},
		"no queue, not managed without queue name": {
			job: mkJob("j", "default").suspend(false), want: mkJob("j", "default").suspend(false)},
		"default selector leaves kube-system jobs alone": {
			cfg: Config{ManageJobsWithoutQueueName: true}, job: mkJob("j", "kube-system").suspend(false), want: mkJob("j", "kube-system").suspend(false)},
		"default selector suspends other namespaces' jobs": {
			cfg: Config{ManageJobsWithoutQueueName: true}, job: mkJob("j", "default").suspend(false), want: mkJob("j", "default")},
		"suspend off (kadmit)": {
			cfg: Config{Suspend: new(false)}, job: mkJob("j", "default").queue("q").suspend(false), want: mkJob("j", "default").queue("q").suspend(false)},
		"managed label (kadmit)": {
			cfg: Config{ManagedLabel: true}, job: mkJob("j", "default").queue("q"), want: mkJob("j", "default").queue("q").label(ManagedLabel, "true")},
		"configured default queue (kadmit)": {
			cfg: Config{DefaultQueues: map[string]string{"default": "main"}}, job: mkJob("j", "default").suspend(false), want: mkJob("j", "default").queue("main")},
		"default LocalQueue wins over a configured default queue": {
			defaultLqExist: true, cfg: Config{DefaultQueues: map[string]string{"default": "main"}}, job: mkJob("j", "default").suspend(false), want: mkJob("j", "default").queue("default")},
	} {
		t.Run(name, func(t *testing.T) {
			lq := fakeLQ{}
			if tc.defaultLqExist {
				lq["default/default"] = true
			}
			p := must(t, tc.cfg, Options{LocalQueues: lq, Namespaces: fakeNS{"default": {}, "kube-system": {}}})
			out, v := mutate(t, p, req(admissionv1.Create, tc.job.Namespace, tc.job.raw(t), ""))
			if !v.Allowed {
				t.Fatalf("denied: %+v", v)
			}
			if out == nil {
				out = []byte(tc.job.raw(t))
			}
			var got batchv1.Job
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatal(err)
			}
			gotJSON, _ := json.Marshal(&got)
			if want := tc.want.raw(t); string(gotJSON) != want {
				t.Fatalf("defaulted job\n got %s\nwant %s", gotJSON, want)
			}
		})
	}
}

// fakeNS maps a namespace to its labels; the name label is added as the
// API server adds it.
type fakeNS map[string]map[string]string

func (f fakeNS) NamespaceLabels(name string) (map[string]string, bool) {
	l, ok := f[name]
	if !ok {
		return nil, false
	}
	out := map[string]string{"kubernetes.io/metadata.name": name}
	for k, v := range l {
		out[k] = v
	}
	return out, true
}

func TestManageJobsWithoutQueueNameNamespace(t *testing.T) {
	cfg := Config{ManageJobsWithoutQueueName: true, ManagedJobsNamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kueue": "on"}}}
	j := mkJob("j", "team").suspend(false)
	p := must(t, cfg, Options{Namespaces: fakeNS{"team": {"kueue": "on"}, "other": {}}})
	out, v := mutate(t, p, req(admissionv1.Create, "team", j.raw(t), ""))
	if _, s := decode(t, out); !v.Allowed || s == nil || !*s {
		t.Fatalf("matching namespace: verdict %+v out %s", v, out)
	}
	j.Namespace = "other"
	if out, v := mutate(t, p, req(admissionv1.Create, "other", j.raw(t), "")); out != nil || !v.Allowed {
		t.Fatalf("non-matching namespace: verdict %+v out %s", v, out)
	}
	// A namespace the cache does not hold: Kueue's client Get fails with
	// NotFound, which controller-runtime answers with that status.
	j.Namespace = "missing"
	if _, v := mutate(t, p, req(admissionv1.Create, "missing", j.raw(t), "")); v.Allowed || v.Code != 404 ||
		v.Message != `failed to get namespace: namespaces "missing" not found` {
		t.Fatalf("missing namespace: %+v", v)
	}
	// Offline: decided on the name label, with a warning.
	j.Namespace = "team"
	p = must(t, cfg, Options{Offline: true})
	if out, v := mutate(t, p, req(admissionv1.Create, "team", j.raw(t), "")); out != nil || !v.Allowed || len(v.Warnings) != 2 ||
		!strings.Contains(v.Warnings[1], "managedJobsNamespaceSelector matched on its name only") {
		t.Fatalf("offline: verdict %+v out %s", v, out)
	}
}

func TestOfflineDefaultQueueWarning(t *testing.T) {
	p := must(t, DefaultConfig(), Options{Offline: true})
	out, v := mutate(t, p, req(admissionv1.Create, "ns", mkJob("j", "ns").suspend(false).raw(t), ""))
	if out != nil || !v.Allowed || len(v.Warnings) != 1 || !strings.Contains(v.Warnings[0], "--state") {
		t.Fatalf("verdict %+v out %s", v, out)
	}
}
