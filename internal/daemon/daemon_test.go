package daemon

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"slices"
	"testing"
	"time"
)

func TestSelfManagedSpecServiceMode(t *testing.T) {
	d := &daemon{opts: Options{TLSMode: TLSSelfManaged,
		Namespace: "kadmit-system", SecretName: "kadmit-tls", ServiceName: "kadmit", ClusterDomain: "cluster.local",
		ServingValidity: time.Hour, CAValidity: 10 * time.Hour, SANs: []string{"extra.example", "198.18.0.2", "kadmit"},
	}}
	if err := d.validate(context.Background()); err != nil {
		t.Fatal(err)
	}
	spec, err := d.selfManagedSpec()
	if err != nil {
		t.Fatal(err)
	}
	if d.serverName != "kadmit.kadmit-system.svc" {
		t.Fatalf("server name %q", d.serverName)
	}
	want := []string{"extra.example", "kadmit", "kadmit.kadmit-system", "kadmit.kadmit-system.svc", "kadmit.kadmit-system.svc.cluster.local"}
	if !slices.Equal(spec.DNSNames, want) {
		t.Fatalf("DNS SANs %v, want %v (no repeats)", spec.DNSNames, want)
	}
	if len(spec.IPs) != 1 || !spec.IPs[0].Equal(net.ParseIP("198.18.0.2")) {
		t.Fatalf("IP SANs %v", spec.IPs)
	}
}

func TestSelfManagedSpecURLMode(t *testing.T) {
	d := &daemon{opts: Options{TLSMode: TLSSelfManaged,
		Namespace: "kadmit-system", SecretName: "kadmit-tls", WebhookURL: "https://127.0.0.1:9443", ServiceName: "kadmit",
		ServingValidity: time.Hour, CAValidity: time.Hour,
	}}
	if err := d.validate(context.Background()); err != nil {
		t.Fatal(err)
	}
	spec, err := d.selfManagedSpec()
	if err != nil {
		t.Fatal(err)
	}
	if d.serverName != "127.0.0.1" || len(spec.IPs) != 1 || len(spec.DNSNames) != 0 {
		t.Fatalf("name %q spec %+v", d.serverName, spec)
	}
	if d.probe() != nil {
		t.Fatal("URL mode probes Service endpoints")
	}
}

func TestUsageErrors(t *testing.T) {
	base := Options{TLSMode: TLSSelfManaged, Namespace: "ns", SecretName: "s", ServiceName: "svc", ServingValidity: time.Hour, CAValidity: time.Hour}
	for name, mutate := range map[string]func(*Options){
		"key type":           func(o *Options) { o.KeyType = "dsa-1024" },
		"short validity":     func(o *Options) { o.ServingValidity = time.Second },
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
			_, err = d.selfManagedSpec()
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
