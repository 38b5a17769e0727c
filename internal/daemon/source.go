package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"os"
	"time"

	"github.com/kadmit/kadmit/pkg/webhookcerts"

	"github.com/kadmit/kadmit/internal/certs"
	"github.com/kadmit/kadmit/internal/lifecycle"
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

// selfManagedSpec checks the self-managed flags and derives the serving
// certificate's spec; SANs come from certs.Names.ServiceSANs.
func (d *daemon) selfManagedSpec() (webhookcerts.Spec, error) {
	o := d.opts
	kt, err := webhookcerts.ParseKeyType(o.KeyType)
	if err != nil {
		return webhookcerts.Spec{}, usage("--key-type: %v", err)
	}
	if o.Namespace == "" || o.SecretName == "" {
		return webhookcerts.Spec{}, usage("--tls=self-managed needs --namespace and --secret-name")
	}
	if o.ServingValidity < time.Minute || o.CAValidity < o.ServingValidity {
		return webhookcerts.Spec{}, usage("validities must be >= 1m with --ca-validity >= --serving-validity")
	}
	spec := webhookcerts.Spec{KeyType: kt, ServingValidity: o.ServingValidity, CAValidity: o.CAValidity}
	if spec.DNSNames, spec.IPs, err = d.names.ServiceSANs(); err != nil {
		return webhookcerts.Spec{}, usage("--tls=self-managed needs --service-name or --webhook-url with a host: %v", err)
	}
	return spec, nil
}

func (d *daemon) selfManagedSource() error {
	spec, err := d.selfManagedSpec()
	if err != nil {
		return err
	}
	identity := d.opts.Identity
	if identity == "" {
		identity, _ = os.Hostname()
	}
	o := d.opts
	d.manager, err = lifecycle.New(lifecycle.Options{
		Client: d.client, Namespace: o.Namespace, SecretName: o.SecretName, Spec: spec, Probe: d.probe(),
		LeaseName: o.LeaseName, Identity: identity, LeaseDuration: o.LeaseDuration,
		RenewDeadline: o.RenewDeadline, RetryPeriod: o.RetryPeriod, SettleDelay: o.SettleDelay,
		Metrics: d.certs, Logger: d.log,
	})
	if err != nil {
		return usage("%v", err)
	}
	d.source = d.manager
	return nil
}
