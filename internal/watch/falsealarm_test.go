package watch

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kadmit/kadmit/pkg/webhookcerts"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kadmit/kadmit/internal/doctor"
	"github.com/kadmit/kadmit/internal/testkit"
)

// alarmMonitor records every warning or error finding and every Warning
// Event the controller shows while it runs.
type alarmMonitor struct {
	mu     sync.Mutex
	alarms map[string]bool
	stop   chan struct{}
	done   chan struct{}
}

func monitor(r *running, key string) *alarmMonitor {
	m := &alarmMonitor{alarms: map[string]bool{}, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(m.done)
		for {
			m.mu.Lock()
			for _, a := range alarms(r.states()[key]) {
				m.alarms["finding "+a] = true
			}
			for _, e := range drain(r.rec) {
				if strings.HasPrefix(e, "Warning") {
					m.alarms["event "+e] = true
				}
			}
			m.mu.Unlock()
			select {
			case <-m.stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	return m
}

func (m *alarmMonitor) finish() []string {
	close(m.stop)
	<-m.done
	var out []string
	for a := range m.alarms {
		out = append(out, a)
	}
	return out
}

// A serving-certificate rotation, a CA rotation with an overlap bundle
// written by one field manager (cert-manager's cainjector: no KD609, which
// needs two managers taking caBundle from each other) and
// a rolling restart (one endpoint refusing for a moment before the
// endpoints controller marks it not ready, with another ready) raise no
// warning or error finding and no Warning Event; the same faults left in
// place (an endpoint that keeps refusing while ready, a caBundle from
// another CA) do, which shows the test can fail.
func TestNoFalseAlarmsThroughRotationsAndRollingRestart(t *testing.T) {
	const key = "cfg-r/r.example.com"
	sn := "svc-r.hooks.svc"
	ca1 := newTestCA(t)
	a := startTLS(t, "127.0.0.2", 0, ca1.serving(t, sn))
	port := a.port()
	b := startTLS(t, "127.0.0.3", port, ca1.serving(t, sn))
	const injector = "cert-manager-cainjector"
	cfg := validatingConfig("cfg-r", "svc-r", true, ca1.pem(), "r.example.com")
	cfg.ManagedFields = ownedBy(injector, "r.example.com")
	r := startController(t, nil, testService("svc-r", port), slice("svc-r", port, "127.0.0.2", "127.0.0.3"), cfg)
	testkit.Eventually(t, 10*time.Second, "both endpoints handshaken", func() bool {
		s := r.states()[key]
		return s != nil && len(s.certExpiry) == 2
	})
	if a := alarms(r.states()[key]); len(a) > 0 {
		t.Fatalf("healthy baseline has alarms: %v", a)
	}
	drain(r.rec)
	ctx := context.Background()
	m := monitor(r, key)
	setSlice := func(eps ...string) {
		t.Helper()
		if _, err := r.cs.DiscoveryV1().EndpointSlices(testNS).Update(ctx, slice("svc-r", port, eps...), metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	setBundle := func(bundle []byte) {
		t.Helper()
		if _, err := r.cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Update(ctx, validatingConfig("cfg-r", "svc-r", true, bundle, "r.example.com"),
			metav1.UpdateOptions{FieldManager: injector}); err != nil {
			t.Fatal(err)
		}
	}
	handshakeNow := func(ip string) { r.c.hs.recheck(hsKey{Addr: fmt.Sprintf("%s:%d", ip, port), ServerName: sn}, 0) }
	settle := func() { time.Sleep(1500 * time.Millisecond) }

	// Rolling restart: a new pod becomes ready, the old one stops
	// listening, a handshake hits it while its endpoint is still ready,
	// and the endpoints controller marks it not ready 100ms later.
	c := startTLS(t, "127.0.0.4", port, ca1.serving(t, sn))
	setSlice("127.0.0.2", "127.0.0.3", "127.0.0.4")
	settle()
	b.ln.Close()
	handshakeNow("127.0.0.3")
	time.Sleep(100 * time.Millisecond)
	setSlice("127.0.0.2", "127.0.0.3!", "127.0.0.4")
	settle()
	setSlice("127.0.0.2", "127.0.0.4")

	// Serving-certificate rotation: new leaves from the same CA.
	a.cert.Store(ca1.serving(t, sn))
	c.cert.Store(ca1.serving(t, sn))
	handshakeNow("127.0.0.2")
	settle()

	// CA rotation: bundle old+new, pods move to the new CA, then the old CA
	// leaves the bundle before any handshake saw the new leaves.
	ca2 := newTestCA(t)
	setBundle(append(ca1.pem(), ca2.pem()...))
	settle()
	a.cert.Store(ca2.serving(t, sn))
	c.cert.Store(ca2.serving(t, sn))
	setBundle(ca2.pem())
	settle()
	settle()

	if got := m.finish(); len(got) > 0 {
		t.Fatalf("false alarms: %v", got)
	}
	ws := r.c.cl.history.writes(wkey{doctor.KindValidating, "cfg-r", "r.example.com"}, time.Now())
	if len(ws) != 2 {
		t.Errorf("the CA rotation's two caBundle writes were not recorded: %+v", ws)
	}
	for _, w := range ws {
		if w.Manager != injector {
			t.Errorf("a write of the rotation is not the injector's: %+v", w)
		}
	}

	// The same faults, left in place, are found.
	a.ln.Close()
	testkit.Eventually(t, 10*time.Second, "KD202 for the endpoint that keeps refusing", func() bool {
		return has(r.states()[key], doctor.IDEndpointRefused, doctor.SeverityError)
	})
	setBundle(webhookcerts.EncodeCertificates(newTestCA(t).cert))
	testkit.Eventually(t, 10*time.Second, "KD404 for a caBundle from another CA", func() bool {
		return has(r.states()[key], doctor.IDUnknownAuthority, doctor.SeverityError)
	})
}
