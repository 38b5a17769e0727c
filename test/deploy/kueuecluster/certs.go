package kueuecluster

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kadmit/kadmit/test/cluster"
)

// ParseCerts returns the certificates of a PEM bundle.
func ParseCerts(data []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// SecretCAs returns the CAs in the webhook Secret's ca.crt (none while it
// is empty).
func SecretCAs(ctx context.Context, c *cluster.Cluster) ([]*x509.Certificate, error) {
	s, err := c.Client.CoreV1().Secrets(Namespace).Get(ctx, SecretName, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return ParseCerts(s.Data["ca.crt"])
}

func contains(set []*x509.Certificate, c *x509.Certificate) bool {
	for _, s := range set {
		if bytes.Equal(s.Raw, c.Raw) {
			return true
		}
	}
	return false
}

// ClearSecret empties the webhook Secret's data (an update, keeping the
// object): cert-controller's documented way to force a new CA and leaf.
// It finds no valid CA in the Secret on its next reconcile and regenerates
// both; deleting the Secret instead would leave it with nothing to update
// (it never creates the Secret: the chart does).
func ClearSecret(ctx context.Context, c *cluster.Cluster) error {
	s, err := c.Client.CoreV1().Secrets(Namespace).Get(ctx, SecretName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	s.Data = nil
	_, err = c.Client.CoreV1().Secrets(Namespace).Update(ctx, s, metav1.UpdateOptions{})
	return err
}

// AnnotateRotate sets RotateAnnotation=value on the webhook Secret
// (webhookcerts' way to force a rotation).
func AnnotateRotate(ctx context.Context, c *cluster.Cluster, value string) error {
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, RotateAnnotation, value)
	_, err := c.Client.CoreV1().Secrets(Namespace).Patch(ctx, SecretName, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	return err
}

// RotationDone returns nil once the Secret's ca.crt holds exactly one CA
// that is none of old, every webhook of both webhook configurations trusts
// it (its caBundle contains it), and every manager pod that is Ready
// serves a leaf that verifies for ServerName against that CA alone.
func RotationDone(ctx context.Context, c *cluster.Cluster, old []*x509.Certificate) error {
	cas, err := SecretCAs(ctx, c)
	if err != nil {
		return err
	}
	if len(cas) != 1 {
		return fmt.Errorf("secret ca.crt holds %d CAs", len(cas))
	}
	ca := cas[0]
	if contains(old, ca) {
		return errors.New("secret ca.crt still holds an old CA")
	}
	if err := bundlesTrust(ctx, c, ca); err != nil {
		return err
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	pods, err := Pods(ctx, c)
	if err != nil {
		return err
	}
	ready := 0
	for _, p := range pods {
		if !podReady(&p) || p.Status.PodIP == "" {
			continue
		}
		ready++
		leaf, err := ServedLeaf(ctx, net.JoinHostPort(p.Status.PodIP, strconv.Itoa(WebhookPort)))
		if err != nil {
			return fmt.Errorf("pod %s: %w", p.Name, err)
		}
		if _, err := leaf.Verify(x509.VerifyOptions{DNSName: ServerName, Roots: pool}); err != nil {
			return fmt.Errorf("pod %s serves a leaf not from the new CA: %w", p.Name, err)
		}
	}
	if ready == 0 {
		return errors.New("no manager pod is Ready")
	}
	return nil
}

func bundlesTrust(ctx context.Context, c *cluster.Cluster, ca *x509.Certificate) error {
	reg := c.Client.AdmissionregistrationV1()
	m, err := reg.MutatingWebhookConfigurations().Get(ctx, MutatingName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	v, err := reg.ValidatingWebhookConfigurations().Get(ctx, ValidatingName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	check := func(kind, name string, bundle []byte) error {
		certs, err := ParseCerts(bundle)
		if err != nil {
			return fmt.Errorf("%s webhook %s: caBundle: %w", kind, name, err)
		}
		if !contains(certs, ca) {
			return fmt.Errorf("%s webhook %s: caBundle does not hold the new CA", kind, name)
		}
		return nil
	}
	for _, w := range m.Webhooks {
		if err := check("mutating", w.Name, w.ClientConfig.CABundle); err != nil {
			return err
		}
	}
	for _, w := range v.Webhooks {
		if err := check("validating", w.Name, w.ClientConfig.CABundle); err != nil {
			return err
		}
	}
	return nil
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// ServedLeaf returns the leaf certificate served at addr for ServerName
// (not verified here).
func ServedLeaf(ctx context.Context, addr string) (*x509.Certificate, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	d := tls.Dialer{Config: &tls.Config{ServerName: ServerName, InsecureSkipVerify: true}} //nolint:gosec // the caller verifies against the CA it expects
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	st := conn.(*tls.Conn).ConnectionState()
	if len(st.PeerCertificates) == 0 {
		return nil, fmt.Errorf("%s: no certificate", addr)
	}
	return st.PeerCertificates[0], nil
}

// Leader returns the name of the pod holding LeaseName (controller-runtime
// writes holderIdentity as "<hostname>_<uuid>", the hostname being the
// pod's name).
func Leader(ctx context.Context, c *cluster.Cluster) (string, error) {
	l, err := c.Client.CoordinationV1().Leases(Namespace).Get(ctx, LeaseName, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
		return "", errors.New("lease has no holder")
	}
	name, _, _ := strings.Cut(*l.Spec.HolderIdentity, "_")
	return name, nil
}
