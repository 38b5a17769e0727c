package webhookcerts

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// HandshakeTimeout bounds each endpoint handshake of the drop-old-CA gate.
const HandshakeTimeout = 3 * time.Second

// handshaker completes a TLS handshake with one endpoint as the API server
// would: SNI serverName, the server's chain verified against roots for
// serverName, no client certificate. It returns the chain the endpoint
// served (leaf first). Tests substitute it.
type handshaker interface {
	Handshake(ctx context.Context, addr, serverName string, roots *x509.CertPool) ([]*x509.Certificate, error)
}

// tlsHandshaker is the real handshaker: a TCP dial and TLS handshake within
// HandshakeTimeout.
type tlsHandshaker struct{}

func (tlsHandshaker) Handshake(ctx context.Context, addr, serverName string, roots *x509.CertPool) ([]*x509.Certificate, error) {
	return ServedChain(ctx, addr, serverName, roots)
}

// ServedChain dials addr ("host:port") and completes a TLS handshake as the
// API server would (SNI serverName, no client certificate) within
// HandshakeTimeout, returning the chain served, leaf first. With roots, the
// chain must verify against them for serverName; with nil roots nothing is
// verified (the caller checks the chain against the CAs in question).
func ServedChain(ctx context.Context, addr, serverName string, roots *x509.CertPool) ([]*x509.Certificate, error) {
	ctx, cancel := context.WithTimeout(ctx, HandshakeTimeout)
	defer cancel()
	cfg := &tls.Config{ServerName: serverName, RootCAs: roots, MinVersion: tls.VersionTLS12}
	if roots == nil {
		cfg.InsecureSkipVerify = true //nolint:gosec // the caller verifies the chain against the CA in question
	}
	d := tls.Dialer{Config: cfg}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("TLS handshake with %s as %s: %w", addr, serverName, err)
	}
	defer c.Close()
	state := c.(*tls.Conn).ConnectionState()
	if len(state.PeerCertificates) == 0 {
		return nil, fmt.Errorf("TLS handshake with %s: no certificate served", addr)
	}
	return state.PeerCertificates, nil
}

// ErrNoReadyEndpoint is returned by ReadyEndpoints when the Service has no
// ready endpoint on the port.
var ErrNoReadyEndpoint = errors.New("the Service has no ready endpoint")

// ReadyEndpoints returns "host:port" of every ready endpoint address of svc,
// on the target port of svc.Port (0 means DefaultServicePort), from the EndpointSlices labelled
// kubernetes.io/service-name=<svc>. An endpoint whose ready condition is
// unset counts as ready, as the EndpointSlice API says.
func ReadyEndpoints(ctx context.Context, kube kubernetes.Interface, svc ServiceRef) ([]string, error) {
	if svc.Port == 0 {
		svc.Port = DefaultServicePort
	}
	s, err := kube.CoreV1().Services(svc.Namespace).Get(ctx, svc.Name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get Service %s/%s: %w", svc.Namespace, svc.Name, err)
	}
	portName, found := "", false
	for _, sp := range s.Spec.Ports {
		if sp.Port == svc.Port {
			portName, found = sp.Name, true
			break
		}
	}
	if !found {
		return nil, fmt.Errorf("Service %s/%s has no port %d", svc.Namespace, svc.Name, svc.Port)
	}
	list, err := kube.DiscoveryV1().EndpointSlices(svc.Namespace).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svc.Name})
	if err != nil {
		return nil, fmt.Errorf("list EndpointSlices of Service %s/%s: %w", svc.Namespace, svc.Name, err)
	}
	var out []string
	for _, sl := range list.Items {
		var target int32
		for _, p := range sl.Ports {
			name := ""
			if p.Name != nil {
				name = *p.Name
			}
			if p.Port != nil && name == portName {
				target = *p.Port
			}
		}
		if target == 0 {
			continue
		}
		for _, ep := range sl.Endpoints {
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue
			}
			for _, a := range ep.Addresses {
				// A Service's slices may list an address twice while they
				// are being rebalanced.
				if addr := net.JoinHostPort(a, strconv.Itoa(int(target))); !slices.Contains(out, addr) {
					out = append(out, addr)
				}
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w on port %d (%s/%s)", ErrNoReadyEndpoint, svc.Port, svc.Namespace, svc.Name)
	}
	return out, nil
}
