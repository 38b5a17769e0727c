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
	spec, name, err := selfManagedSpec(Options{
		Namespace: "kadmit-system", SecretName: "kadmit-tls", ServiceName: "kadmit", ClusterDomain: "cluster.local",
		ServingValidity: time.Hour, CAValidity: 10 * time.Hour, SANs: []string{"extra.example", "198.18.0.2", "kadmit"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if name != "kadmit.kadmit-system.svc" {
		t.Fatalf("server name %q", name)
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
	spec, name, err := selfManagedSpec(Options{
		Namespace: "kadmit-system", SecretName: "kadmit-tls", WebhookURL: "https://127.0.0.1:9443",
		ServingValidity: time.Hour, CAValidity: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	if name != "127.0.0.1" || len(spec.IPs) != 1 || len(spec.DNSNames) != 0 {
		t.Fatalf("name %q spec %+v", name, spec)
	}
	if got := apiServerName(Options{WebhookURL: "https://127.0.0.1:9443"}); got != "127.0.0.1" {
		t.Fatalf("apiServerName in URL mode: %q", got)
	}
	if got := apiServerName(Options{ServiceName: "kadmit", Namespace: "ns"}); got != "kadmit.ns.svc" {
		t.Fatalf("apiServerName in Service mode: %q", got)
	}
}

func TestUsageErrors(t *testing.T) {
	base := Options{Namespace: "ns", SecretName: "s", ServiceName: "svc", ServingValidity: time.Hour, CAValidity: time.Hour}
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
		if _, _, err := selfManagedSpec(o); !errors.Is(err, ErrUsage) {
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
	if _, err := selfSigned(nil, ""); !errors.Is(err, ErrUsage) {
		t.Errorf("self-signed without SANs: %v", err)
	}
	if err := Run(context.Background(), Options{TLSMode: "bogus"}, slog.New(slog.NewTextHandler(io.Discard, nil))); !errors.Is(err, ErrUsage) {
		t.Errorf("Run with --tls=bogus: %v, want ErrUsage", err)
	}
}
