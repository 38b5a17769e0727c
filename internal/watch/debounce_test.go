package watch

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kadmit/kadmit/internal/testkit"

	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A burst of informer events within the debounce is one evaluation, not
// one per event.
func TestDebounceCoalescesEvents(t *testing.T) {
	ca := newTestCA(t)
	r := startController(t, func(o *Options) { o.Debounce = 400 * time.Millisecond; o.HandshakeInterval = time.Hour },
		testService("svc-d", 9443), validatingConfig("cfg-d", "svc-d", false, ca.pem(), "d.example.com"))
	m := r.c.Metrics()
	testkit.Eventually(t, 10*time.Second, "first evaluation", r.c.Ready)
	time.Sleep(time.Second) // let the start-up kicks (slow loop, handshakes) settle
	before := testutil.ToFloat64(m.evaluations)
	ctx := context.Background()
	const events = 30
	for i := range events {
		s := testService("svc-d", 9443)
		s.Labels = map[string]string{"rev": fmt.Sprint(i)}
		if _, err := r.cs.CoreV1().Services(testNS).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(1500 * time.Millisecond)
	got := testutil.ToFloat64(m.evaluations) - before
	if got < 1 || got > 4 {
		t.Fatalf("%v evaluations for %d events within the debounce, want 1 to 4", got, events)
	}
}
