package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/kadmit/kadmit/pkg/webhookcerts"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/kadmit/kadmit/test/poll"
	"github.com/kadmit/kadmit/test/seed"
)

// kadmitNamespace holds kadmit's certificate Secret in the demo.
const (
	kadmitNamespace = "kadmit-system"
	secretName      = "kadmit-tls"
	// rotateAnnotation is kadmit's name for webhookcerts.RotateAnnotation
	// (internal/rotateAnnotation).
	rotateAnnotation = "kadmit.io/rotate"
)

// showCertificates prints what kadmit did before the API server could call
// it: the Secret it created, and that every registered
// caBundle is the Secret's CA and verifies the certificate kadmit serves.
func showCertificates(ctx context.Context, say func(string, ...any), cs kubernetes.Interface, addr string) error {
	s, err := cs.CoreV1().Secrets(kadmitNamespace).Get(ctx, secretName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("read the certificate Secret: %w", err)
	}
	m, err := webhookcerts.ParseSecretData(s.Data)
	if err != nil {
		return err
	}
	ca, leaf := m.Bundle[0], m.Serving.Leaf
	say("  kadmit created Secret %s/%s (type %s): CA %q valid until %s,", kadmitNamespace, secretName, s.Type, ca.Subject.CommonName, ca.NotAfter.UTC().Format(time.DateOnly))
	say("    serving certificate for %s valid until %s, renewed at 2/3 of its life (%s)",
		sans(leaf), leaf.NotAfter.UTC().Format(time.DateOnly), webhookcerts.RenewAt(leaf).UTC().Format(time.DateOnly))
	served, err := servedCertificate(ctx, addr)
	if err != nil {
		return err
	}
	mwc, err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "kadmit", metav1.GetOptions{})
	if err != nil {
		return err
	}
	vwc, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, "kadmit", metav1.GetOptions{})
	if err != nil {
		return err
	}
	var names []string
	check := func(name string, bundle []byte) error {
		names = append(names, name)
		if !bytes.Equal(bundle, m.BundlePEM()) {
			return fmt.Errorf("webhook %s: caBundle is not the Secret's ca.crt", name)
		}
		host, _, _ := net.SplitHostPort(addr)
		if err := webhookcerts.Verify(served, bundle, host, time.Now()); err != nil {
			return fmt.Errorf("webhook %s: the served certificate does not verify against its caBundle: %w", name, err)
		}
		return nil
	}
	for _, w := range mwc.Webhooks {
		if err := check(w.Name, w.ClientConfig.CABundle); err != nil {
			return err
		}
	}
	for _, w := range vwc.Webhooks {
		if err := check(w.Name, w.ClientConfig.CABundle); err != nil {
			return err
		}
	}
	say("  every webhook (%s) carries the Secret's CA as caBundle, and it verifies the certificate kadmit serves", strings.Join(names, ", "))
	return nil
}

func sans(c *x509.Certificate) string {
	out := append([]string(nil), c.DNSNames...)
	for _, ip := range c.IPAddresses {
		out = append(out, ip.String())
	}
	return strings.Join(out, ", ")
}

// servedCertificate returns the leaf kadmit presents on addr. Trust is
// checked by the caller against the registered caBundle.
func servedCertificate(ctx context.Context, addr string) (*x509.Certificate, error) {
	d := tls.Dialer{Config: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}} //nolint:gosec // verified against the caBundle by the caller
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := d.DialContext(dctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("TLS handshake with kadmit at %s: %w", addr, err)
	}
	defer c.Close()
	return c.(*tls.Conn).ConnectionState().PeerCertificates[0], nil
}

// rotateServing asks kadmit for a new serving certificate the way an
// operator would (annotating the Secret), waits until kadmit serves it
// without a restart, and checks a pod is still admitted and mutated.
func rotateServing(ctx context.Context, client kubernetes.Interface, addr string) row {
	r := row{step: "rotate the serving certificate", expected: "new certificate served, pods still admitted"}
	fail := func(err error) row {
		r.got = err.Error()
		r.problems = []string{err.Error()}
		return r
	}
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	before, err := servedCertificate(ctx, addr)
	if err != nil {
		return fail(err)
	}
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:"serving"}}}`, rotateAnnotation)
	if _, err := client.CoreV1().Secrets(kadmitNamespace).Patch(ctx, secretName, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		return fail(err)
	}
	var after *x509.Certificate
	if err := poll.Until(ctx, 0, func(ctx context.Context) error {
		c, err := servedCertificate(ctx, addr)
		switch {
		case err != nil:
			return err
		case c.SerialNumber.Cmp(before.SerialNumber) == 0:
			return errors.New("kadmit still serves the old certificate")
		}
		after = c
		return nil
	}); err != nil {
		return fail(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "after-rotation", Namespace: metav1.NamespaceDefault},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "pause", Image: "registry.k8s.io/pause:3.10"}}},
	}
	got, err := client.CoreV1().Pods(metav1.NamespaceDefault).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		return fail(fmt.Errorf("pod after rotation: %w", err))
	}
	n := len(seed.LifespanTolerations(got.Spec.Tolerations))
	r.got = fmt.Sprintf("serial %s… -> %s…, pod admitted with %d toleration(s)",
		before.SerialNumber.Text(16)[:6], after.SerialNumber.Text(16)[:6], n)
	r.match = n == 1
	if !r.match {
		r.problems = []string{fmt.Sprintf("pod after rotation has %d acme.com tolerations; want 1", n)}
	}
	return r
}
