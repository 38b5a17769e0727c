package webhookcerts

import (
	"bytes"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"slices"
	"time"
)

// Keys of the certificate Secret (type kubernetes.io/tls). The first four
// are cert-controller's layout too, so its Secret is adopted as it is.
const (
	// SecretCertKey and SecretKeyKey hold the serving certificate and key.
	SecretCertKey = "tls.crt"
	SecretKeyKey  = "tls.key"
	// SecretCAKey holds every CA the API server must trust, newest first:
	// exactly the caBundle of kadmit's webhook configurations. During a CA
	// rotation it holds the new CA and the old one.
	SecretCAKey = "ca.crt"
	// SecretCAPrivateKey holds the key of the signing CA (the newest).
	SecretCAPrivateKey = "ca.key"
	// SecretCrossKey holds, during a CA rotation, the newest CA
	// cross-signed by the previous one (CrossSign); optional.
	SecretCrossKey = "ca-cross.crt"
)

// Spec is what the serving certificate must look like.
type Spec struct {
	// DNSNames and IPs are the SANs; e.g. svc, svc.ns, svc.ns.svc,
	// svc.ns.svc.cluster.local.
	DNSNames []string
	IPs      []net.IP
	KeyType  KeyType
	// ServingValidity is the serving certificate's lifetime; it is renewed
	// at 2/3 of it. CAValidity likewise for the CA.
	ServingValidity time.Duration
	CAValidity      time.Duration
	// CAName and CAOrganization name new CAs (NewNamedCA): CommonName
	// "<CAName>@<unix>.<hex>", default DefaultCAName.
	CAName, CAOrganization string
}

// Material is the parsed content of kadmit's certificate Secret.
type Material struct {
	// Bundle is every trusted CA, newest first; Bundle[0] signs.
	Bundle  []*x509.Certificate
	CAKey   crypto.Signer
	Serving *tls.Certificate // Leaf set
	// Cross is Bundle[0] cross-signed by Bundle[1] while a CA rotation is
	// under way (WithNewCA), else nil; WithServing serves it as the
	// intermediate, so the new leaf verifies against either bundle.
	Cross *x509.Certificate

	bundlePEM, caKeyPEM, certPEM, keyPEM, crossPEM []byte
}

// ErrIncomplete is wrapped when Secret data lacks a key or does not parse.
var ErrIncomplete = errors.New("certificate Secret is incomplete or corrupt")

// ParseSecretData parses the four Secret keys. It returns an error wrapping
// ErrIncomplete when a key is missing or unparsable, or when ca.key is not the
// key of the first certificate in ca.crt.
func ParseSecretData(data map[string][]byte) (*Material, error) {
	for _, k := range []string{SecretCertKey, SecretKeyKey, SecretCAKey, SecretCAPrivateKey} {
		if len(data[k]) == 0 {
			return nil, fmt.Errorf("%w: %s is missing", ErrIncomplete, k)
		}
	}
	m := &Material{bundlePEM: data[SecretCAKey], caKeyPEM: data[SecretCAPrivateKey], certPEM: data[SecretCertKey], keyPEM: data[SecretKeyKey]}
	var err error
	if m.Bundle, err = ParseCertificates(m.bundlePEM); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrIncomplete, SecretCAKey, err)
	}
	if m.CAKey, err = ParseKey(m.caKeyPEM); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrIncomplete, SecretCAPrivateKey, err)
	}
	if !publicKeysEqual(m.Bundle[0].PublicKey, m.CAKey.Public()) {
		return nil, fmt.Errorf("%w: %s is not the key of the first CA in %s", ErrIncomplete, SecretCAPrivateKey, SecretCAKey)
	}
	if m.Serving, err = ParseKeyPair(m.certPEM, m.keyPEM); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrIncomplete, err)
	}
	// An optional key: one that does not fit (a stale rotation's, a
	// hand edit) is dropped rather than failing the whole Secret, since
	// without it only the overlap's extra safety is lost.
	if cs, err := ParseCertificates(data[SecretCrossKey]); err == nil && len(m.Bundle) > 1 && validCross(cs[0], m.Bundle) {
		m.Cross, m.crossPEM = cs[0], data[SecretCrossKey]
	}
	return m, nil
}

// validCross reports whether cross is bundle[0] re-issued by a CA further
// down the bundle.
func validCross(cross *x509.Certificate, bundle []*x509.Certificate) bool {
	if !bytes.Equal(cross.RawSubject, bundle[0].RawSubject) || !publicKeysEqual(cross.PublicKey, bundle[0].PublicKey) {
		return false
	}
	for _, ca := range bundle[1:] {
		if cross.CheckSignatureFrom(ca) == nil {
			return true
		}
	}
	return false
}

// SecretData renders the material as Secret data.
func (m *Material) SecretData() map[string][]byte {
	d := map[string][]byte{
		SecretCertKey:      m.certPEM,
		SecretKeyKey:       m.keyPEM,
		SecretCAKey:        m.bundlePEM,
		SecretCAPrivateKey: m.caKeyPEM,
	}
	if m.Cross != nil {
		d[SecretCrossKey] = m.crossPEM
	}
	return d
}

// BundlePEM is the caBundle to inject: every trusted CA, newest first.
func (m *Material) BundlePEM() []byte { return m.bundlePEM }

// NewMaterial creates a CA and a serving certificate for spec at now.
func NewMaterial(spec Spec, now time.Time) (*Material, error) {
	ca, key, err := NewNamedCA(now, spec.CAValidity, spec.KeyType, spec.CAName, spec.CAOrganization)
	if err != nil {
		return nil, err
	}
	keyPEM, err := EncodeKey(key)
	if err != nil {
		return nil, err
	}
	m := &Material{Bundle: []*x509.Certificate{ca}, CAKey: key, bundlePEM: EncodeCertificates(ca), caKeyPEM: keyPEM}
	return m.WithServing(spec, now)
}

// WithServing returns a copy of m with a fresh serving certificate signed by
// the newest CA (Bundle[0]); while m.Cross is set, the served chain is the
// leaf and Cross.
func (m *Material) WithServing(spec Spec, now time.Time) (*Material, error) {
	certPEM, keyPEM, err := IssueServing(m.Bundle[0], m.CAKey, spec.DNSNames, spec.IPs, now, spec.ServingValidity, spec.KeyType)
	if err != nil {
		return nil, err
	}
	if m.Cross != nil {
		certPEM = append(certPEM, m.crossPEM...)
	}
	out := *m
	out.certPEM, out.keyPEM = certPEM, keyPEM
	if out.Serving, err = ParseKeyPair(certPEM, keyPEM); err != nil {
		return nil, err
	}
	return &out, nil
}

// WithNewCA returns a copy of m that starts a CA rotation: a new CA becomes
// the signer and is put first in the bundle, the old CAs stay trusted, the
// new CA is cross-signed by the old signing CA (Cross), and the serving
// certificate is unchanged (still from the old CA) until WithServing.
func (m *Material) WithNewCA(spec Spec, now time.Time) (*Material, error) {
	ca, key, err := NewNamedCA(now, spec.CAValidity, spec.KeyType, spec.CAName, spec.CAOrganization)
	if err != nil {
		return nil, err
	}
	keyPEM, err := EncodeKey(key)
	if err != nil {
		return nil, err
	}
	cross, err := CrossSign(ca, m.Bundle[0], m.CAKey)
	if err != nil {
		return nil, err
	}
	out := *m
	out.Bundle = append([]*x509.Certificate{ca}, m.Bundle...)
	out.CAKey, out.caKeyPEM = key, keyPEM
	out.bundlePEM = EncodeCertificates(out.Bundle...)
	out.Cross, out.crossPEM = cross, EncodeCertificates(cross)
	return &out, nil
}

// WithoutOldCAs returns a copy of m whose bundle holds only the signing CA:
// the last step of a CA rotation, once nothing serves from an old CA.
func (m *Material) WithoutOldCAs() *Material {
	out := *m
	out.Bundle = m.Bundle[:1:1]
	out.bundlePEM = EncodeCertificates(out.Bundle[0])
	// The served chain keeps the cross-signed copy until the next
	// renewal: a verifier holding only the new CA finds the new root
	// directly and ignores it.
	out.Cross, out.crossPEM = nil, nil
	return &out
}

// ServedBySigningCA reports whether the serving certificate is signed by the
// newest CA.
func (m *Material) ServedBySigningCA() bool {
	return m.Serving.Leaf.CheckSignatureFrom(m.Bundle[0]) == nil
}

// Equal reports whether two materials have the same Secret content.
func (m *Material) Equal(o *Material) bool {
	return o != nil && bytes.Equal(m.certPEM, o.certPEM) && bytes.Equal(m.keyPEM, o.keyPEM) &&
		bytes.Equal(m.bundlePEM, o.bundlePEM) && bytes.Equal(m.caKeyPEM, o.caKeyPEM) && bytes.Equal(m.crossPEM, o.crossPEM)
}

// Due says what the material needs at now, in the order a writer acts on it.
type Due string

const (
	// DueNothing: the material is current.
	DueNothing Due = ""
	// DueServing: the serving certificate is past 2/3 of its lifetime, does
	// not cover spec's SANs, or uses another key type: re-issue it.
	DueServing Due = "serving"
	// DueCA: the signing CA is past 2/3 of its lifetime: start a CA rotation.
	DueCA Due = "ca"
	// DueReissueFromNewCA: a CA rotation is under way and the serving
	// certificate still comes from an old CA.
	DueReissueFromNewCA Due = "reissue-from-new-ca"
	// DueDropOldCAs: the serving certificate comes from the new CA and old
	// CAs are still in the bundle.
	DueDropOldCAs Due = "drop-old-cas"
)

// Check returns what the material needs at now to satisfy spec.
func (m *Material) Check(spec Spec, now time.Time) Due {
	switch {
	case len(m.Bundle) > 1 && !m.ServedBySigningCA():
		return DueReissueFromNewCA
	case len(m.Bundle) > 1:
		return DueDropOldCAs
	case pastTwoThirds(m.Bundle[0], now):
		return DueCA
	case !m.ServedBySigningCA(), pastTwoThirds(m.Serving.Leaf, now), !coversSANs(m.Serving.Leaf, spec), !keyMatches(m.Serving.Leaf, spec.KeyType):
		return DueServing
	}
	return DueNothing
}

// RenewAt is when the serving certificate reaches 2/3 of its lifetime.
func RenewAt(c *x509.Certificate) time.Time {
	return c.NotBefore.Add(c.NotAfter.Sub(c.NotBefore) * 2 / 3)
}

func pastTwoThirds(c *x509.Certificate, now time.Time) bool { return !now.Before(RenewAt(c)) }

func coversSANs(c *x509.Certificate, spec Spec) bool {
	if !sameSet(c.DNSNames, spec.DNSNames) || len(c.IPAddresses) != len(spec.IPs) {
		return false
	}
	for _, ip := range spec.IPs {
		if !slices.ContainsFunc(c.IPAddresses, ip.Equal) {
			return false
		}
	}
	return true
}

func keyMatches(c *x509.Certificate, t KeyType) bool {
	switch t {
	case ECDSAP256, ECDSAP384, "":
		return c.PublicKeyAlgorithm == x509.ECDSA
	default:
		return c.PublicKeyAlgorithm == x509.RSA
	}
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for _, s := range b {
		if !slices.Contains(a, s) {
			return false
		}
	}
	return true
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	type equaler interface{ Equal(crypto.PublicKey) bool }
	e, ok := a.(equaler)
	return ok && e.Equal(b)
}

// Verify checks that leaf chains to one of the PEM roots for serverName at
// now, as the API server checks a webhook's certificate. See VerifyChain
// for a served chain with intermediates.
func Verify(leaf *x509.Certificate, rootsPEM []byte, serverName string, now time.Time) error {
	return verify(leaf, nil, rootsPEM, serverName, now)
}

// VerifyChain checks a served certificate (Leaf set; Certificate[1:] are the
// intermediates it sends, such as Material.Cross) against the PEM roots for
// serverName at now, exactly as the API server's TLS client does.
func VerifyChain(cert *tls.Certificate, rootsPEM []byte, serverName string, now time.Time) error {
	if cert == nil || cert.Leaf == nil {
		return ErrNoCertificate
	}
	var inter []*x509.Certificate
	for _, der := range cert.Certificate[1:] {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return fmt.Errorf("served chain: %w", err)
		}
		inter = append(inter, c)
	}
	return verify(cert.Leaf, inter, rootsPEM, serverName, now)
}

func verify(leaf *x509.Certificate, inter []*x509.Certificate, rootsPEM []byte, serverName string, now time.Time) error {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(rootsPEM) {
		return errors.New("caBundle holds no PEM certificate")
	}
	var ipool *x509.CertPool
	if len(inter) > 0 {
		ipool = x509.NewCertPool()
		for _, c := range inter {
			ipool.AddCert(c)
		}
	}
	_, err := leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: ipool, DNSName: serverName, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	return err
}
