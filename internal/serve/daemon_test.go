package serve

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/kadmit/kadmit/pkg/webhookcerts"

	"github.com/kadmit/kadmit/internal/registration"
)

// selfManaged runs the self-managed steps that need no cluster: validate,
// the source's options, the Rotator (on a fake client, not started).
func selfManaged(t *testing.T, o Options) *daemon {
	t.Helper()
	d := &daemon{opts: o, client: fake.NewClientset(), log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if err := d.validate(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := d.selfManagedSource(); err != nil {
		t.Fatal(err)
	}
	if err := d.newRotator(context.Background()); err != nil {
		t.Fatal(err)
	}
	return d
}

func TestSelfManagedServiceMode(t *testing.T) {
	d := selfManaged(t, Options{TLSMode: TLSSelfManaged,
		Namespace: "kadmit-system", SecretName: "kadmit-tls", ServiceName: "kadmit", ServicePort: 8443, ClusterDomain: "cluster.local",
		ServingValidity: time.Hour, CAValidity: 10 * time.Hour, SANs: []string{"extra.example", "198.18.0.2", "kadmit"},
	})
	if d.serverName != "kadmit.kadmit-system.svc" {
		t.Fatalf("server name %q", d.serverName)
	}
	o := d.rotator.opts
	if o.Service == nil || *o.Service != (webhookcerts.ServiceRef{Namespace: "kadmit-system", Name: "kadmit", Port: 8443}) || o.DNSName != "" {
		t.Fatalf("Service %+v, DNSName %q", o.Service, o.DNSName)
	}
	if o.RotateAnnotation != "kadmit.io/rotate" || o.FieldManager != registration.FieldManager || o.Injector != nil {
		t.Fatalf("annotation %q, field manager %q, injector %v", o.RotateAnnotation, o.FieldManager, o.Injector)
	}
	want := []string{"kadmit", "kadmit.kadmit-system", "kadmit.kadmit-system.svc", "kadmit.kadmit-system.svc.cluster.local", "extra.example", "198.18.0.2"}
	if got := d.source.SANs(); !slices.Equal(got, want) {
		t.Fatalf("SANs %v, want %v (no repeats)", got, want)
	}
	if d.rotator.r.Holder() != d.source.Holder() {
		t.Fatal("the Rotator serves into a Holder the server does not read")
	}
}

func TestSelfManagedURLMode(t *testing.T) {
	d := selfManaged(t, Options{TLSMode: TLSSelfManaged,
		Namespace: "kadmit-system", SecretName: "kadmit-tls", WebhookURL: "https://127.0.0.1:9443", ServiceName: "kadmit",
		ServingValidity: time.Hour, CAValidity: time.Hour,
	})
	if d.serverName != "127.0.0.1" || d.rotator.opts.Service != nil || d.rotator.opts.DNSName != "127.0.0.1" {
		t.Fatalf("name %q, options %+v", d.serverName, d.rotator.opts)
	}
	if got := d.source.SANs(); !slices.Equal(got, []string{"127.0.0.1"}) {
		t.Fatalf("SANs %v", got)
	}
	if d.probe() != nil {
		t.Fatal("URL mode probes Service endpoints")
	}
}

func TestUsageErrors(t *testing.T) {
	base := Options{TLSMode: TLSSelfManaged, Namespace: "ns", SecretName: "s", ServiceName: "svc", ServingValidity: time.Hour, CAValidity: time.Hour}
	for name, mutate := range map[string]func(*Options){
		"key type":           func(o *Options) { o.KeyType = "dsa-1024" },
		"short validity":     func(o *Options) { o.ServingValidity = 2 * time.Minute },
		"CA shorter":         func(o *Options) { o.CAValidity = time.Minute },
		"no service, no url": func(o *Options) { o.ServiceName = "" },
		"url without a host": func(o *Options) { o.WebhookURL = "https://:9443" },
		"no secret name":     func(o *Options) { o.SecretName = "" },
	} {
		o := base
		mutate(&o)
		d := &daemon{opts: o}
		err := d.validate(context.Background())
		if err == nil {
			_, err = d.selfManagedOptions()
		}
		if !errors.Is(err, ErrUsage) {
			t.Errorf("%s: err = %v, want ErrUsage", name, err)
		}
	}
	for name, o := range map[string]Options{
		"file and ConfigMap": {ConfigFile: "x.yaml", ConfigMap: "ns/name"},
		"ConfigMap no slash": {ConfigMap: "name"},
	} {
		if _, err := loadConfig(context.Background(), nil, o); !errors.Is(err, ErrUsage) {
			t.Errorf("%s: err = %v, want ErrUsage", name, err)
		}
	}
	if err := (&daemon{opts: Options{TLSMode: TLSSelfSigned}}).selfSignedSource(); !errors.Is(err, ErrUsage) {
		t.Errorf("self-signed without SANs: %v", err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	for name, o := range map[string]Options{
		"--tls=bogus":                              {TLSMode: "bogus"},
		"files without --cert-dir":                 {TLSMode: TLSFiles},
		"files --register, no bundle file":         {TLSMode: TLSFiles, CertDir: t.TempDir(), Register: true, WebhookURL: "https://127.0.0.1:1"},
		"--register without URL or Service":        {TLSMode: TLSSelfSigned, SANs: []string{"localhost"}, Register: true},
		"--policies-configmap without a namespace": {TLSMode: TLSSelfSigned, SANs: []string{"localhost"}, PolicyConfigMap: "policies"},
	} {
		if err := Run(context.Background(), o, quiet); !errors.Is(err, ErrUsage) {
			t.Errorf("Run with %s: %v, want ErrUsage", name, err)
		}
	}
}
