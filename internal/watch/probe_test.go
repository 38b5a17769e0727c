package watch

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kadmit/kadmit/internal/doctor"
	"github.com/kadmit/kadmit/internal/testkit"
)

// With --probe, a probe whose failure a retry confirms is a KD702 finding
// and one failure counted by reason; one that the retry does not confirm
// counts nothing.
func TestProbeFailureConfirmedByRetry(t *testing.T) {
	ca := newTestCA(t)
	calls := 0
	failUntil := 2
	cfg := validatingConfig("cfg-p", "svc-p", true, ca.pem(), "p.example.com")
	cfg.Webhooks[0].Rules[0].Rule = admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}}
	cfg.Webhooks[0].NamespaceSelector = nil
	// probeOnce is called directly (the loop is off): the test owns the calls.
	var mu sync.Mutex
	failing := func(cs *fake.Clientset) {
		cs.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
			mu.Lock()
			defer mu.Unlock()
			calls++
			if calls <= failUntil {
				return true, nil, errors.New(`Internal error occurred: failed calling webhook "p.example.com": failed to call webhook: Post "https://svc-p.hooks.svc:443/?timeout=5s": dial tcp 10.0.0.9:9443: connect: connection refused`)
			}
			return false, nil, nil
		})
	}
	r := startControllerWith(t, failing, nil, func(o *Options) { o.HandshakeInterval, o.ConfirmDelay = time.Hour, 50*time.Millisecond },
		testService("svc-p", 9443), cfg)
	testkit.Eventually(t, 10*time.Second, "first evaluation", r.c.Ready)
	snap := r.c.lastSnap.Load()
	var w *doctor.Webhook
	for _, x := range snap.Webhooks {
		w = x
	}
	m := r.c.Metrics()
	fs := r.c.probeOnce(t.Context(), snap, w)
	if len(fs) != 1 || fs[0].ID != doctor.IDProbeRefused {
		t.Fatalf("confirmed failure: %+v", fs)
	}
	if got := testutil.ToFloat64(m.probeFailures.WithLabelValues("cfg-p", "p.example.com", "refused")); got != 1 {
		t.Fatalf("probe failures (refused) = %v, want 1", got)
	}
	mu.Lock()
	calls, failUntil = 0, 1
	mu.Unlock()
	fs = r.c.probeOnce(t.Context(), snap, w)
	if len(fs) != 1 || fs[0].Severity != doctor.SeverityInfo {
		t.Fatalf("unconfirmed failure: %+v", fs)
	}
	if got := testutil.ToFloat64(m.probeFailures.WithLabelValues("cfg-p", "p.example.com", "refused")); got != 1 {
		t.Fatalf("probe failures (refused) = %v after an unconfirmed one, want still 1", got)
	}
}
