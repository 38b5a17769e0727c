package webhookcerts

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

func TestOptionsValidate(t *testing.T) {
	ok := testOptions()
	for name, tc := range map[string]struct {
		edit func(*Options)
		want string // substring of the error; "" means valid
	}{
		"valid":           {func(*Options) {}, ""},
		"no secret name":  {func(o *Options) { o.SecretKey = types.NamespacedName{Namespace: "x"} }, "SecretKey needs a namespace and a name"},
		"bad secret name": {func(o *Options) { o.SecretKey.Name = "Bad_Name" }, "SecretKey name"},
		"no service":      {func(o *Options) { o.Service = nil }, "a Service (or a DNSName) is required"},
		"service no ns":   {func(o *Options) { o.Service = &ServiceRef{Name: "x"} }, "Service needs a namespace and a name"},
		"service port":    {func(o *Options) { o.Service = &ServiceRef{Name: "x", Namespace: "y", Port: 70000} }, "port 70000"},
		"duplicate webhook": {func(o *Options) {
			o.Webhooks = append(o.Webhooks, WebhookInfo{Type: Validating, Name: "v"})
		}, `"v" is listed twice`},
		"unnamed webhook":     {func(o *Options) { o.Webhooks = []WebhookInfo{{Type: Mutating}} }, "needs a name"},
		"unknown type":        {func(o *Options) { o.Webhooks = []WebhookInfo{{Type: 7, Name: "x"}} }, "unknown type 7"},
		"cert name is a path": {func(o *Options) { o.CertName = "../tls.crt" }, "file names, not paths"},
		"same file names":     {func(o *Options) { o.CertName, o.KeyName = "a", "a" }, "both"},
		"key type":            {func(o *Options) { o.KeyType = "dsa" }, "unsupported key type"},
		"serving > ca":        {func(o *Options) { o.ServingValidity = 2 * DefaultCAValidity }, "longer than CAValidity"},
		"negative":            {func(o *Options) { o.CAValidity = -time.Hour }, "must be positive"},
		"bad dns name":        {func(o *Options) { o.ExtraDNSNames = []string{"no spaces allowed"} }, "DNS name"},
	} {
		t.Run(name, func(t *testing.T) {
			o := ok
			o.Webhooks = append([]WebhookInfo(nil), ok.Webhooks...)
			tc.edit(&o)
			err := o.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ErrInvalidOptions)):
				t.Fatalf("error %v, want one containing %q wrapping ErrInvalidOptions", err, tc.want)
			}
		})
	}
}

// cert-controller's DNSName of the shape svc.ns.svc fills Service; its SANs
// are the Service's four names plus ExtraDNSNames, without repeats. Any
// other DNSName is the verified name, with no Service.
func TestOptionsDNSNameAndSANs(t *testing.T) {
	o := Options{
		SecretKey:     types.NamespacedName{Namespace: "kueue-system", Name: "kueue-webhook-server-cert"},
		DNSName:       "kueue-webhook-service.kueue-system.svc",
		ExtraDNSNames: []string{"kueue-webhook-service", "webhook.example.com"},
		ClusterDomain: "corp.local",
	}
	c, err := o.complete()
	if err != nil {
		t.Fatal(err)
	}
	if c.Service == nil || *c.Service != (ServiceRef{Namespace: "kueue-system", Name: "kueue-webhook-service", Port: 443}) {
		t.Fatalf("Service = %+v", c.Service)
	}
	want := []string{"kueue-webhook-service", "kueue-webhook-service.kueue-system", "kueue-webhook-service.kueue-system.svc",
		"kueue-webhook-service.kueue-system.svc.corp.local", "webhook.example.com"}
	if got := c.spec().DNSNames; !reflect.DeepEqual(got, want) {
		t.Errorf("SANs %v, want %v", got, want)
	}
	if c.serverName() != "kueue-webhook-service.kueue-system.svc" || c.CertName != "tls.crt" || c.KeyName != "tls.key" ||
		c.FieldManager != "webhookcerts" || c.CAValidity != DefaultCAValidity || c.ServingValidity != DefaultServingValidity || c.KeyType != ECDSAP256 {
		t.Errorf("defaults: %+v", c)
	}
	if o.Service != nil {
		t.Error("complete wrote to the caller's Options")
	}

	url := Options{SecretKey: o.SecretKey, DNSName: "webhook.example.com"}
	c, err = url.complete()
	if err != nil {
		t.Fatal(err)
	}
	if c.Service != nil || c.serverName() != "webhook.example.com" || !reflect.DeepEqual(c.spec().DNSNames, []string{"webhook.example.com"}) {
		t.Errorf("URL mode: Service %+v, name %s, SANs %v", c.Service, c.serverName(), c.spec().DNSNames)
	}
}

func TestNewForClientsErrors(t *testing.T) {
	c := newCluster(t)
	if _, err := NewForClients(c.kube, nil, testOptions()); err == nil {
		t.Error("CRDConversion without a dynamic client: want an error")
	}
	if _, err := NewForClients(nil, c.dyn, testOptions()); err == nil {
		t.Error("nil kubernetes client: want an error")
	}
	if _, err := NewForClients(c.kube, c.dyn, Options{}); !errors.Is(err, ErrInvalidOptions) {
		t.Errorf("empty options: %v", err)
	}
	if _, err := New(nil, testOptions()); err == nil {
		t.Error("nil rest.Config: want an error")
	}
}
