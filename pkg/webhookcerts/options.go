package webhookcerts

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
)

// WebhookType says which kind of object a WebhookInfo names. The values
// are cert-controller's (rotator.Validating, Mutating, CRDConversion).
type WebhookType int

const (
	// Validating: a ValidatingWebhookConfiguration; every webhook in it
	// gets the caBundle.
	Validating WebhookType = iota
	// Mutating: a MutatingWebhookConfiguration; every webhook in it gets
	// the caBundle.
	Mutating
	// CRDConversion: a CustomResourceDefinition whose
	// spec.conversion.webhook gets the caBundle.
	CRDConversion
)

// String is the Kind of the object the type names.
func (t WebhookType) String() string {
	switch t {
	case Validating:
		return "ValidatingWebhookConfiguration"
	case Mutating:
		return "MutatingWebhookConfiguration"
	case CRDConversion:
		return "CustomResourceDefinition"
	}
	return fmt.Sprintf("WebhookType(%d)", int(t))
}

// WebhookInfo names one object whose caBundle the Rotator owns.
type WebhookInfo struct {
	Type WebhookType
	// Name is the configuration's name, or the CRD's (e.g.
	// "workloads.kueue.x-k8s.io").
	Name string
}

// ServiceRef is the Service the API server calls the webhooks through
// (clientConfig.service).
type ServiceRef struct {
	Namespace, Name string
	// Port is the Service port (not the target port); 0 means 443.
	Port int32
}

// ServerName is the name the API server verifies the served certificate
// for: "<Name>.<Namespace>.svc".
func (s ServiceRef) ServerName() string { return s.Name + "." + s.Namespace + ".svc" }

// Defaults of Options.
const (
	DefaultCertName        = "tls.crt"
	DefaultKeyName         = "tls.key"
	DefaultClusterDomain   = "cluster.local"
	DefaultFieldManager    = "webhookcerts"
	DefaultServicePort     = 443
	DefaultCAValidity      = 10 * 365 * 24 * time.Hour
	DefaultServingValidity = 365 * 24 * time.Hour
)

// Options configure a Rotator. Only SecretKey and a Service (or a DNSName)
// are required; Validate says what is wrong.
type Options struct {
	// SecretKey is the certificate Secret (keys tls.crt, tls.key, ca.crt,
	// ca.key and, during a CA rotation, ca-cross.crt). It may not exist
	// yet, exist empty (a chart's placeholder) or be cert-controller's:
	// its CA is kept.
	SecretKey types.NamespacedName

	// Service is the Service the webhooks are called through. The serving
	// certificate's SANs are <Name>, <Name>.<Namespace>,
	// <Name>.<Namespace>.svc and <Name>.<Namespace>.svc.<ClusterDomain>,
	// plus DNSName and ExtraDNSNames; its ready endpoints are probed before
	// an old CA leaves the bundle.
	Service *ServiceRef
	// ClusterDomain; default "cluster.local".
	ClusterDomain string
	// DNSName is cert-controller's: the name the API server verifies. One
	// of the shape "<svc>.<ns>.svc" fills Service when Service is nil; any
	// other (a webhook called by URL) is a SAN, and the verified name, and
	// then only this replica's certificate is checked before an old CA is
	// dropped. An IP literal (a URL such as https://127.0.0.1:9443) is an
	// IP SAN.
	DNSName string
	// ExtraDNSNames are additional SANs; IP literals among them are IP
	// SANs.
	ExtraDNSNames []string

	// Webhooks are the objects whose caBundle the Rotator injects and
	// watches (by server-side apply of exactly that field) when Injector
	// is nil. The Rotator never touches any other.
	Webhooks []WebhookInfo
	// Injector, when set, writes and reads the caBundles in place of the
	// server-side apply on Webhooks (which must then be empty): for a
	// server that already writes its own webhook configurations. See
	// Injector for what it must do.
	Injector Injector

	// RotateAnnotation is the Secret annotation that forces a rotation
	// (values RotateServing, RotateCA); default RotateAnnotation.
	RotateAnnotation string

	// Observer, when set, is told of loads, rotations and load errors
	// (metrics).
	Observer Observer

	// Holder, when set, is where the served certificate is kept (a server
	// that already reads its certificate from it); default one of the
	// Rotator's own.
	Holder *Holder

	// IsReady, when set, is closed once: when the first certificate is
	// served, CertDir is written, and the caBundle of every owned object
	// that exists, as the API server returns it, verifies the served
	// certificate.
	IsReady chan struct{}

	// CertDir, when set, receives CertName and KeyName (the serving chain
	// and key, PEM), rewritten atomically (a temporary file renamed)
	// whenever they change; for servers that read files. A read-only
	// CertDir (a mounted Secret) is left to the kubelet. CertName
	// defaults to "tls.crt", KeyName to "tls.key".
	CertDir, CertName, KeyName string

	// CAName is the CA subject's CommonName prefix (the CN is
	// "<CAName>@<unix>.<hex>"); default DefaultCAName. CAOrganization is
	// its Organization; none by default.
	CAName, CAOrganization string
	// KeyType of new keys; default ECDSAP256.
	KeyType KeyType
	// CAValidity (default 10 years) and ServingValidity (default 1 year)
	// are the lifetimes; each is renewed at 2/3 of it.
	CAValidity, ServingValidity time.Duration

	// FieldManager of every write; default "webhookcerts".
	FieldManager string
	// Logger; default logr.Discard().
	Logger logr.Logger
	// Clock; default time.Now.
	Clock func() time.Time
}

// Injector writes the caBundle of the webhooks a Rotator's certificate is
// trusted through, and reads it back; Options.Injector. The built-in one
// server-side applies Options.Webhooks. Every method may be called from
// several goroutines.
type Injector interface {
	// Inject makes every owned webhook's caBundle bundle (PEM, the
	// Secret's ca.crt, newest CA first), which is the Secret's generation
	// generation (GenerationAnnotation). It must not write an object whose
	// recorded generation is above generation: a replica whose Secret
	// informer lags would revert a newer bundle. It returns nil when the
	// bundles already hold bundle, or when the write is deferred for a
	// reason of the Injector's own (it then retries on its own); else the
	// write's error.
	Inject(ctx context.Context, bundle []byte, generation int64) error
	// Bundles returns every owned webhook's caBundle, keyed by a name for
	// messages (e.g. `ValidatingWebhookConfiguration "x" webhook "y"`),
	// and the highest generation recorded on the owned objects (0: none).
	// live reads the API server (a GET); otherwise a cache may answer. A
	// missing object contributes nothing; an empty map means none exists.
	Bundles(ctx context.Context, live bool) (bundles map[string][]byte, generation int64, err error)
	// OnChange registers f, to be called whenever an owned object changes
	// (a blanked caBundle, a deleted configuration): the Rotator then
	// reconciles at once. NewForClients calls it.
	OnChange(f func())
}

// Observer is told what the Rotator does, e.g. to count it in metrics. Its
// methods are called synchronously and must not block.
type Observer interface {
	// OnLoad: a serving certificate (leaf) issued by ca (the Secret's
	// signing CA) is now served.
	OnLoad(leaf, ca *x509.Certificate)
	// OnRotate: this replica wrote a new certificate into the Secret, kind
	// RotateServing or RotateCA.
	OnRotate(kind string)
	// OnError: the Secret's material did not load (it is unusable), or
	// CertDir was not written; the served certificate is kept.
	OnError(err error)
}

// ErrInvalidOptions is wrapped by every error of Options.Validate.
var ErrInvalidOptions = errors.New("webhookcerts: invalid options")

// Validate reports every problem of o in one error wrapping
// ErrInvalidOptions, or nil. Defaults are not applied to o.
func (o Options) Validate() error {
	_, err := o.complete()
	return err
}

// complete returns o with defaults applied and Service derived from
// DNSName, or an error wrapping ErrInvalidOptions listing every problem.
func (o Options) complete() (Options, error) {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	if o.SecretKey.Namespace == "" || o.SecretKey.Name == "" {
		bad("SecretKey needs a namespace and a name (got %q)", o.SecretKey.String())
	} else if msgs := validation.IsDNS1123Subdomain(o.SecretKey.Name); len(msgs) > 0 {
		bad("SecretKey name %q: %s", o.SecretKey.Name, strings.Join(msgs, "; "))
	}

	if o.ClusterDomain == "" {
		o.ClusterDomain = DefaultClusterDomain
	}
	if o.Service == nil && o.DNSName != "" {
		if parts := strings.Split(o.DNSName, "."); len(parts) == 3 && parts[2] == "svc" && parts[0] != "" && parts[1] != "" {
			o.Service = &ServiceRef{Name: parts[0], Namespace: parts[1]}
		}
	}
	if o.Service != nil {
		svc := *o.Service // never write through the caller's pointer
		if svc.Port == 0 {
			svc.Port = DefaultServicePort
		}
		if svc.Name == "" || svc.Namespace == "" {
			bad("Service needs a namespace and a name (got %q/%q)", svc.Namespace, svc.Name)
		}
		if svc.Port < 1 || svc.Port > 65535 {
			bad("Service port %d is not in 1-65535", svc.Port)
		}
		o.Service = &svc
	} else if o.DNSName == "" {
		bad("a Service (or a DNSName) is required: it is the name the API server verifies")
	}
	for _, n := range append([]string{o.DNSName}, o.ExtraDNSNames...) {
		if n == "" || net.ParseIP(n) != nil {
			continue
		}
		if msgs := validation.IsDNS1123Subdomain(strings.TrimPrefix(n, "*.")); len(msgs) > 0 {
			bad("DNS name %q: %s", n, strings.Join(msgs, "; "))
		}
	}

	if o.Injector != nil && len(o.Webhooks) > 0 {
		bad("Webhooks (%d) and an Injector are both set: the Injector owns the caBundles", len(o.Webhooks))
	}
	if o.RotateAnnotation == "" {
		o.RotateAnnotation = RotateAnnotation
	}
	seen := map[WebhookInfo]bool{}
	for i, w := range o.Webhooks {
		switch {
		case w.Type != Validating && w.Type != Mutating && w.Type != CRDConversion:
			bad("Webhooks[%d] %q: unknown type %d (want Validating, Mutating or CRDConversion)", i, w.Name, int(w.Type))
		case w.Name == "":
			bad("Webhooks[%d]: a %s needs a name", i, w.Type)
		case seen[w]:
			bad("Webhooks[%d]: %s %q is listed twice", i, w.Type, w.Name)
		}
		seen[w] = true
	}

	if o.CertName == "" {
		o.CertName = DefaultCertName
	}
	if o.KeyName == "" {
		o.KeyName = DefaultKeyName
	}
	for _, f := range []string{o.CertName, o.KeyName} {
		if f != filepath.Base(f) || f == "." || f == ".." {
			bad("CertName and KeyName must be file names, not paths (got %q)", f)
		}
	}
	if o.CertName == o.KeyName {
		bad("CertName and KeyName are both %q", o.CertName)
	}

	if o.CAName == "" {
		o.CAName = DefaultCAName
	}
	kt, err := ParseKeyType(string(o.KeyType))
	if err != nil {
		bad("KeyType: %w", err)
	}
	o.KeyType = kt
	if o.CAValidity == 0 {
		o.CAValidity = DefaultCAValidity
	}
	if o.ServingValidity == 0 {
		o.ServingValidity = DefaultServingValidity
	}
	switch {
	case o.CAValidity < 0 || o.ServingValidity < 0:
		bad("CAValidity (%s) and ServingValidity (%s) must be positive", o.CAValidity, o.ServingValidity)
	case o.ServingValidity > o.CAValidity:
		bad("ServingValidity (%s) is longer than CAValidity (%s)", o.ServingValidity, o.CAValidity)
	case o.ServingValidity < 3*time.Minute:
		bad("ServingValidity (%s) is under 3m: it would be renewed every minute or more often", o.ServingValidity)
	}

	if o.FieldManager == "" {
		o.FieldManager = DefaultFieldManager
	}
	if o.Logger.GetSink() == nil {
		o.Logger = logr.Discard()
	}
	if o.Clock == nil {
		o.Clock = time.Now
	}
	if len(errs) > 0 {
		return o, fmt.Errorf("%w: %w", ErrInvalidOptions, errors.Join(errs...))
	}
	return o, nil
}

// serverName is the name the API server verifies: the Service's
// <svc>.<ns>.svc, else DNSName.
func (o Options) serverName() string {
	if o.Service != nil {
		return o.Service.ServerName()
	}
	return o.DNSName
}

// spec is the certificate Spec of completed options: the Service's four
// names, DNSName and ExtraDNSNames, without repeats.
func (o Options) spec() Spec {
	var names []string
	var ips []net.IP
	if s := o.Service; s != nil {
		names = append(names, s.Name, s.Name+"."+s.Namespace, s.ServerName(), s.ServerName()+"."+o.ClusterDomain)
	}
	for _, n := range append([]string{o.DNSName}, o.ExtraDNSNames...) {
		if ip := net.ParseIP(n); ip != nil {
			if !slices.ContainsFunc(ips, ip.Equal) {
				ips = append(ips, ip)
			}
		} else if n != "" && !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	return Spec{
		DNSNames:        names,
		IPs:             ips,
		KeyType:         o.KeyType,
		ServingValidity: o.ServingValidity,
		CAValidity:      o.CAValidity,
		CAName:          o.CAName,
		CAOrganization:  o.CAOrganization,
	}
}
