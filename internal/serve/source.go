package serve

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kadmit/kadmit/pkg/webhookcerts"

	"github.com/kadmit/kadmit/internal/certs"
	"github.com/kadmit/kadmit/internal/metrics"
	"github.com/kadmit/kadmit/internal/registration"
)

// newSource builds the certificate source --tls names.
func (d *daemon) newSource(ctx context.Context) error {
	switch d.opts.TLSMode {
	case TLSSelfSigned:
		return d.selfSignedSource()
	case TLSFiles:
		return d.filesSource()
	default:
		return d.selfManagedSource()
	}
}

func (d *daemon) selfSignedSource() error {
	dns, ips, err := d.names.DevSANs()
	if errors.Is(err, webhookcerts.ErrNoSANs) {
		return usage("--tls=self-signed needs --dns-name or --webhook-url")
	}
	if err != nil {
		return err
	}
	s, err := certs.NewSelfSignedSource(certs.SelfSignedOptions{DNSNames: dns, IPs: ips})
	if err != nil {
		return err
	}
	if d.opts.CAFile != "" {
		if err := s.WriteCA(d.opts.CAFile); err != nil {
			return err
		}
	}
	d.certs.Loaded(s.Leaf(), nil)
	d.log.Info("issued self-signed serving certificate", "sans", s.SANs(), "notAfter", s.Leaf().NotAfter, "caFile", d.opts.CAFile)
	d.source = s
	return nil
}

func (d *daemon) filesSource() error {
	s, err := certs.NewFilesSource(certs.FilesOptions{
		Dir: d.opts.CertDir, BundleFile: d.opts.CABundleFile, Logger: d.log,
		OnReload: func(c *tls.Certificate) {
			d.certs.Loaded(c.Leaf, nil)
			d.log.Info("serving certificate loaded", "dir", d.opts.CertDir, "sans", certs.LeafSANs(c.Leaf), "notAfter", c.Leaf.NotAfter)
		},
		OnError: func(error) { d.certs.ReloadError() },
	})
	if err != nil {
		return usage("--tls=files: %v", err)
	}
	d.source = s
	return nil
}

// selfManagedOptions checks the self-managed flags and derives the
// Rotator's options: the Secret, and the Service (or in dev mode the
// --webhook-url host) the API server verifies; the certificate's SANs are
// certs.Names.ServiceSANs'. The Injector is set once the registrar exists
// (newRotator).
func (d *daemon) selfManagedOptions() (webhookcerts.Options, error) {
	o := d.opts
	kt, err := webhookcerts.ParseKeyType(o.KeyType)
	if err != nil {
		return webhookcerts.Options{}, usage("--key-type: %v", err)
	}
	if o.Namespace == "" || o.SecretName == "" {
		return webhookcerts.Options{}, usage("--tls=self-managed needs --namespace and --secret-name")
	}
	if o.ServingValidity < 3*time.Minute || o.CAValidity < o.ServingValidity {
		return webhookcerts.Options{}, usage("validities must be >= 3m with --ca-validity >= --serving-validity")
	}
	if _, _, err := d.names.ServiceSANs(); err != nil {
		return webhookcerts.Options{}, usage("--tls=self-managed needs --service-name or --webhook-url with a host: %v", err)
	}
	wo := webhookcerts.Options{
		SecretKey:     types.NamespacedName{Namespace: o.Namespace, Name: o.SecretName},
		ClusterDomain: o.ClusterDomain,
		ExtraDNSNames: o.SANs,
		KeyType:       kt,
		CAValidity:    o.CAValidity, ServingValidity: o.ServingValidity,
		FieldManager:     registration.FieldManager,
		RotateAnnotation: RotateAnnotation,
		Observer:         certsObserver{d.certs},
		Logger:           logr.FromSlogHandler(d.log.With("component", "tls-lifecycle").Handler()),
	}
	if o.WebhookURL != "" {
		// The API server calls this process by URL: the host is the name
		// it verifies (an IP literal is an IP SAN); only this replica is
		// checked before an old CA is dropped.
		wo.DNSName = d.serverName
	} else {
		wo.Service = &webhookcerts.ServiceRef{Namespace: o.Namespace, Name: o.ServiceName, Port: o.ServicePort}
	}
	if err := wo.Validate(); err != nil {
		return webhookcerts.Options{}, usage("--tls=self-managed: %v", err)
	}
	return wo, nil
}

// RotateAnnotation on the certificate Secret forces a rotation ("serving"
// or "ca"); kadmit's name for webhookcerts.RotateAnnotation, kept for the
// runbooks and alert rules that name it.
const RotateAnnotation = "kadmit.io/rotate"

// selfManagedSource prepares the self-managed source; newRotator builds its
// Rotator once the registrar, its Injector, exists.
func (d *daemon) selfManagedSource() error {
	opts, err := d.selfManagedOptions()
	if err != nil {
		return err
	}
	d.rotator = &rotatorSource{opts: opts, log: d.log}
	d.source = d.rotator
	return nil
}

// newRotator builds the self-managed Rotator: with --register the registrar
// writes the caBundles (it writes the whole configurations anyway) and is
// the Rotator's Injector; without, nobody's caBundles are kadmit's to
// write, and the CA rotation's gates look at the Secret and the Service's
// endpoints only.
func (d *daemon) newRotator(context.Context) error {
	if d.rotator == nil {
		return nil
	}
	opts := d.rotator.opts
	if d.opts.Register {
		opts.Injector = d.registrar
	}
	opts.Holder = &d.rotator.holder
	r, err := webhookcerts.NewForClients(d.client, nil, opts)
	if err != nil {
		return usage("--tls=self-managed: %v", err)
	}
	d.rotator.r = r
	return nil
}

// rotatorSource is the self-managed certs.Source: a webhookcerts.Rotator,
// leader-less (every replica runs it; the Secret's resourceVersion orders
// their writes).
type rotatorSource struct {
	log    *slog.Logger
	opts   webhookcerts.Options
	holder webhookcerts.Holder
	r      *webhookcerts.Rotator // set by newRotator
}

var _ certs.Source = (*rotatorSource)(nil)

// Holder implements certs.Source; it is the Rotator's (Options.Holder), so
// the registrar and the server hold it before the Rotator exists.
func (s *rotatorSource) Holder() *webhookcerts.Holder { return &s.holder }

// CABundle implements certs.Source: the served Secret's ca.crt.
func (s *rotatorSource) CABundle() []byte {
	b, _ := s.r.ServedBundle()
	return b
}

// bundle is the registrar's Bundle: the served Secret's ca.crt and its
// generation.
func (s *rotatorSource) bundle() ([]byte, int64) { return s.r.ServedBundle() }

// Start implements certs.Source: Bootstrap (the Secret created, adopted or
// read; its certificate served; the caBundles injected), then the Rotator
// runs until ctx ends. Should its informers not sync, it stops: logged, and
// Ready reports it (webhookcerts.ErrNotStarted) so the replica leaves the
// Service instead of serving a certificate nobody renews.
func (s *rotatorSource) Start(ctx context.Context) error {
	if err := s.r.Bootstrap(ctx); err != nil {
		return fmt.Errorf("self-managed certificates: %w", err)
	}
	go func() {
		if err := s.r.Start(ctx); err != nil {
			s.log.Error("certificate lifecycle stopped", "error", err)
		}
	}()
	return nil
}

// Ready implements certs.Source: the Rotator's informers synced and the
// served certificate is Fresh. Whether the API server trusts it is the
// registrar's check.
func (s *rotatorSource) Ready() error {
	if err := s.r.CertificateCheck(); err != nil {
		return err
	}
	return certs.Fresh(&s.holder, time.Now())
}

// SANs implements certs.Source.
func (s *rotatorSource) SANs() []string { return s.r.SANs() }

// certsObserver counts the Rotator's loads, rotations and load errors in
// kadmit's certificate metrics.
type certsObserver struct{ m *metrics.Certificates }

func (o certsObserver) OnLoad(leaf, ca *x509.Certificate) { o.m.Loaded(leaf, ca) }
func (o certsObserver) OnRotate(kind string)              { o.m.Rotated(kind) }
func (o certsObserver) OnError(error)                     { o.m.ReloadError() }
