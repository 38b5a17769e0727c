package doctor

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// urlSnapshot is n URL webhooks in one configuration "many", each naming
// its own port on 127.0.0.1 (never dialed: the tests' Dial counts and
// refuses).
func urlSnapshot(n int) *Snapshot {
	c := &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "many"}}
	none := admissionregistrationv1.SideEffectClassNone
	for i := range n {
		u := fmt.Sprintf("https://127.0.0.1:%d/validate", 20000+i)
		c.Webhooks = append(c.Webhooks, admissionregistrationv1.ValidatingWebhook{
			Name: fmt.Sprintf("h%d.example.com", i), ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: &u},
			SideEffects: &none, AdmissionReviewVersions: []string{"v1"}})
	}
	return &Snapshot{Webhooks: FromValidating(c), Namespaces: map[string]map[string]string{}, NamespacesKnown: true, Backends: map[string]*Backend{}}
}

// TestHandshakeBounds: a run dials at most MaxHandshakes distinct
// endpoints, the rest get KD003; at most Concurrency dials are in flight.
func TestHandshakeBounds(t *testing.T) {
	var dials, inFlight, peak atomic.Int64
	dial := func(ctx context.Context, _, addr string) (net.Conn, error) {
		dials.Add(1)
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		time.Sleep(20 * time.Millisecond) // overlap the workers
		return nil, fmt.Errorf("%w: %s", ErrDialNotAllowed, addr)
	}
	const hooks, bound, workers = 40, 12, 4
	rep, err := Diagnose(context.Background(), nil, urlSnapshot(hooks), Options{Names: []string{"many"}, Dial: dial, MaxHandshakes: bound, Concurrency: workers})
	if err != nil {
		t.Fatal(err)
	}
	if dials.Load() != bound {
		t.Errorf("%d dials for %d webhooks, want the bound %d", dials.Load(), hooks, bound)
	}
	if p := peak.Load(); p > workers || p < 2 {
		t.Errorf("%d dials at once, want 2..%d", p, workers)
	}
	skipped := 0
	for _, w := range rep.Webhooks {
		for _, f := range w.ByID(IDNotChecked) {
			if f.Severity != SeverityInfo || f.Endpoint == "" {
				t.Errorf("KD003 %+v", f)
			}
			skipped++
		}
	}
	if len(rep.Webhooks) != hooks || skipped != hooks-bound {
		t.Errorf("%d webhooks, %d KD003; want %d and %d", len(rep.Webhooks), skipped, hooks, hooks-bound)
	}
}

// TestTimeoutGivesPartialReport: when ctx ends during the checks, Diagnose
// returns the report with every webhook in it, those not checked (or cut
// short) carrying a KD003 warning, and an error wrapping ErrIncomplete and
// the context's.
func TestTimeoutGivesPartialReport(t *testing.T) {
	var mu sync.Mutex
	started := 0
	dial := func(ctx context.Context, _, addr string) (net.Conn, error) {
		mu.Lock()
		started++
		mu.Unlock()
		<-ctx.Done() // a hanging endpoint
		return nil, ctx.Err()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	const hooks = 10
	rep, err := Diagnose(ctx, nil, urlSnapshot(hooks), Options{Names: []string{"many"}, Dial: dial, Concurrency: 2, HandshakeTimeout: time.Minute})
	if !errors.Is(err, ErrIncomplete) || !errors.Is(err, context.DeadlineExceeded) || rep == nil {
		t.Fatalf("err = %v, report %v; want ErrIncomplete wrapping DeadlineExceeded, with the report", err, rep != nil)
	}
	if len(rep.Webhooks) != hooks {
		t.Fatalf("%d webhooks in the partial report, want %d", len(rep.Webhooks), hooks)
	}
	for _, w := range rep.Webhooks {
		if f := w.ByID(IDNotChecked); len(f) != 1 || f[0].Severity != SeverityWarning {
			t.Errorf("%s: want one KD003 warning, got %+v", w.Webhook, w.Findings)
		}
	}
	if started != 2 || rep.Warnings < hooks {
		t.Errorf("%d dials started (want the 2 workers'), %d warnings", started, rep.Warnings)
	}
}

// TestHandshakeTimeout: an endpoint that accepts the connection and never
// answers the TLS handshake costs HandshakeTimeout, not the run's bound.
func TestHandshakeTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var mu sync.Mutex
	var conns []net.Conn
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	}()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c) // held open, never read: the handshake hangs
			mu.Unlock()
		}
	}()
	snap := urlSnapshot(1)
	u := "https://" + ln.Addr().String() + "/validate"
	snap.Webhooks[0].ClientConfig.URL = &u
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	rep, err := Diagnose(ctx, nil, snap, Options{Names: []string{"many"}, HandshakeTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatalf("after %s: %v", time.Since(start), err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("a hanging handshake took %s, want about the 300ms HandshakeTimeout", took)
	}
	if !rep.Webhooks[0].Has(IDEndpointUnreachable) {
		t.Errorf("want KD410 for the hanging endpoint, got %+v", rep.Webhooks[0].Findings)
	}
}
