package watch

import (
	"errors"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"
)

func TestValidate(t *testing.T) {
	cs := fake.NewClientset()
	o := Options{Client: cs}
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	if o.HandshakeInterval != 20*time.Second || o.Debounce != 500*time.Millisecond || o.MaxWebhooks != 500 || o.MaxEndpoints != 10 ||
		o.ProbeQPS != 0.2 || o.Namespace != "kadmit-system" || o.LeaseName != "kadmit-watch" {
		t.Fatalf("defaults: %+v", o)
	}
	for _, tc := range []struct {
		o    Options
		flag string
	}{
		{Options{}, "client"},
		{Options{Client: cs, Debounce: -time.Second}, "--debounce"},
		{Options{Client: cs, HandshakeInterval: 100 * time.Millisecond}, "--handshake-interval"},
		{Options{Client: cs, MaxWebhooks: -1}, "--max-webhooks"},
		{Options{Client: cs, LeaderElect: true, LeaseDuration: 5 * time.Second, RenewDeadline: 10 * time.Second}, "--renew-deadline"},
	} {
		err := tc.o.Validate()
		if !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), tc.flag) {
			t.Errorf("%+v: %v, want ErrUsage naming %s", tc.o, err, tc.flag)
		}
	}
}
