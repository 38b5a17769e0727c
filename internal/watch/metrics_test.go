package watch

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kadmit/kadmit/internal/doctor"
	"github.com/kadmit/kadmit/internal/testkit"
)

// seriesOf counts the gathered series whose labels contain every pair of
// want ("label=value").
func seriesOf(t *testing.T, m *Metrics, want ...string) int {
	t.Helper()
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "kadmit_watch_") {
			continue
		}
	next:
		for _, s := range mf.GetMetric() {
			have := map[string]bool{}
			for _, l := range s.GetLabel() {
				have[l.GetName()+"="+l.GetValue()] = true
			}
			for _, w := range want {
				if !have[w] {
					continue next
				}
			}
			n++
		}
	}
	return n
}

// A finding that clears loses its series (no stale zero); a webhook that
// is deleted loses every series, counters and histograms included; losing
// the lead drops all per-webhook series.
func TestSeriesFollowFindingsAndWebhooks(t *testing.T) {
	m, err := NewMetrics()
	if err != nil {
		t.Fatal(err)
	}
	m.setLeader(true)
	exp := time.Unix(1_900_000_000, 0)
	a := stateWith("c", "a", kd201)
	a.ready, a.readyKnown, a.caExpiry, a.certExpiry = 0, true, exp, map[string]time.Time{"10.0.0.1:9443": exp}
	b := stateWith("c", "b")
	m.publish([]*webhookState{a, b})
	m.handshake(series{"c", "a"}, 3*time.Millisecond)
	m.handshakeFailed(series{"c", "a"}, "refused")
	if got := testutil.ToFloat64(m.findings.WithLabelValues("c", "a", "KD201", "error")); got != 1 {
		t.Fatalf("findings KD201 = %v", got)
	}
	if n := seriesOf(t, m, "configuration=c", "webhook=a"); n != 7 {
		t.Fatalf("%d series for webhook a, want 7 (info, findings, ready, ca, cert, handshake histogram, failures)", n)
	}
	a.findings = nil
	m.publish([]*webhookState{a, b})
	if n := seriesOf(t, m, "configuration=c", "webhook=a", "check=KD201"); n != 0 {
		t.Fatalf("cleared finding still has %d series", n)
	}
	m.publish([]*webhookState{b})
	if n := seriesOf(t, m, "configuration=c", "webhook=a"); n != 0 {
		t.Fatalf("deleted webhook still has %d series", n)
	}
	if n := seriesOf(t, m, "configuration=c", "webhook=b"); n != 1 {
		t.Fatalf("webhook b has %d series, want its info", n)
	}
	m.setLeader(false)
	if n := seriesOf(t, m, "configuration=c"); n != 0 {
		t.Fatalf("a non-leader exports %d per-webhook series", n)
	}
	if got := testutil.ToFloat64(m.leader); got != 0 {
		t.Fatalf("leader = %v", got)
	}
}

// With more webhooks than --max-webhooks, only that many have series
// (and handshakes); the rest are counted. A tracked webhook that is
// deleted frees its place and loses its series.
func TestMaxWebhooksBoundsLabelSets(t *testing.T) {
	const max, total = 3, 10
	ca := newTestCA(t)
	objs := []runtime.Object{testService("svc-m", 9443), slice("svc-m", 9443)}
	for i := range total {
		objs = append(objs, validatingConfig(fmt.Sprintf("cfg-%02d", i), "svc-m", true, ca.pem(), "m.example.com"))
	}
	r := startController(t, func(o *Options) { o.MaxWebhooks = max }, objs...)
	m := r.c.Metrics()
	testkit.Eventually(t, 10*time.Second, "an evaluation", func() bool { return testutil.ToFloat64(m.evaluations) > 0 && r.c.Ready() })
	if n := testutil.CollectAndCount(m.info); n != max {
		t.Fatalf("%d webhook_info series, want %d", n, max)
	}
	if got := testutil.ToFloat64(m.untracked); got != total-max {
		t.Fatalf("untracked = %v, want %d", got, total-max)
	}
	if n := seriesOf(t, m, "configuration=cfg-00"); n == 0 {
		t.Fatal("the first webhook is not tracked")
	}
	if err := r.cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(context.Background(), "cfg-00", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "series of the deleted webhook gone", func() bool { return seriesOf(t, m, "configuration=cfg-00") == 0 })
	testkit.Eventually(t, 10*time.Second, "a freed place taken", func() bool { return testutil.ToFloat64(m.untracked) == total-max-1 })
	if n := testutil.CollectAndCount(m.info); n != max {
		t.Fatalf("%d webhook_info series after a deletion, want %d", n, max)
	}
	if n := testutil.CollectAndCount(m.findings); n > max*len(doctor.Checks) {
		t.Fatalf("%d findings series for %d tracked webhooks", n, max)
	}
	r.c.hs.mu.Lock()
	n := len(r.c.hs.wanted)
	r.c.hs.mu.Unlock()
	if n > max*r.c.o.MaxEndpoints {
		t.Fatalf("%d handshake keys, bound %d", n, max*r.c.o.MaxEndpoints)
	}
}

// Every reason the code can produce is in the documented lists.
func TestReasonsListed(t *testing.T) {
	in := func(list []string, v string) bool {
		for _, x := range list {
			if x == v {
				return true
			}
		}
		return false
	}
	for _, r := range probeReasons {
		if !in(ProbeReasons, r) {
			t.Errorf("probe reason %q not in ProbeReasons", r)
		}
	}
	for _, id := range []string{doctor.IDUnknownAuthority, doctor.IDSANMismatch, doctor.IDServingCertExpiry, doctor.IDHandshakeFailed, "other"} {
		if r := handshakeReason(hsResult{}, []doctor.Finding{{ID: id}}); !in(HandshakeReasons, r) {
			t.Errorf("handshake reason %q not in HandshakeReasons", r)
		}
	}
}
