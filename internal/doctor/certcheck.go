package doctor

import (
	"crypto/dsa" //nolint:staticcheck // only to recognise DSA keys as weak
	"crypto/ecdsa"
	"crypto/rsa"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/kadmit/kadmit/pkg/webhookcerts"
)

// certIssue is a certificate problem before the caller adds the fix, which
// depends on where the certificate came from.
type certIssue struct {
	ID       string
	Severity Severity
	What     string
	Why      string
}

// DefaultExpiryWarning is how close to expiry a serving certificate must be
// (and within the last third of its lifetime) for a warning.
const DefaultExpiryWarning = 14 * 24 * time.Hour

// analyzeBundle checks a caBundle on its own (no endpoint needed). service
// tells whether the webhook calls a Service: an empty caBundle then almost
// always means the CA injector has not run, while a URL webhook may rely on
// the API server's system roots.
func analyzeBundle(bundle []byte, service bool, now time.Time) []certIssue {
	if len(strings.TrimSpace(string(bundle))) == 0 {
		if service {
			return []certIssue{{IDCABundleMissing, SeverityError,
				"clientConfig.caBundle is empty.",
				"The API server then verifies the webhook's certificate against its own system roots, which never include an in-cluster CA: every call fails with \"x509: certificate signed by unknown authority\" (usually cert-manager's cainjector or the webhook's own cert controller has not injected the CA yet)."}}
		}
		return []certIssue{{IDCABundleMissing, SeverityInfo,
			"clientConfig.caBundle is empty: the API server verifies the URL's certificate against its system roots.",
			"This works only for certificates from a public CA the API server's host trusts."}}
	}
	cas, err := webhookcerts.ParseCertificates(bundle)
	if err != nil {
		return []certIssue{{IDCABundleUnparsable, SeverityError,
			fmt.Sprintf("clientConfig.caBundle does not parse as PEM certificates: %v.", err),
			"The API server cannot build a trust pool from it: every call fails TLS verification (\"x509: certificate signed by unknown authority\")."}}
	}
	var expired []string
	for _, c := range cas {
		if now.After(c.NotAfter) {
			expired = append(expired, fmt.Sprintf("%q (expired %s)", c.Subject.CommonName, c.NotAfter.UTC().Format(time.RFC3339)))
		}
	}
	switch {
	case len(expired) == len(cas):
		return []certIssue{{IDCABundleExpired, SeverityError,
			fmt.Sprintf("Every CA in clientConfig.caBundle is expired: %s.", strings.Join(expired, ", ")),
			"The API server rejects chains ending at an expired CA: every call fails with \"x509: certificate has expired or is not yet valid\"."}}
	case len(expired) > 0:
		return []certIssue{{IDCABundleExpired, SeverityWarning,
			fmt.Sprintf("%d of %d CAs in clientConfig.caBundle are expired: %s.", len(expired), len(cas), strings.Join(expired, ", ")),
			"Serving certificates signed by the expired CAs fail verification; the others still verify."}}
	}
	return nil
}

// analyzeServing checks the certificate chain an endpoint presented the way
// the API server does: ServerName serverName, the caBundle as the only root
// (system roots when the bundle is empty), plus expiry within warnWithin,
// weak keys and SHA-1 signatures. chain[0] is the leaf.
func analyzeServing(chain []*x509.Certificate, bundle []byte, serverName string, now time.Time, warnWithin time.Duration) []certIssue {
	if len(chain) == 0 {
		return []certIssue{{IDHandshakeFailed, SeverityError, "The endpoint presented no certificate.", "The API server requires a serving certificate."}}
	}
	leaf := chain[0]
	var out []certIssue

	for i, c := range chain {
		switch c.SignatureAlgorithm {
		case x509.SHA1WithRSA, x509.ECDSAWithSHA1, x509.DSAWithSHA1:
			role := "serving certificate"
			if i > 0 {
				role = fmt.Sprintf("intermediate %q", c.Subject.CommonName)
			}
			out = append(out, certIssue{IDSHA1Signature, SeverityError,
				fmt.Sprintf("The %s is signed with %s.", role, c.SignatureAlgorithm),
				"The API server (Go 1.18 and later) refuses SHA-1 signatures: calls fail with \"x509: cannot verify signature: insecure algorithm\"."})
		}
	}

	switch {
	case now.After(leaf.NotAfter):
		out = append(out, certIssue{IDServingCertExpiry, SeverityError,
			fmt.Sprintf("The serving certificate expired at %s (%s ago).", leaf.NotAfter.UTC().Format(time.RFC3339), now.Sub(leaf.NotAfter).Round(time.Second)),
			"Every call fails with \"x509: certificate has expired or is not yet valid\"."})
	case now.Before(leaf.NotBefore):
		out = append(out, certIssue{IDServingCertExpiry, SeverityError,
			fmt.Sprintf("The serving certificate is not valid before %s.", leaf.NotBefore.UTC().Format(time.RFC3339)),
			"Every call fails with \"x509: certificate has expired or is not yet valid\" until then (clock skew between the issuer and the API server?)."})
	default:
		left, life := leaf.NotAfter.Sub(now), leaf.NotAfter.Sub(leaf.NotBefore)
		if left < warnWithin && left < life/3 {
			out = append(out, certIssue{IDServingCertExpiry, SeverityWarning,
				fmt.Sprintf("The serving certificate expires at %s, in %s.", leaf.NotAfter.UTC().Format(time.RFC3339), left.Round(time.Minute)),
				"It is in the last third of its lifetime, past the point where issuers renew: renewal or reload is probably failing. Once it expires every call fails with \"x509: certificate has expired or is not yet valid\"."})
		}
	}

	if weak := weakKey(leaf); weak != "" {
		out = append(out, certIssue{IDWeakKey, SeverityWarning,
			fmt.Sprintf("The serving certificate has a weak key: %s.", weak),
			"Weak keys can be broken; some API server builds and FIPS modes refuse them."})
	}

	sanErr := leaf.VerifyHostname(serverName)
	var chainErr error
	if now.After(leaf.NotAfter) || now.Before(leaf.NotBefore) {
		// Full verification would only repeat the expiry reported above;
		// whether the caBundle is the right CA is a signature question.
		chainErr = signedByBundle(chain, bundle)
	} else {
		chainErr = verifyChain(chain, bundle, now)
	}
	var unknown x509.UnknownAuthorityError
	isUnknown := errors.As(chainErr, &unknown)

	if sanErr != nil {
		why := fmt.Sprintf("The API server calls the webhook as %s and gets \"x509: certificate is valid for %s, not %s\".", serverName, strings.Join(certNames(leaf), ", "), serverName)
		if isUnknown {
			why += " The certificate is also not signed by a CA in the caBundle: it belongs to another service."
		}
		out = append(out, certIssue{IDSANMismatch, SeverityError,
			fmt.Sprintf("The serving certificate is not valid for %s; it is valid for: %s.", serverName, strings.Join(certNames(leaf), ", ")),
			why})
	} else if isUnknown {
		out = append(out, certIssue{IDUnknownAuthority, SeverityError,
			fmt.Sprintf("The serving certificate (issuer %q) is not signed by any CA in clientConfig.caBundle (%s).", leaf.Issuer.CommonName, bundleSubjects(bundle)),
			"Every call fails with \"x509: certificate signed by unknown authority\": the caBundle and the serving certificate are out of step (CA rotated on one side only, or the bundle of another installation)."})
	}
	if chainErr != nil && !isUnknown {
		var inv x509.CertificateInvalidError
		if errors.As(chainErr, &inv) && inv.Reason == x509.Expired {
			out = append(out, certIssue{IDCABundleExpired, SeverityError,
				fmt.Sprintf("The chain fails verification: %v.", chainErr),
				"A CA or intermediate in the chain is outside its validity: calls fail with \"x509: certificate has expired or is not yet valid\"."})
		} else if !hasSHA1(out) {
			out = append(out, certIssue{IDHandshakeFailed, SeverityError,
				fmt.Sprintf("The serving certificate fails verification: %v.", chainErr),
				"The API server's TLS verification fails the same way on every call."})
		}
	}
	return out
}

func hasSHA1(issues []certIssue) bool {
	for _, i := range issues {
		if i.ID == IDSHA1Signature {
			return true
		}
	}
	return false
}

// verifyChain verifies chain[0] with chain[1:] as intermediates and the PEM
// bundle as the only roots (system roots when bundle is empty), for server
// authentication, without a host name (checked separately).
func verifyChain(chain []*x509.Certificate, bundle []byte, at time.Time) error {
	opts := x509.VerifyOptions{CurrentTime: at, Intermediates: x509.NewCertPool()}
	if len(strings.TrimSpace(string(bundle))) > 0 {
		opts.Roots = x509.NewCertPool()
		if !opts.Roots.AppendCertsFromPEM(bundle) {
			return x509.UnknownAuthorityError{Cert: chain[0]}
		}
	}
	for _, c := range chain[1:] {
		opts.Intermediates.AddCert(c)
	}
	_, err := chain[0].Verify(opts)
	return err
}

// signedByBundle reports (as x509.UnknownAuthorityError) when neither the
// leaf nor the last certificate of the chain is signed by a CA of bundle.
// An empty bundle (system roots) is not judged here.
func signedByBundle(chain []*x509.Certificate, bundle []byte) error {
	if len(strings.TrimSpace(string(bundle))) == 0 {
		return nil
	}
	cas, err := webhookcerts.ParseCertificates(bundle)
	if err != nil {
		return x509.UnknownAuthorityError{Cert: chain[0]}
	}
	top := chain[len(chain)-1]
	for _, ca := range cas {
		if chain[0].CheckSignatureFrom(ca) == nil || top.CheckSignatureFrom(ca) == nil {
			return nil
		}
	}
	return x509.UnknownAuthorityError{Cert: chain[0]}
}

// certNames lists the names a certificate is valid for: DNS SANs and IP
// SANs. The Common Name is ignored by Go (and so by the API server); it is
// listed, marked, only when there are no SANs at all.
func certNames(c *x509.Certificate) []string {
	var out []string
	out = append(out, c.DNSNames...)
	for _, ip := range c.IPAddresses {
		out = append(out, ip.String())
	}
	if len(out) == 0 {
		if c.Subject.CommonName != "" {
			return []string{fmt.Sprintf("no SANs (CommonName %q is ignored)", c.Subject.CommonName)}
		}
		return []string{"no names at all"}
	}
	return out
}

func bundleSubjects(bundle []byte) string {
	cas, err := webhookcerts.ParseCertificates(bundle)
	if err != nil || len(cas) == 0 {
		return "no usable CA"
	}
	var names []string
	for _, c := range cas {
		names = append(names, fmt.Sprintf("%q", c.Subject.CommonName))
	}
	return strings.Join(names, ", ")
}

// weakKey describes a key below today's minimums, or returns "".
func weakKey(c *x509.Certificate) string {
	switch k := c.PublicKey.(type) {
	case *rsa.PublicKey:
		if k.N.BitLen() < 2048 {
			return fmt.Sprintf("RSA %d bits (minimum 2048)", k.N.BitLen())
		}
	case *ecdsa.PublicKey:
		if k.Curve.Params().BitSize < 256 {
			return fmt.Sprintf("ECDSA %s (minimum P-256)", k.Curve.Params().Name)
		}
	case *dsa.PublicKey:
		return "DSA (not accepted for TLS)"
	}
	return ""
}

// isLoopbackHost reports whether host is localhost or a loopback IP.
func isLoopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") || strings.HasSuffix(strings.ToLower(host), ".localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
