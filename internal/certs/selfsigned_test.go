package certs

import (
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/kadmit/kadmit/pkg/webhookcerts"
)

func parseCert(t *testing.T, pemBytes []byte) *x509.Certificate {
	t.Helper()
	block, rest := pem.Decode(pemBytes)
	if block == nil || block.Type != "CERTIFICATE" || len(rest) != 0 {
		t.Fatalf("not one PEM certificate: %q", pemBytes)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestNewSelfSignedVerifies(t *testing.T) {
	ip := net.ParseIP("127.0.0.1")
	b, err := NewSelfSigned(SelfSignedOptions{DNSNames: []string{"kadmit.kadmit-system.svc"}, IPs: []net.IP{ip}})
	if err != nil {
		t.Fatal(err)
	}
	ca, leaf := parseCert(t, b.CACert), parseCert(t, b.ServerCert)
	if !ca.IsCA || ca.KeyUsage&x509.KeyUsageCertSign == 0 {
		t.Fatalf("CA: IsCA %v key usage %v", ca.IsCA, ca.KeyUsage)
	}
	if leaf.IsCA || !slices.Equal(leaf.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}) || leaf.KeyUsage&x509.KeyUsageDigitalSignature == 0 {
		t.Fatalf("leaf: IsCA %v ext key usage %v key usage %v", leaf.IsCA, leaf.ExtKeyUsage, leaf.KeyUsage)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	for _, name := range []string{"kadmit.kadmit-system.svc", "127.0.0.1"} {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: name, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			t.Errorf("verify for %s: %v", name, err)
		}
	}
	for _, name := range []string{"kadmit.other.svc", "127.0.0.2"} {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: name}); err == nil {
			t.Errorf("verified for %s, which is not a SAN", name)
		}
	}
	// Another CA does not vouch for the leaf.
	other, err := NewSelfSigned(SelfSignedOptions{IPs: []net.IP{ip}})
	if err != nil {
		t.Fatal(err)
	}
	otherRoots := x509.NewCertPool()
	otherRoots.AddCert(parseCert(t, other.CACert))
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: otherRoots, DNSName: "127.0.0.1"}); err == nil {
		t.Fatal("leaf verified against an unrelated CA")
	}
	// The PEM pair loads as a TLS certificate with Leaf set, and the CA key
	// is the CA certificate's.
	tc, err := b.TLSCertificate()
	if err != nil || tc.Leaf == nil || !tc.Leaf.Equal(leaf) {
		t.Fatalf("TLSCertificate: %v %v", err, tc)
	}
	key, err := webhookcerts.ParseKey(b.CAKey)
	if err != nil {
		t.Fatal(err)
	}
	if pub, ok := key.Public().(interface{ Equal(crypto.PublicKey) bool }); !ok || !pub.Equal(ca.PublicKey) {
		t.Fatal("CA key does not match the CA certificate")
	}
}

func TestNewSelfSignedValidity(t *testing.T) {
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	b, err := NewSelfSigned(SelfSignedOptions{IPs: []net.IP{net.ParseIP("127.0.0.1")}, Now: now, ServerValidity: 48 * time.Hour, CAValidity: 96 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ca, leaf := parseCert(t, b.CACert), parseCert(t, b.ServerCert)
	if !leaf.NotBefore.Equal(now.Add(-5*time.Minute)) || !leaf.NotAfter.Equal(now.Add(48*time.Hour)) {
		t.Errorf("leaf valid %s..%s", leaf.NotBefore, leaf.NotAfter)
	}
	if !ca.NotBefore.Equal(now.Add(-5*time.Minute)) || !ca.NotAfter.Equal(now.Add(96*time.Hour)) {
		t.Errorf("CA valid %s..%s", ca.NotBefore, ca.NotAfter)
	}
	// Defaults: 1 year for the leaf, 10 years for the CA.
	b, err = NewSelfSigned(SelfSignedOptions{DNSNames: []string{"kadmit"}, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	ca, leaf = parseCert(t, b.CACert), parseCert(t, b.ServerCert)
	if !leaf.NotAfter.Equal(now.Add(365*24*time.Hour)) || !ca.NotAfter.Equal(now.Add(10*365*24*time.Hour)) {
		t.Errorf("default validity: leaf until %s, CA until %s", leaf.NotAfter, ca.NotAfter)
	}
	if leaf.Subject.CommonName != "kadmit" {
		t.Errorf("CN %q", leaf.Subject.CommonName)
	}
}

func TestNewSelfSignedNoSANs(t *testing.T) {
	if _, err := NewSelfSigned(SelfSignedOptions{}); !errors.Is(err, webhookcerts.ErrNoSANs) {
		t.Fatalf("err = %v, want webhookcerts.ErrNoSANs", err)
	}
}

// TestSelfSignedHandshake checks the pair end to end: a TLS client that trusts
// only the CA completes a handshake for the IP SAN.
func TestSelfSignedHandshake(t *testing.T) {
	b, err := NewSelfSigned(SelfSignedOptions{IPs: []net.IP{net.ParseIP("127.0.0.1")}})
	if err != nil {
		t.Fatal(err)
	}
	var h webhookcerts.Holder
	tc, err := b.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	h.Set(tc)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{GetCertificate: h.GetCertificate, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		_ = c.(*tls.Conn).Handshake()
		c.Close()
	}()
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(b.CACert) {
		t.Fatal("CA PEM not accepted")
	}
	conn, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"})
	if err != nil {
		t.Fatalf("handshake: %v", err)
	}
	conn.Close()
}
