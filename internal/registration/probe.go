package registration

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// HandshakeTimeout bounds each endpoint handshake of EndpointProber.
const HandshakeTimeout = 3 * time.Second

// EndpointProber handshakes with every ready endpoint of kadmit's Service
// as the API server would (ServerName, no client certificate), to learn
// which certificates the API server would be served.
type EndpointProber struct {
	Client kubernetes.Interface
	// Namespace, Service and Port name the Service the webhooks call
	// (clientConfig.service); Port 0 means 443.
	Namespace, Service string
	Port               int32
	// ServerName is sent as SNI, as the API server sends <svc>.<ns>.svc.
	ServerName string
}

// Probe returns the leaf certificate of every ready endpoint address of the
// Service's EndpointSlices, on the target port of Port. It fails when the
// Service cannot be read or an endpoint does not complete a TLS handshake
// within HandshakeTimeout. Verification is the caller's: it checks against
// the bundle in question.
func (p EndpointProber) Probe(ctx context.Context) ([]*x509.Certificate, error) {
	svc, err := p.Client.CoreV1().Services(p.Namespace).Get(ctx, p.Service, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get Service %s/%s: %w", p.Namespace, p.Service, err)
	}
	port := p.Port
	if port == 0 {
		port = 443
	}
	var portName string
	for _, sp := range svc.Spec.Ports {
		if sp.Port == port {
			portName = sp.Name
		}
	}
	slices, err := p.Client.DiscoveryV1().EndpointSlices(p.Namespace).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svc.Name})
	if err != nil {
		return nil, fmt.Errorf("list EndpointSlices of %s/%s: %w", p.Namespace, svc.Name, err)
	}
	var out []*x509.Certificate
	for _, sl := range slices.Items {
		var target int32
		for _, sp := range sl.Ports {
			if sp.Port != nil && (sp.Name == nil && portName == "" || sp.Name != nil && *sp.Name == portName) {
				target = *sp.Port
			}
		}
		if target == 0 {
			continue
		}
		for _, ep := range sl.Endpoints {
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue
			}
			for _, addr := range ep.Addresses {
				leaf, err := ServedLeaf(ctx, net.JoinHostPort(addr, strconv.Itoa(int(target))), p.ServerName)
				if err != nil {
					return nil, fmt.Errorf("probe endpoint %s: %w", addr, err)
				}
				out = append(out, leaf)
			}
		}
	}
	return out, nil
}

// ServedLeaf returns the leaf certificate served at addr for serverName,
// within HandshakeTimeout. It does not verify it: callers check it against
// specific CAs.
func ServedLeaf(ctx context.Context, addr, serverName string) (*x509.Certificate, error) {
	d := tls.Dialer{Config: &tls.Config{ServerName: serverName, InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}} //nolint:gosec // verified by the caller against the CA in question
	dctx, cancel := context.WithTimeout(ctx, HandshakeTimeout)
	defer cancel()
	c, err := d.DialContext(dctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	state := c.(*tls.Conn).ConnectionState()
	if len(state.PeerCertificates) == 0 {
		return nil, errors.New("no certificate served")
	}
	return state.PeerCertificates[0], nil
}
