package doctor

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/kadmit/kadmit/pkg/webhookcerts"
)

// issue makes a CA and a serving certificate for names, valid from
// now-validity/2 (backdated) by the certs package's rules, and returns the
// CA PEM and the parsed leaf.
func issue(t *testing.T, names []string, now time.Time, validity time.Duration) ([]byte, *x509.Certificate) {
	t.Helper()
	ca, key, err := webhookcerts.NewCA(now, 10*validity, webhookcerts.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, _, err := webhookcerts.IssueServing(ca, key, names, nil, now, validity, webhookcerts.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	leafs, err := webhookcerts.ParseCertificates(certPEM)
	if err != nil {
		t.Fatal(err)
	}
	return webhookcerts.EncodeCertificates(ca), leafs[0]
}

func ids(issues []certIssue) string {
	var s []string
	for _, i := range issues {
		s = append(s, i.ID+":"+string(i.Severity))
	}
	return strings.Join(s, ",")
}

func TestAnalyzeServing(t *testing.T) {
	now := time.Now()
	const name = "lws-webhook-service.ns.svc"
	bundle, leaf := issue(t, []string{name}, now, 90*24*time.Hour)

	if got := analyzeServing([]*x509.Certificate{leaf}, bundle, name, now, DefaultExpiryWarning); len(got) != 0 {
		t.Errorf("healthy certificate: %s", ids(got))
	}

	// Another installation's CA: unknown authority.
	otherBundle, _ := issue(t, []string{name}, now, 90*24*time.Hour)
	got := analyzeServing([]*x509.Certificate{leaf}, otherBundle, name, now, DefaultExpiryWarning)
	if ids(got) != IDUnknownAuthority+":error" {
		t.Errorf("other CA: %s; want %s", ids(got), IDUnknownAuthority)
	}

	// Kueue's certificate behind LWS's Service: SAN mismatch naming the
	// valid names, plus the note that the CA is not the bundle's.
	_, kueueLeaf := issue(t, []string{"kueue-webhook-service.ns.svc", "kueue-webhook-service"}, now, 90*24*time.Hour)
	got = analyzeServing([]*x509.Certificate{kueueLeaf}, bundle, name, now, DefaultExpiryWarning)
	if ids(got) != IDSANMismatch+":error" {
		t.Fatalf("kueue cert: %s; want only %s", ids(got), IDSANMismatch)
	}
	if !strings.Contains(got[0].What, "kueue-webhook-service.ns.svc, kueue-webhook-service") || !strings.Contains(got[0].Why, "not signed by a CA in the caBundle") {
		t.Errorf("SAN finding does not list the valid names or the CA note: %+v", got[0])
	}

	// Expired leaf: expiry error; the chain itself is still judged at a time
	// inside the leaf's validity, so no unknown-authority noise.
	past := now.Add(-48 * time.Hour)
	expBundle, expLeaf := issue(t, []string{name}, past, time.Hour)
	if got := analyzeServing([]*x509.Certificate{expLeaf}, expBundle, name, now, DefaultExpiryWarning); ids(got) != IDServingCertExpiry+":error" {
		t.Errorf("expired: %s", ids(got))
	}
	// Expired and from another CA: both are named, and a CA younger than the
	// leaf's validity window does not hide the authority question.
	if got := analyzeServing([]*x509.Certificate{expLeaf}, otherBundle, name, now, DefaultExpiryWarning); ids(got) != IDServingCertExpiry+":error,"+IDUnknownAuthority+":error" {
		t.Errorf("expired, other CA: %s", ids(got))
	}
	// About to expire: last third and within the threshold.
	soonBundle, soonLeaf := issue(t, []string{name}, now.Add(-80*24*time.Hour), 90*24*time.Hour)
	if got := analyzeServing([]*x509.Certificate{soonLeaf}, soonBundle, name, now, DefaultExpiryWarning); ids(got) != IDServingCertExpiry+":warning" {
		t.Errorf("expiring in 10 days: %s", ids(got))
	}
	// A short-lived certificate early in its life is fine.
	shortBundle, shortLeaf := issue(t, []string{name}, now, 24*time.Hour)
	if got := analyzeServing([]*x509.Certificate{shortLeaf}, shortBundle, name, now, DefaultExpiryWarning); len(got) != 0 {
		t.Errorf("fresh 24h certificate: %s", ids(got))
	}

	// SHA-1: the signature algorithm is what the API server refuses.
	sha1Leaf := *leaf
	sha1Leaf.SignatureAlgorithm = x509.SHA1WithRSA
	got = analyzeServing([]*x509.Certificate{&sha1Leaf}, bundle, name, now, DefaultExpiryWarning)
	if !strings.HasPrefix(ids(got), IDSHA1Signature+":error") {
		t.Errorf("SHA-1: %s", ids(got))
	}
}

func TestAnalyzeServingWeakRSA(t *testing.T) {
	now := time.Now()
	key, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "weak"}, DNSNames: []string{"weak.ns.svc"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(365 * 24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	got := analyzeServing([]*x509.Certificate{c}, webhookcerts.EncodeCertificates(c), "weak.ns.svc", now, DefaultExpiryWarning)
	if ids(got) != IDWeakKey+":warning" || !strings.Contains(got[0].What, "RSA 1024 bits") {
		t.Errorf("RSA 1024: %s %+v", ids(got), got)
	}
}

func TestAnalyzeBundle(t *testing.T) {
	now := time.Now()
	if got := analyzeBundle(nil, true, now); ids(got) != IDCABundleMissing+":error" {
		t.Errorf("empty, service: %s", ids(got))
	}
	if got := analyzeBundle(nil, false, now); ids(got) != IDCABundleMissing+":info" {
		t.Errorf("empty, url: %s", ids(got))
	}
	if got := analyzeBundle([]byte("-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n"), true, now); ids(got) != IDCABundleUnparsable+":error" {
		t.Errorf("garbage: %s", ids(got))
	}
	good, _ := issue(t, []string{"a"}, now, time.Hour)
	if got := analyzeBundle(good, true, now); len(got) != 0 {
		t.Errorf("good: %s", ids(got))
	}
	old, _ := issue(t, []string{"a"}, now.Add(-100*24*time.Hour), time.Hour) // CA valid 10h
	if got := analyzeBundle(old, true, now); ids(got) != IDCABundleExpired+":error" {
		t.Errorf("expired CA: %s", ids(got))
	}
	if got := analyzeBundle(append(append([]byte(nil), good...), old...), true, now); ids(got) != IDCABundleExpired+":warning" {
		t.Errorf("one of two expired: %s", ids(got))
	}
}

func TestClusterDNSAndLoopback(t *testing.T) {
	for host, want := range map[string]bool{"kueue-webhook-service.kueue-system.svc": true, "x.y.svc.cluster.local": true, "svc.example.com": false, "a.b.c.svc": false} {
		if _, _, ok := clusterDNSName(host); ok != want {
			t.Errorf("clusterDNSName(%s) = %v; want %v", host, ok, want)
		}
	}
	for host, want := range map[string]bool{"localhost": true, "127.0.0.1": true, "::1": true, "198.18.0.1": false, "example.com": false} {
		if got := isLoopbackHost(host); got != want {
			t.Errorf("isLoopbackHost(%s) = %v; want %v", host, got, want)
		}
	}
}
