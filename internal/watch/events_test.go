package watch

import (
	"strings"
	"testing"
	"time"

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
