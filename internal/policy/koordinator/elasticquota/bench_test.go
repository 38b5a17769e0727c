package elasticquota

import (
	"context"
	"fmt"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
)

// benchTree is org with n leaf children; team-0 claims namespace ns-0 and
// holds pods running pods there.
func benchTree(b *testing.B, cfg Config, n, pods int) (*Policy, *qb) {
	quotas := []*qb{mq("org").IsParent(true).Min(fmt.Sprintf("cpu=%d", n)).Max("cpu=100000")}
	for i := range n {
		q := mq(fmt.Sprintf("team-%d", i)).Parent("org").Min("cpu=1").Max("cpu=100000")
		if i == 0 {
			q.Namespaces("ns-0")
		}
		quotas = append(quotas, q)
	}
	var ps []*corev1.Pod
	for i := range pods {
		ps = append(ps, mkPod("ns-0", fmt.Sprintf("p%d", i), nil, "cpu=1", corev1.PodRunning))
	}
	p, _ := world(b, cfg, quotas, ps...)
	return p, quotas[1]
}

// BenchmarkValidateQuotaUpdate: a min change of one of 1000 siblings (the
// sibling sum walks them all).
func BenchmarkValidateQuotaUpdate(b *testing.B) {
	p, q := benchTree(b, DefaultConfig(), 1000, 0)
	r := qreq(admissionv1.Update, q.copy().Min("cpu=0").JSON(), q.JSON())
	b.ReportAllocs()
	for b.Loop() {
		if v := p.Validate(context.Background(), r); !v.Allowed {
			b.Fatal(v.Message)
		}
	}
}

// BenchmarkValidatePod: upstream's defaults, a pod in a claimed namespace.
func BenchmarkValidatePod(b *testing.B) {
	p, _ := benchTree(b, DefaultConfig(), 1000, 5000)
	r := podReq(admissionv1.Create, mkPod("ns-0", "new", nil, "cpu=1", ""), nil)
	b.ReportAllocs()
	for b.Loop() {
		if v := p.ValidatePod(context.Background(), r); !v.Allowed {
			b.Fatal(v.Message)
		}
	}
}

// BenchmarkQuotaAdmission: quotaAdmission on, the quota holds 5000 pods.
func BenchmarkQuotaAdmission(b *testing.B) {
	cfg := DefaultConfig()
	cfg.QuotaAdmission = true
	p, _ := benchTree(b, cfg, 1000, 5000)
	r := podReq(admissionv1.Create, mkPod("ns-0", "new", nil, "cpu=1", ""), nil)
	b.ReportAllocs()
	for b.Loop() {
		if v := p.ValidatePod(context.Background(), r); !v.Allowed {
			b.Fatal(v.Message)
		}
	}
}
