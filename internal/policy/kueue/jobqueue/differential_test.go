package jobqueue

import (
	"context"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	batchv1 "k8s.io/api/batch/v1"

	"github.com/kadmit/kadmit/internal/policy/policytest"
)

// TestMutateKeepsIntegersAbove2To53 is issue 10's case: a Job with
// activeDeadlineSeconds 9007199254740993 (2^53+1) used to get a patch
// setting it to ...992, because the job went through map[string]any.
func TestMutateKeepsIntegersAbove2To53(t *testing.T) {
	p := must(t, Config{DefaultQueues: map[string]string{"team-a": "main"}, ManagedLabel: true}, Options{})
	in := `{"apiVersion":"batch/v1","kind":"Job","metadata":{"name":"j"},"spec":{"activeDeadlineSeconds":9007199254740993,"template":{"spec":{"containers":[{"name":"c","image":"x"}]}}}}`
	ops, v := p.Mutate(context.Background(), req(admissionv1.Create, "team-a", in, ""))
	if !v.Allowed || len(ops) == 0 {
		t.Fatalf("verdict %+v, ops %v", v, ops)
	}
	for _, op := range ops {
		if strings.HasPrefix(op.Path, "/spec/activeDeadlineSeconds") || op.Path == "/spec" {
			t.Fatalf("patch touches activeDeadlineSeconds: %v", ops)
		}
	}
	got := policytest.Check(t, []byte(in), ops, func(j *batchv1.Job) {
		j.Labels = map[string]string{QueueLabel: "main", ManagedLabel: "true"}
		j.Spec.Suspend = new(true)
	})
	if !strings.Contains(string(got), `"activeDeadlineSeconds":9007199254740993`) {
		t.Fatalf("patched job %s", got)
	}
}

// TestMutateDifferential: for every job of the corpus, the patch applied by
// the API server's library gives what setting the labels and spec.suspend
// on a typed batchv1.Job gives, and changes nothing else.
func TestMutateDifferential(t *testing.T) {
	p := must(t, Config{DefaultQueues: map[string]string{"team-a": "main"}, ManagedLabel: true}, Options{})
	corpus := map[string]string{
		"plain":             job(``, ""),
		"explicit queue":    job(`"`+QueueLabel+`":"other"`, ""),
		"managed false":     job(`"`+ManagedLabel+`":"false","a/b~c":"ü"`, `"suspend":false,"parallelism":3`),
		"already done":      job(`"`+QueueLabel+`":"main","`+ManagedLabel+`":"true"`, `"suspend":true`),
		"no metadata":       `{"spec":{"activeDeadlineSeconds":9223372036854775807}}`,
		"labels null":       `{"metadata":{"name":"j","labels":null,"annotations":{"h":"<&>","big":"` + strings.Repeat("z", 70000) + `"}},"spec":null}`,
		"suspend null":      `{"metadata":{"name":"j"},"spec":{"suspend":null,"backoffLimit":6}}`,
		"unicode, escapes":  `{"met\u0061data":{"name":"jöb-名前","l\u0061bels":{"emoji":"🚀"}},"spec":{"template":{"metadata":{"labels":{}}}}}`,
		"unknown fields":    `{"metadata":{"name":"j","creationTimestamp":null},"spec":{"futureField":{"x":[1,2.50,1e3]},"template":{"spec":{"containers":[]}}},"status":{},"extra":12345678901234567890}`,
		"empty object":      `{}`,
		"case-variant spec": `{"metadata":{},"Spec":{"suspend":true},"spec":{}}`,
	}
	for name, in := range corpus {
		t.Run(name, func(t *testing.T) {
			ops, v := p.Mutate(context.Background(), req(admissionv1.Create, "team-a", in, ""))
			if !v.Allowed {
				t.Fatalf("denied: %+v", v)
			}
			policytest.Check(t, []byte(in), ops, func(j *batchv1.Job) {
				if j.Labels == nil {
					j.Labels = map[string]string{}
				}
				if _, ok := j.Labels[QueueLabel]; !ok {
					j.Labels[QueueLabel] = "main"
				}
				j.Labels[ManagedLabel] = "true"
				j.Spec.Suspend = new(true)
			})
		})
	}
}
