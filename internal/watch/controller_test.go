package watch

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kadmit/kadmit/internal/doctor"
	"github.com/kadmit/kadmit/internal/testkit"
)

// An informer-driven failure (the Service loses its only ready endpoint)
// becomes an active KD201 with one Warning Event, and clears with one
// Normal KD201Resolved when a ready endpoint returns.
func TestNoEndpointsDetectedAndResolved(t *testing.T) {
	ca := newTestCA(t)
	srv := startTLS(t, "127.0.0.2", 0, ca.serving(t, "svc-a.hooks.svc"))
	r := startController(t, nil, testService("svc-a", srv.port()), slice("svc-a", srv.port(), "127.0.0.2"),
		validatingConfig("cfg-a", "svc-a", true, ca.pem(), "a.example.com"))
	testkit.Eventually(t, 10*time.Second, "ready endpoint handshaken", func() bool {
		s := r.states()["cfg-a/a.example.com"]
		return s != nil && s.ready == 1 && len(s.certExpiry) == 1
	})
	drain(r.rec)
	ctx := context.Background()
	if _, err := r.cs.DiscoveryV1().EndpointSlices(testNS).Update(ctx, slice("svc-a", srv.port(), "127.0.0.2!"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "KD201", func() bool {
		return has(r.states()["cfg-a/a.example.com"], doctor.IDNoReadyEndpoints, doctor.SeverityError)
	})
	testkit.Eventually(t, 5*time.Second, "Warning KD201 event", func() bool {
		return strings.Contains(strings.Join(peek(r), "\n"), "Warning KD201 webhook a.example.com:")
	})
	if _, err := r.cs.DiscoveryV1().EndpointSlices(testNS).Update(ctx, slice("svc-a", srv.port(), "127.0.0.2"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "KD201 cleared", func() bool {
		return !has(r.states()["cfg-a/a.example.com"], doctor.IDNoReadyEndpoints, doctor.SeverityError)
	})
	testkit.Eventually(t, 5*time.Second, "Normal KD201Resolved event", func() bool {
		return strings.Contains(strings.Join(peek(r), "\n"), "Normal KD201Resolved")
	})
	var warnings int
	for _, e := range r.seen {
		if strings.HasPrefix(e, "Warning KD201") {
			warnings++
		}
	}
	if warnings != 1 {
		t.Errorf("%d Warning KD201 events, want exactly 1 (deduplicated): %q", warnings, r.seen)
	}
}

// peek accumulates the recorder's events into r.seen and returns them.
func peek(r *running) []string {
	r.seen = append(r.seen, drain(r.rec)...)
	return r.seen
}
