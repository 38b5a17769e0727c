package watch

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"

	"github.com/kadmit/kadmit/internal/doctor"
)

func stateWith(config, hook string, fs ...doctor.Finding) *webhookState {
	return &webhookState{key: wkey{doctor.KindValidating, config, hook}, uid: "u", failurePolicy: "Fail", service: "ns/svc", findings: fs}
}

var kd201 = doctor.Finding{ID: doctor.IDNoReadyEndpoints, Severity: doctor.SeverityError, What: "no ready endpoint", Fix: "kubectl get pods"}

// One Warning per webhook and check while it stays (however many
// evaluations and endpoints), again after the repeat period, one Normal
// <ID>Resolved when it clears, and none for a webhook that was deleted.
func TestEventsDeduplicatedRepeatedAndResolved(t *testing.T) {
	rec := record.NewFakeRecorder(100)
	e := newEvents(nil, rec, 1, 10, time.Hour)
	t0 := time.Unix(1_800_000_000, 0)
	ep1, ep2 := kd201, kd201
	ep1.ID, ep2.ID = doctor.IDEndpointRefused, doctor.IDEndpointRefused
	ep1.Endpoint, ep2.Endpoint = "10.0.0.1:9443", "10.0.0.2:9443"
	info := doctor.Finding{ID: doctor.IDAccessGap, Severity: doctor.SeverityInfo, What: "gap"}
	for i := range 5 {
		e.sync(t0.Add(time.Duration(i)*time.Minute), []*webhookState{stateWith("c", "w", kd201, ep1, ep2, info)})
	}
	got := drain(rec)
	if len(got) != 2 || !strings.HasPrefix(got[0], "Warning KD201 webhook w: no ready endpoint; fix: kubectl get pods") ||
		!strings.HasPrefix(got[1], "Warning KD202 ") || !strings.Contains(got[1], "(and 1 more like it)") {
		t.Fatalf("first evaluations: %q", got)
	}
	e.sync(t0.Add(61*time.Minute), []*webhookState{stateWith("c", "w", kd201)})
	got = drain(rec)
	if len(got) != 2 || !strings.HasPrefix(got[0], "Warning KD201") || !strings.HasPrefix(got[1], "Normal KD202Resolved") {
		t.Fatalf("after an hour, KD202 cleared: %q", got)
	}
	e.sync(t0.Add(62*time.Minute), []*webhookState{stateWith("c", "w")})
	if got = drain(rec); len(got) != 1 || !strings.HasPrefix(got[0], "Normal KD201Resolved webhook w: KD201 no longer found (was: webhook w: no ready endpoint") {
		t.Fatalf("KD201 cleared: %q", got)
	}
	e.sync(t0.Add(63*time.Minute), []*webhookState{stateWith("c", "w", kd201)})
	e.sync(t0.Add(64*time.Minute), nil) // configuration deleted
	if got = drain(rec); len(got) != 1 || !strings.HasPrefix(got[0], "Warning KD201") {
		t.Fatalf("reappeared, then webhook deleted: %q (want one Warning and no Resolved)", got)
	}
	if len(e.active) != 0 {
		t.Errorf("state kept for a deleted webhook: %v", e.active)
	}
}

// The token bucket bounds Events overall; what it holds back is sent at
// later evaluations, nothing is lost.
func TestEventsRateLimited(t *testing.T) {
	rec := record.NewFakeRecorder(1000)
	e := newEvents(nil, rec, 1, 5, time.Hour)
	t0 := time.Unix(1_800_000_000, 0)
	var states []*webhookState
	for i := range 40 {
		states = append(states, stateWith("c", "w"+string(rune('a'+i%26))+string(rune('a'+i/26)), kd201))
	}
	e.sync(t0, states)
	if got := len(drain(rec)); got != 5 {
		t.Fatalf("%d Events at once, want the burst of 5", got)
	}
	total := 5
	for i := 1; i <= 7; i++ {
		e.sync(t0.Add(time.Duration(i)*5*time.Second), states)
		n := len(drain(rec))
		if n > 5 {
			t.Fatalf("%d Events in one evaluation 5s after the last, want at most the burst of 5", n)
		}
		total += n
	}
	if total != 40 {
		t.Fatalf("%d Warnings in all, want one for each of the 40 webhooks", total)
	}
}

func TestEventMessageBounded(t *testing.T) {
	f := kd201
	f.What = strings.Repeat("é", 2000)
	msg := warningMessage("webhook w", f, 0)
	if len(msg) > MaxEventMessage || !strings.HasSuffix(msg, "...") {
		t.Fatalf("message of %d bytes", len(msg))
	}
	if !strings.HasPrefix(msg, "webhook w: é") {
		t.Fatalf("message %q", msg[:20])
	}
}

// A new leader does not repeat a Warning its predecessor sent within the
// repeat period, and resolves it if the finding is gone.
func TestEventsSeededFromEarlierWarnings(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	earlier := &corev1.EventList{Items: []corev1.Event{
		{InvolvedObject: corev1.ObjectReference{Kind: doctor.KindValidating, Name: "c", UID: "u"}, Reason: "KD201", Type: corev1.EventTypeWarning,
			Message: "webhook w: no ready endpoint; fix: kubectl get pods", LastTimestamp: metav1.NewTime(t0.Add(-10 * time.Minute))},
		{InvolvedObject: corev1.ObjectReference{Kind: doctor.KindValidating, Name: "c", UID: "u"}, Reason: "KD202", Type: corev1.EventTypeWarning,
			Message: "webhook w: refused", LastTimestamp: metav1.NewTime(t0.Add(-10 * time.Minute))},
		{InvolvedObject: corev1.ObjectReference{Kind: doctor.KindValidating, Name: "old", UID: "u"}, Reason: "KD201", Type: corev1.EventTypeWarning,
			Message: "webhook w: stale", LastTimestamp: metav1.NewTime(t0.Add(-2 * time.Hour))},
	}}
	rec := record.NewFakeRecorder(10)
	e := newEvents(nil, rec, 1, 10, time.Hour)
	e.seed(context.Background(), func(context.Context, metav1.ListOptions) (*corev1.EventList, error) { return earlier, nil }, t0)
	e.sync(t0, []*webhookState{stateWith("c", "w", kd201)})
	got := drain(rec)
	if len(got) != 1 || !strings.HasPrefix(got[0], "Normal KD202Resolved webhook w:") {
		t.Fatalf("after seeding: %q (want no repeated KD201 Warning, one KD202Resolved)", got)
	}
	e.sync(t0.Add(51*time.Minute), []*webhookState{stateWith("c", "w", kd201)})
	if got = drain(rec); len(got) != 1 || !strings.HasPrefix(got[0], "Warning KD201") {
		t.Fatalf("an hour after the predecessor's Warning: %q", got)
	}
}

// A finding's What ends with a period; the Event joins it to the fix
// without "...).; fix:" (seen on a real cluster, seed 001).
func TestWarningMessageJoinsFixCleanly(t *testing.T) {
	f := doctor.Finding{ID: doctor.IDSelectorCollision, Severity: doctor.SeverityError,
		What: "Service ns/svc selects pods of 2 workloads: Deployment/a (pods a-1 at 10.244.1.2).", Fix: "kubectl -n ns patch service svc"}
	for _, c := range []struct {
		f    doctor.Finding
		more int
		want string
	}{
		{f, 0, "webhook w: Service ns/svc selects pods of 2 workloads: Deployment/a (pods a-1 at 10.244.1.2); fix: kubectl -n ns patch service svc"},
		{f, 2, "webhook w: Service ns/svc selects pods of 2 workloads: Deployment/a (pods a-1 at 10.244.1.2) (and 2 more like it); fix: kubectl -n ns patch service svc"},
		{doctor.Finding{What: "No fix here."}, 0, "webhook w: No fix here."},
		{doctor.Finding{What: "Cut short...", Fix: "x"}, 0, "webhook w: Cut short...; fix: x"},
	} {
		if got := warningMessage("webhook w", c.f, c.more); got != c.want {
			t.Errorf("warningMessage(%q, more %d) =\n%q; want\n%q", c.f.What, c.more, got, c.want)
		}
	}
}
