package webhookcerts

import (
	"errors"
	"net"
	"testing"
	"time"
)

var spec = Spec{
	DNSNames:        []string{"kadmit", "kadmit.ns", "kadmit.ns.svc", "kadmit.ns.svc.cluster.local"},
	IPs:             []net.IP{net.ParseIP("198.18.0.2")},
	ServingValidity: 90 * time.Minute,
	CAValidity:      900 * time.Minute,
}

func TestMaterialRoundTripAndVerify(t *testing.T) {
	now := time.Now()
	m, err := NewMaterial(spec, now)
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParseSecretData(m.SecretData())
	if err != nil {
		t.Fatal(err)
	}
	if !back.Equal(m) || back.Check(spec, now) != DueNothing {
		t.Fatalf("round trip changed the material or it is not current: %v", back.Check(spec, now))
	}
	if err := Verify(back.Serving.Leaf, back.BundlePEM(), "kadmit.ns.svc", now); err != nil {
		t.Fatalf("serving certificate does not verify for the Service name: %v", err)
	}
	if err := Verify(back.Serving.Leaf, back.BundlePEM(), "kueue-webhook-service.ns.svc", now); err == nil {
		t.Fatal("verified for a name not in the SANs")
	}
}

func TestParseSecretDataRejects(t *testing.T) {
	m, _ := NewMaterial(spec, time.Now())
	other, _ := NewMaterial(spec, time.Now())
	for name, mutate := range map[string]func(map[string][]byte){
		"missing ca.key":    func(d map[string][]byte) { delete(d, SecretCAPrivateKey) },
		"garbage tls.crt":   func(d map[string][]byte) { d[SecretCertKey] = []byte("nope") },
		"foreign CA key":    func(d map[string][]byte) { d[SecretCAPrivateKey] = other.SecretData()[SecretCAPrivateKey] },
		"mismatched tlskey": func(d map[string][]byte) { d[SecretKeyKey] = other.SecretData()[SecretKeyKey] },
	} {
		d := m.SecretData()
		mutate(d)
		if _, err := ParseSecretData(d); !errors.Is(err, ErrIncomplete) {
			t.Errorf("%s: err = %v, want ErrIncomplete", name, err)
		}
	}
}

func TestCheckRenewalPoints(t *testing.T) {
	now := time.Now()
	m, _ := NewMaterial(spec, now)
	// Certificates start 5 minutes early for clock skew: 2/3 of (90m+5m) is
	// 63m20s after NotBefore, i.e. 58m20s from now.
	if got := m.Check(spec, now.Add(58*time.Minute)); got != DueNothing {
		t.Fatalf("before 2/3: %q", got)
	}
	if got := m.Check(spec, now.Add(59*time.Minute)); got != DueServing {
		t.Fatalf("after 2/3 of the serving lifetime: %q", got)
	}
	if got := m.Check(spec, now.Add(600*time.Minute)); got != DueCA {
		t.Fatalf("after 2/3 of the CA lifetime: %q", got)
	}
	moreSANs := spec
	moreSANs.DNSNames = append([]string{"extra"}, spec.DNSNames...)
	if got := m.Check(moreSANs, now); got != DueServing {
		t.Fatalf("SANs changed: %q", got)
	}
	rsa := spec
	rsa.KeyType = RSA2048
	if got := m.Check(rsa, now); got != DueServing {
		t.Fatalf("key type changed: %q", got)
	}
}

// TestCARotationSteps walks the three steps and checks that at every step the
// certificate being served verifies against the bundle the API server would
// hold, which is what makes the rotation free of unknown-authority errors.
func TestCARotationSteps(t *testing.T) {
	now := time.Now()
	m0, _ := NewMaterial(spec, now)

	m1, err := m0.WithNewCA(spec, now)
	if err != nil {
		t.Fatal(err)
	}
	if len(m1.Bundle) != 2 || m1.ServedBySigningCA() || m1.Check(spec, now) != DueReissueFromNewCA {
		t.Fatalf("step 1: bundle %d, served by signing CA %v, due %q", len(m1.Bundle), m1.ServedBySigningCA(), m1.Check(spec, now))
	}
	// Replicas still serve m0's certificate; the bundle now holds both CAs.
	if err := Verify(m0.Serving.Leaf, m1.BundlePEM(), "kadmit.ns.svc", now); err != nil {
		t.Fatalf("old certificate against the extended bundle: %v", err)
	}

	m2, err := m1.WithServing(spec, now)
	if err != nil {
		t.Fatal(err)
	}
	if !m2.ServedBySigningCA() || m2.Check(spec, now) != DueDropOldCAs {
		t.Fatalf("step 2: due %q", m2.Check(spec, now))
	}
	for _, leaf := range []*Material{m0, m2} {
		if err := Verify(leaf.Serving.Leaf, m2.BundlePEM(), "kadmit.ns.svc", now); err != nil {
			t.Fatalf("old or new certificate against the extended bundle: %v", err)
		}
	}

	m3 := m2.WithoutOldCAs()
	if len(m3.Bundle) != 1 || m3.Check(spec, now) != DueNothing {
		t.Fatalf("step 3: bundle %d due %q", len(m3.Bundle), m3.Check(spec, now))
	}
	if err := Verify(m2.Serving.Leaf, m3.BundlePEM(), "kadmit.ns.svc", now); err != nil {
		t.Fatalf("new certificate against the final bundle: %v", err)
	}
	if err := Verify(m0.Serving.Leaf, m3.BundlePEM(), "kadmit.ns.svc", now); err == nil {
		t.Fatal("old certificate still verifies after the old CA left the bundle")
	}
	if _, err := ParseSecretData(m1.SecretData()); err != nil {
		t.Fatalf("mid-rotation Secret does not parse: %v", err)
	}
}

// TestCrossSignedChainVerifiesAgainstEitherBundle is the property every step
// of a CA rotation relies on: the new leaf, served with the cross-signed new
// CA, verifies against the old bundle alone, the new one alone and both;
// the old leaf against the old CA and both, never against the new alone.
func TestCrossSignedChainVerifiesAgainstEitherBundle(t *testing.T) {
	now := time.Now()
	s := spec
	s.CAName, s.CAOrganization = "kueue-ca", "kueue"
	m0, err := NewMaterial(s, now)
	if err != nil {
		t.Fatal(err)
	}
	m1, err := m0.WithNewCA(s, now)
	if err != nil {
		t.Fatal(err)
	}
	if m1.Cross == nil || m1.Cross.CheckSignatureFrom(m0.Bundle[0]) != nil {
		t.Fatal("WithNewCA did not cross-sign the new CA with the old one")
	}
	if m1.Bundle[0].Subject.String() == m0.Bundle[0].Subject.String() {
		t.Fatalf("two CAs share the subject %q", m1.Bundle[0].Subject)
	}
	if got := m1.Bundle[0].Subject.Organization; len(got) != 1 || got[0] != "kueue" {
		t.Fatalf("CA organization = %v", got)
	}
	m2, err := m1.WithServing(s, now)
	if err != nil {
		t.Fatal(err)
	}
	if len(m2.Serving.Certificate) != 2 {
		t.Fatalf("served chain has %d certificates, want leaf + cross", len(m2.Serving.Certificate))
	}
	back, err := ParseSecretData(m2.SecretData())
	if err != nil || back.Cross == nil || !back.Equal(m2) {
		t.Fatalf("Secret round trip lost the cross-signed CA: %v", err)
	}
	oldOnly, newOnly, both := EncodeCertificates(m0.Bundle[0]), EncodeCertificates(m1.Bundle[0]), m1.BundlePEM()
	for name, roots := range map[string][]byte{"old bundle": oldOnly, "new bundle": newOnly, "both": both} {
		if err := VerifyChain(m2.Serving, roots, "kadmit.ns.svc", now); err != nil {
			t.Errorf("new chain against the %s: %v", name, err)
		}
	}
	if err := VerifyChain(m0.Serving, newOnly, "kadmit.ns.svc", now); err == nil {
		t.Error("old leaf verified against the new CA alone")
	}
	if err := Verify(m2.Serving.Leaf, oldOnly, "kadmit.ns.svc", now); err == nil {
		t.Error("new leaf without its intermediate verified against the old CA")
	}
	m3 := m2.WithoutOldCAs()
	if m3.Cross != nil {
		t.Fatal("WithoutOldCAs kept the cross-signed CA in the Secret")
	}
	if _, ok := m3.SecretData()[SecretCrossKey]; ok {
		t.Fatal("Secret data still holds ca-cross.crt")
	}
	if err := VerifyChain(m3.Serving, m3.BundlePEM(), "kadmit.ns.svc", now); err != nil {
		t.Fatalf("chain after the old CA left: %v", err)
	}
	// A cross certificate that does not fit the bundle is dropped, not fatal.
	d := m0.SecretData()
	d[SecretCrossKey] = EncodeCertificates(m1.Cross)
	if got, err := ParseSecretData(d); err != nil || got.Cross != nil {
		t.Fatalf("stray ca-cross.crt: err=%v cross=%v", err, got.Cross != nil)
	}
}
