package certs

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"

	"github.com/kadmit/kadmit/pkg/webhookcerts"
)

// Names says how the API server reaches kadmit, which fixes the name it
// verifies the serving certificate for and the SANs a certificate kadmit
// issues must carry.
type Names struct {
	// WebhookURL, when set, is the base URL the API server calls (dev
	// mode); its host is the verified name.
	WebhookURL string
	// Service, Namespace and ClusterDomain name kadmit's Service, called as
	// <Service>.<Namespace>.svc when WebhookURL is empty.
	Service, Namespace, ClusterDomain string
	// Extra are additional SANs (DNS names or IP literals), e.g. --dns-name.
	Extra []string
}

// ErrNoName is returned when Names give the API server nothing to dial.
var ErrNoName = errors.New("needs a webhook URL with a host, or a Service name and namespace")

// ServerName is the name the API server verifies: the WebhookURL host, else
// <Service>.<Namespace>.svc. It returns ErrNoName when neither is usable.
func (n Names) ServerName() (string, error) {
	if n.WebhookURL != "" {
		u, err := url.Parse(n.WebhookURL)
		if err != nil || u.Hostname() == "" {
			return "", fmt.Errorf("webhook URL %q has no host: %w", n.WebhookURL, ErrNoName)
		}
		return u.Hostname(), nil
	}
	if n.Service == "" || n.Namespace == "" {
		return "", ErrNoName
	}
	return n.Service + "." + n.Namespace + ".svc", nil
}

// ServiceSANs are the SANs of a certificate kadmit issues for itself:
// Extra, then the WebhookURL host in dev mode, else <svc>, <svc>.<ns>,
// <svc>.<ns>.svc and <svc>.<ns>.svc.<ClusterDomain> (the last only with a
// ClusterDomain); sorted into DNS names and IPs without repeats.
func (n Names) ServiceSANs() (dnsNames []string, ips []net.IP, err error) {
	name, err := n.ServerName()
	if err != nil {
		return nil, nil, err
	}
	sans := append([]string(nil), n.Extra...)
	if n.WebhookURL != "" {
		sans = append(sans, name)
	} else {
		svc, ns := n.Service, n.Namespace
		sans = append(sans, svc, svc+"."+ns, name)
		if n.ClusterDomain != "" {
			sans = append(sans, name+"."+n.ClusterDomain)
		}
	}
	dnsNames, ips = SplitSANs(sans)
	return dnsNames, ips, nil
}

// DevSANs are the SANs of a development (self-signed) certificate: Extra
// and the WebhookURL host, without Service names. Returns webhookcerts.ErrNoSANs when
// that is nothing.
func (n Names) DevSANs() (dnsNames []string, ips []net.IP, err error) {
	sans := append([]string(nil), n.Extra...)
	if u, perr := url.Parse(n.WebhookURL); n.WebhookURL != "" && perr == nil && u.Hostname() != "" {
		sans = append(sans, u.Hostname())
	}
	if len(sans) == 0 {
		return nil, nil, webhookcerts.ErrNoSANs
	}
	dnsNames, ips = SplitSANs(sans)
	return dnsNames, ips, nil
}

// SplitSANs sorts SANs into DNS names and IP literals, in order, dropping
// repeats and empty strings.
func SplitSANs(sans []string) (dnsNames []string, ips []net.IP) {
	seen := map[string]bool{}
	for _, s := range sans {
		if s == "" || seen[s] {
			continue
		}
		seen[s] = true
		if ip := net.ParseIP(s); ip != nil {
			ips = append(ips, ip)
		} else {
			dnsNames = append(dnsNames, s)
		}
	}
	return dnsNames, ips
}

// LeafSANs lists a certificate's DNS and IP SANs as strings, for logs and
// Source.SANs.
func LeafSANs(c *x509.Certificate) []string {
	if c == nil {
		return nil
	}
	out := append([]string(nil), c.DNSNames...)
	for _, ip := range c.IPAddresses {
		out = append(out, ip.String())
	}
	return out
}
