package crmanager

import (
	"crypto/tls"
	"errors"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/kadmit/kadmit/pkg/webhookcerts"
)

func newManager(t *testing.T, srv webhook.Server) manager.Manager {
	t.Helper()
	mgr, err := manager.New(&rest.Config{Host: "https://127.0.0.1:1"}, manager.Options{
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		WebhookServer:          srv,
	})
	if err != nil {
		t.Fatal(err)
	}
	return mgr
}

var opts = webhookcerts.Options{
	SecretKey: types.NamespacedName{Namespace: "kueue-system", Name: "kueue-webhook-server-cert"},
	DNSName:   "kueue-webhook-service.kueue-system.svc",
	Webhooks:  []webhookcerts.WebhookInfo{{Type: webhookcerts.Validating, Name: "kueue-validating-webhook-configuration"}},
}

// Add wires the Rotator into the manager's webhook server (GetCertificate
// through TLSOpts, so no CertDir is read) and refuses what it cannot wire.
func TestAdd(t *testing.T) {
	mgr := newManager(t, nil)
	r, err := Add(mgr, opts)
	if err != nil {
		t.Fatal(err)
	}
	if r.NeedLeaderElection() {
		t.Error("the Rotator must run on every replica")
	}
	tlsOpts := mgr.GetWebhookServer().(*webhook.DefaultServer).Options.TLSOpts
	if len(tlsOpts) != 1 {
		t.Fatalf("%d TLSOpts, want 1", len(tlsOpts))
	}
	var cfg tls.Config
	tlsOpts[0](&cfg)
	if cfg.GetCertificate == nil {
		t.Fatal("TLSOpt did not set GetCertificate")
	}
	if _, err := cfg.GetCertificate(nil); !errors.Is(err, webhookcerts.ErrNoCertificate) {
		t.Errorf("before Bootstrap: %v, want ErrNoCertificate", err)
	}

	if _, err := Add(newManager(t, nil), webhookcerts.Options{}); !errors.Is(err, webhookcerts.ErrInvalidOptions) {
		t.Errorf("invalid options: %v", err)
	}
	if _, err := Add(nil, opts); err == nil {
		t.Error("nil manager: want an error")
	}
	if _, err := Add(newManager(t, otherServer{webhook.NewServer(webhook.Options{})}), opts); err == nil {
		t.Error("a webhook server that is not a *webhook.DefaultServer: want an error")
	}
	if err := Attach(newManager(t, nil), nil); err == nil {
		t.Error("nil rotator: want an error")
	}
}

type otherServer struct{ webhook.Server }

// ReadyzCheck fails while the Rotator has not started (nothing verified
// against a live caBundle yet), whatever the webhook server says.
func TestReadyzCheckNeedsTheRotator(t *testing.T) {
	mgr := newManager(t, nil)
	r, err := Add(mgr, opts)
	if err != nil {
		t.Fatal(err)
	}
	err = ReadyzCheck(mgr, r)(nil)
	if !errors.Is(err, webhookcerts.ErrNotStarted) {
		t.Fatalf("ReadyzCheck before Start = %v, want ErrNotStarted", err)
	}
}
