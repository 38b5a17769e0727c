package colocation

// Benchmarks of colocation's Mutate alone, on `make bench`'s pod, with the
// ten profiles of benchrun's "kadmit +10 colocation" server
// (bench/reference/cmd/benchrun colocationConfig):
//
//	go test -run '^$' -bench Mutate -benchmem ./internal/policy/koordinator/colocation

import (
	"fmt"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kadmit/kadmit/internal/fixture"
)

// benchProfiles are n profiles each setting a label and a toleration; the
// first selects team=team0, the others teams no pod has.
func benchProfiles(n int, team0 string) []Profile {
	out := make([]Profile, n)
	for i := range out {
		team := team0
		if i > 0 {
			team = fmt.Sprintf("nobody-%d", i)
		}
		out[i] = Profile{
			Name:        fmt.Sprintf("p%d", i),
			Selector:    &metav1.LabelSelector{MatchLabels: map[string]string{"team": team}},
			Labels:      map[string]string{fmt.Sprintf("colocation.kadmit.io/p%d", i): "true"},
			Tolerations: []corev1.Toleration{{Key: fmt.Sprintf("colocation-p%d", i), Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
		}
	}
	return out
}

func benchMutate(b *testing.B, team0 string, wantOps int) {
	pod := fixture.DeploymentPodJSON()
	p, err := New(Config{Profiles: benchProfiles(10, team0)}, nil)
	if err != nil {
		b.Fatal(err)
	}
	req := podReq("shop", admissionv1.Create, pod, nil)
	if ops, v := p.Mutate(b.Context(), req); !v.Allowed || len(ops) != wantOps {
		b.Fatalf("ops %v, verdict %+v: want %d ops", ops, v, wantOps)
	}
	b.SetBytes(int64(len(pod)))
	b.ReportAllocs()
	for b.Loop() {
		p.Mutate(b.Context(), req)
	}
}

// BenchmarkMutateMatch: the first profile selects the pod (team=payments):
// a label and a toleration added.
func BenchmarkMutateMatch(b *testing.B) { benchMutate(b, "payments", 2) }

// BenchmarkMutateNoMatch: no profile selects the pod.
func BenchmarkMutateNoMatch(b *testing.B) { benchMutate(b, "nobody-0", 0) }
