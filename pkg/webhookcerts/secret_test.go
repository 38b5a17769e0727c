package webhookcerts

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// certControllerSecret is a Secret as open-policy-agent/cert-controller
// writes it: an RSA CA named caName (PKCS#1 key, serial 0, a DNS SAN of its
// own name) and a serving certificate for dnsName only, in an Opaque
// Secret that also holds an unrelated key.
func certControllerSecret(t *testing.T, dnsName string) *corev1.Secret {
	t.Helper()
	now := time.Now()
	caKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(0), Subject: pkix.Name{CommonName: "kueue-ca", Organization: []string{"kueue"}},
		DNSNames: []string{"kueue-ca"}, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment | x509.KeyUsageCertSign,
		BasicConstraintsValid: true, IsCA: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, caKey.Public(), caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: dnsName}, DNSNames: []string{dnsName},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(365 * 24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
	if err != nil {
		t.Fatal(err)
	}
	rsaPEM := func(k *rsa.PrivateKey) []byte {
		return pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(k)})
	}
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: testSecret, ResourceVersion: "1"},
		Type:       corev1.SecretTypeOpaque,
		Data: map[string][]byte{
			"ca.crt": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), "ca.key": rsaPEM(caKey),
			"tls.crt": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), "tls.key": rsaPEM(key),
			"other": []byte("kept"),
		},
	}
}

func withSecret(s *corev1.Secret) []runtime.Object { return append(world(), s) }

// Upgrading from cert-controller: its Secret's CA is kept (byte for byte)
// and a serving certificate with every SAN is issued from it, so the
// caBundles the API server already holds stay valid.
func TestAdoptCertControllerSecretKeepsCA(t *testing.T) {
	old := certControllerSecret(t, serverName)
	c := newCluster(t, withSecret(old)...)
	r := c.rotator(t, testOptions())
	mustBootstrap(t, r)
	s := c.secret(t)
	if !bytes.Equal(s.Data["ca.crt"], old.Data["ca.crt"]) || !bytes.Equal(s.Data["ca.key"], old.Data["ca.key"]) {
		t.Fatal("the cert-controller CA was replaced")
	}
	if bytes.Equal(s.Data["tls.crt"], old.Data["tls.crt"]) {
		t.Fatal("serving certificate not re-issued for the full SAN set")
	}
	m := c.material(t)
	if len(m.Bundle) != 1 || !sameSet(m.Serving.Leaf.DNSNames, r.spec.DNSNames) {
		t.Fatalf("bundle %d CAs, SANs %v", len(m.Bundle), m.Serving.Leaf.DNSNames)
	}
	if err := VerifyChain(m.Serving, old.Data["ca.crt"], serverName, time.Now()); err != nil {
		t.Fatalf("new serving certificate does not verify against the old ca.crt: %v", err)
	}
	if string(s.Data["other"]) != "kept" || s.Type != corev1.SecretTypeOpaque {
		t.Errorf("unrelated key or type changed: %q %s", s.Data["other"], s.Type)
	}
	if g := secretGeneration(s); g != 1 {
		t.Errorf("generation %d, want 1", g)
	}
}

// A Secret whose CA is usable but whose serving pair is not: the CA is
// kept, a serving certificate issued from it.
func TestAdoptCAWithoutServingPair(t *testing.T) {
	old := certControllerSecret(t, serverName)
	delete(old.Data, "tls.crt")
	old.Data["tls.key"] = []byte("garbage")
	c := newCluster(t, withSecret(old)...)
	r := c.rotator(t, testOptions())
	mustBootstrap(t, r)
	s := c.secret(t)
	if !bytes.Equal(s.Data["ca.crt"], old.Data["ca.crt"]) {
		t.Fatal("CA replaced")
	}
	if err := VerifyChain(c.material(t).Serving, old.Data["ca.crt"], serverName, time.Now()); err != nil {
		t.Fatal(err)
	}
}

// Kueue's chart ships the Secret empty; a hand edit can corrupt it. Both
// are filled with fresh material (the Secret's type is immutable and kept).
func TestEmptyOrCorruptSecretFilled(t *testing.T) {
	for name, data := range map[string]map[string][]byte{
		"empty":   nil,
		"corrupt": {"ca.crt": []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"), "ca.key": []byte("x"), "tls.crt": []byte("y"), "tls.key": []byte("z")},
	} {
		t.Run(name, func(t *testing.T) {
			c := newCluster(t, withSecret(&corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: testSecret, ResourceVersion: "1"},
				Type:       corev1.SecretTypeOpaque, Data: data,
			})...)
			ready := make(chan struct{})
			opts := testOptions()
			opts.IsReady = ready
			r := c.rotator(t, opts)
			mustBootstrap(t, r)
			<-ready
			m := c.material(t)
			if err := VerifyChain(m.Serving, m.BundlePEM(), serverName, time.Now()); err != nil {
				t.Fatal(err)
			}
			if s := c.secret(t); s.Type != corev1.SecretTypeOpaque || secretGeneration(s) != 1 {
				t.Errorf("type %s generation %d", s.Type, secretGeneration(s))
			}
		})
	}
}

// rotate=serving re-issues the leaf from the same CA, and the write that
// does it removes the annotation; the next pass writes nothing.
func TestRotateServingAnnotation(t *testing.T) {
	c := newCluster(t, world()...)
	r := c.rotator(t, testOptions())
	mustBootstrap(t, r)
	before := c.material(t)
	s := c.secret(t)
	s.Annotations[RotateAnnotation] = RotateServing
	if _, err := c.kube.CoreV1().Secrets(testNS).Update(context.Background(), s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	pass(t, r)
	after := c.material(t)
	s = c.secret(t)
	if after.Serving.Leaf.Equal(before.Serving.Leaf) || !after.Bundle[0].Equal(before.Bundle[0]) || len(after.Bundle) != 1 {
		t.Fatal("want a new leaf from the same, only CA")
	}
	if _, ok := s.Annotations[RotateAnnotation]; ok {
		t.Fatal("annotation not removed")
	}
	if g := secretGeneration(s); g != 2 {
		t.Errorf("generation %d, want 2", g)
	}
	c.kube.ClearActions()
	pass(t, r)
	for _, a := range c.kube.Actions() {
		if a.GetVerb() != "get" && a.GetVerb() != "list" {
			t.Errorf("idle pass sent %s %s", a.GetVerb(), a.GetResource().Resource)
		}
	}
}

// An unknown rotate value is ignored (and logged once), never acted on.
func TestRotateAnnotationUnknownValue(t *testing.T) {
	c := newCluster(t, world()...)
	var logs logSink
	opts := testOptions()
	opts.Logger = logs.logger()
	r := c.rotator(t, opts)
	mustBootstrap(t, r)
	before := c.material(t)
	s := c.secret(t)
	s.Annotations[RotateAnnotation] = "everything"
	if _, err := c.kube.CoreV1().Secrets(testNS).Update(context.Background(), s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	pass(t, r)
	pass(t, r)
	if !c.material(t).Equal(before) {
		t.Fatal("unknown rotate value acted on")
	}
	if n := logs.count("unknown rotate annotation"); n != 1 {
		t.Errorf("logged %d times, want once", n)
	}
}

// A deleted Secret is recreated from the material this replica serves (the
// API server sees no change), with a generation above every owned
// object's, so its bundle is not taken for an older one.
func TestDeletedSecretRestored(t *testing.T) {
	c := newCluster(t, world()...)
	r := c.rotator(t, testOptions())
	mustBootstrap(t, r)
	before := c.material(t)
	// A long-lived install: a configuration carries generation 7.
	v, err := c.kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(context.Background(), "v", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	v.Annotations[GenerationAnnotation] = "7"
	if _, err := c.kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Update(context.Background(), v, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.kube.CoreV1().Secrets(testNS).Delete(context.Background(), testSecret, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	pass(t, r)
	after := c.material(t)
	if !after.Equal(before) {
		t.Fatal("recreated Secret holds other material than was served")
	}
	if g := secretGeneration(c.secret(t)); g != 8 {
		t.Errorf("recreated generation %d, want 8 (above the configuration's 7)", g)
	}
	if !strings.Contains(string(c.secret(t).Type), "tls") {
		t.Errorf("recreated type %s", c.secret(t).Type)
	}
}
