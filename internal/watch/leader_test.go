package watch

import (
	"context"
	"testing"
	"time"

	"github.com/kadmit/kadmit/internal/testkit"

	"github.com/prometheus/client_golang/prometheus/testutil"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
)

// Of two replicas on one Lease, only the leader exports per-webhook series
// and writes Events; both are ready. When the leader stops, the other
// takes over and reports.
func TestOnlyTheLeaderReports(t *testing.T) {
	ca := newTestCA(t)
	cs := fake.NewClientset(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNS}},
		testService("svc-l", 9443), validatingConfig("cfg-l", "svc-l", true, ca.pem(), "l.example.com"))
	cs.PrependReactor("create", "selfsubjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		rev := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SelfSubjectAccessReview).DeepCopy()
		rev.Status.Allowed = true
		return true, rev, nil
	})
	type replica struct {
		c      *Controller
		rec    *record.FakeRecorder
		cancel context.CancelFunc
		done   chan error
	}
	start := func(id string) *replica {
		rec := record.NewFakeRecorder(100)
		c, err := New(Options{Client: cs, Dial: loopbackDial, LeaderElect: true, Identity: id, Namespace: testNS,
			LeaseDuration: 2 * time.Second, RenewDeadline: time.Second, RetryPeriod: 200 * time.Millisecond, Debounce: 50 * time.Millisecond}, rec)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		r := &replica{c: c, rec: rec, cancel: cancel, done: make(chan error, 1)}
		go func() { r.done <- c.Run(ctx, "") }()
		t.Cleanup(func() { cancel(); <-r.done })
		return r
	}
	a := start("a")
	testkit.Eventually(t, 10*time.Second, "a leads and reports", func() bool {
		return testutil.ToFloat64(a.c.Metrics().leader) == 1 && testutil.CollectAndCount(a.c.Metrics().info) == 1
	})
	b := start("b")
	testkit.Eventually(t, 10*time.Second, "b ready", b.c.Ready)
	time.Sleep(500 * time.Millisecond)
	if testutil.ToFloat64(b.c.Metrics().leader) != 0 || testutil.CollectAndCount(b.c.Metrics().info) != 0 || testutil.CollectAndCount(b.c.Metrics().findings) != 0 {
		t.Fatal("the non-leader exports per-webhook series")
	}
	if got := drain(b.rec); len(got) != 0 {
		t.Fatalf("the non-leader wrote Events: %q", got)
	}
	if got := drain(a.rec); len(got) == 0 {
		t.Fatal("the leader wrote no Event (KD201 and the Fail webhook's warnings are active)")
	}
	a.cancel()
	<-a.done
	a.done <- nil // for the cleanup
	testkit.Eventually(t, 10*time.Second, "b takes over", func() bool {
		return testutil.ToFloat64(b.c.Metrics().leader) == 1 && testutil.CollectAndCount(b.c.Metrics().info) == 1
	})
}
