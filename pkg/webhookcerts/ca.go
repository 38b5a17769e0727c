package webhookcerts

import (
	"crypto"
	"crypto/rand"
	"crypto/sha1"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"time"
)

// ErrNoSANs is returned when a serving certificate would have no SAN.
var ErrNoSANs = errors.New("a serving certificate needs at least one DNS name or IP SAN")

// backdate is how far NotBefore lies in the past, so an API server whose clock
// runs a little behind still accepts a fresh certificate: 5 minutes, or a
// tenth of a short lifetime.
func backdate(validity time.Duration) time.Duration {
	return min(5*time.Minute, validity/10)
}

// DefaultCAName is the CA subject's CommonName prefix when none is given.
const DefaultCAName = "webhookcerts-ca"

// NewCA creates a self-signed CA certificate named DefaultCAName, valid
// from now-backdate (tolerating clock skew with the API server) to
// now+validity, with a keyType key. See NewNamedCA.
func NewCA(now time.Time, validity time.Duration, keyType KeyType) (*x509.Certificate, crypto.Signer, error) {
	return NewNamedCA(now, validity, keyType, "", "")
}

// NewNamedCA is NewCA with the subject's CommonName prefix name (default
// DefaultCAName) and Organization org (none when empty). The CommonName is
// "<name>@<unix seconds>.<4 random hex digits>": two CAs never share a
// subject, which a cross-signed chain (CrossSign) relies on, since a
// verifier finds a certificate's issuer by subject.
func NewNamedCA(now time.Time, validity time.Duration, keyType KeyType, name, org string) (*x509.Certificate, crypto.Signer, error) {
	key, err := GenerateKey(keyType)
	if err != nil {
		return nil, nil, fmt.Errorf("CA: %w", err)
	}
	if name == "" {
		name = DefaultCAName
	}
	subject := pkix.Name{CommonName: fmt.Sprintf("%s@%d.%04x", name, now.Unix(), serial().Uint64()&0xffff)}
	if org != "" {
		subject.Organization = []string{org}
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               subject,
		NotBefore:             now.Add(-backdate(validity)),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		SubjectKeyId:          keyID(key.Public()),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, fmt.Errorf("self-sign CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("parse CA: %w", err)
	}
	return cert, key, nil
}

// CrossSign returns ca re-issued by parent (signed with parentKey): the
// same subject, public key and SubjectKeyId as ca, valid no longer than
// both. A chain [leaf from ca, CrossSign(ca, old, oldKey)] then verifies
// against a bundle holding only the old CA (leaf -> cross -> old root) and
// against one holding only ca (leaf -> ca root): during a CA rotation the
// new serving certificate is accepted whichever caBundle the API server's
// informer holds at that moment, so no step waits on a timer.
func CrossSign(ca, parent *x509.Certificate, parentKey crypto.Signer) (*x509.Certificate, error) {
	notAfter := ca.NotAfter
	if parent.NotAfter.Before(notAfter) {
		notAfter = parent.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               ca.Subject,
		NotBefore:             ca.NotBefore,
		NotAfter:              notAfter,
		KeyUsage:              ca.KeyUsage,
		BasicConstraintsValid: true,
		IsCA:                  true,
		SubjectKeyId:          ca.SubjectKeyId,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, ca.PublicKey, parentKey)
	if err != nil {
		return nil, fmt.Errorf("cross-sign CA %q with %q: %w", ca.Subject.CommonName, parent.Subject.CommonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse cross-signed CA: %w", err)
	}
	return cert, nil
}

// keyID is the SubjectKeyId of pub as crypto/x509 derives it for a CA
// template without one (SHA-1 of the public key bytes), set explicitly so
// the cross-signed copy carries the same one.
func keyID(pub crypto.PublicKey) []byte {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil
	}
	var spki struct {
		Algorithm        asn1.RawValue
		SubjectPublicKey asn1.BitString
	}
	if _, err := asn1.Unmarshal(der, &spki); err != nil {
		return nil
	}
	sum := sha1.Sum(spki.SubjectPublicKey.Bytes)
	return sum[:]
}

// IssueServing signs a fresh serving certificate (ExtKeyUsage serverAuth,
// keyType key) for dnsNames and ips with the CA, valid from now-backdate to
// now+validity. It returns the PEM certificate and PEM key, or ErrNoSANs.
func IssueServing(ca *x509.Certificate, caKey crypto.Signer, dnsNames []string, ips []net.IP, now time.Time, validity time.Duration, keyType KeyType) (certPEM, keyPEM []byte, err error) {
	if len(dnsNames) == 0 && len(ips) == 0 {
		return nil, nil, ErrNoSANs
	}
	key, err := GenerateKey(keyType)
	if err != nil {
		return nil, nil, fmt.Errorf("serving: %w", err)
	}
	cn := "kadmit"
	if len(dnsNames) > 0 {
		cn = dnsNames[0]
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: cn},
		DNSNames:     dnsNames,
		IPAddresses:  ips,
		NotBefore:    now.Add(-backdate(validity)),
		NotAfter:     now.Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("sign serving certificate: %w", err)
	}
	keyPEM, err = EncodeKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM, nil
}

// ParseKeyPair parses a PEM certificate chain and key into a tls.Certificate
// with Leaf set, so expiry and SANs can be read without re-parsing.
func ParseKeyPair(certPEM, keyPEM []byte) (*tls.Certificate, error) {
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("parse key pair: %w", err)
	}
	if c.Leaf == nil {
		if c.Leaf, err = x509.ParseCertificate(c.Certificate[0]); err != nil {
			return nil, fmt.Errorf("parse leaf certificate: %w", err)
		}
	}
	return &c, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		// crypto/rand does not fail on supported platforms.
		panic(fmt.Sprintf("crypto/rand: %v", err))
	}
	return n
}
