package registration

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"

	"k8s.io/client-go/kubernetes"

	"github.com/kadmit/kadmit/pkg/webhookcerts"
)

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
// Service's EndpointSlices, on the target port of Port
// (webhookcerts.ReadyEndpoints), none when no endpoint is ready. It fails
// when the Service cannot be read or an endpoint does not complete a TLS
// handshake within webhookcerts.HandshakeTimeout. Verification is the caller's: it
// checks against the bundle in question.
func (p EndpointProber) Probe(ctx context.Context) ([]*x509.Certificate, error) {
	addrs, err := webhookcerts.ReadyEndpoints(ctx, p.Client, webhookcerts.ServiceRef{Namespace: p.Namespace, Name: p.Service, Port: p.Port})
	if errors.Is(err, webhookcerts.ErrNoReadyEndpoint) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := make([]*x509.Certificate, 0, len(addrs))
	for _, addr := range addrs {
		chain, err := webhookcerts.ServedChain(ctx, addr, p.ServerName, nil)
		if err != nil {
			return nil, fmt.Errorf("probe endpoint %s: %w", addr, err)
		}
		out = append(out, chain[0])
	}
	return out, nil
}
