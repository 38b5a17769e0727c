package metrics

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestRegistrationSeriesBounded: a configuration keeps one contested
// series whatever the number of managers it saw, and none once the fight
// ends; a nil *Registration records nothing.
func TestRegistrationSeriesBounded(t *testing.T) {
	var none *Registration
	none.Wrote("ValidatingWebhookConfiguration", "kadmit")
	none.Reverted("ValidatingWebhookConfiguration", "kadmit")
	none.Contested("ValidatingWebhookConfiguration", "kadmit", "m", time.Second)

	reg := prometheus.NewRegistry()
	m, err := NewRegistration(reg)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		m.Contested("ValidatingWebhookConfiguration", "kadmit", "manager-"+string(rune('a'+i%26))+string(rune('a'+i/26)), time.Duration(i)*time.Second)
	}
	m.Contested("MutatingWebhookConfiguration", "kadmit", "argocd-controller", time.Second)
	if n := testutil.CollectAndCount(reg, "kadmit_registration_ca_bundle_contested"); n != 2 {
		t.Fatalf("%d contested series for 2 configurations", n)
	}
	if v := testutil.ToFloat64(m.backoff.WithLabelValues("ValidatingWebhookConfiguration", "kadmit")); v != 99 {
		t.Errorf("backoff = %v, want the latest, 99", v)
	}
	m.Contested("ValidatingWebhookConfiguration", "kadmit", "", 0)
	m.Contested("MutatingWebhookConfiguration", "kadmit", "", 0)
	if n := testutil.CollectAndCount(reg, "kadmit_registration_ca_bundle_contested"); n != 0 {
		t.Fatalf("%d contested series after the fights ended", n)
	}
	if v := testutil.ToFloat64(m.backoff.WithLabelValues("ValidatingWebhookConfiguration", "kadmit")); v != 0 {
		t.Errorf("backoff after the fight = %v", v)
	}
	if len(m.manager) != 0 {
		t.Errorf("managers remembered after the fights ended: %v", m.manager)
	}
}
