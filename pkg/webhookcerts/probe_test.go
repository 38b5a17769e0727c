package webhookcerts

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"reflect"
	"sort"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
)

// ReadyEndpoints lists the ready (or unknown) endpoints of the Service's
// slices, on the target port of the Service port's name, once each.
func TestReadyEndpoints(t *testing.T) {
	p := func(v int32) *int32 { return &v }
	s := func(v string) *string { return &v }
	yes, no := true, false
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: testSvc},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{
			{Name: "metrics", Port: 8080, TargetPort: intstr.FromInt32(8080)},
			{Name: "https", Port: 443, TargetPort: intstr.FromString("webhook")},
		}}}
	slice := func(name, svcName string, ports []discoveryv1.EndpointPort, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svcName}},
			Ports:      ports, Endpoints: eps,
		}
	}
	ports := []discoveryv1.EndpointPort{{Name: s("metrics"), Port: p(8080)}, {Name: s("https"), Port: p(9443)}}
	kube := fake.NewClientset(svc,
		slice("a", testSvc, ports,
			discoveryv1.Endpoint{Addresses: []string{"10.0.0.1"}, Conditions: discoveryv1.EndpointConditions{Ready: &yes}},
			discoveryv1.Endpoint{Addresses: []string{"10.0.0.2"}, Conditions: discoveryv1.EndpointConditions{Ready: &no}},
			discoveryv1.Endpoint{Addresses: []string{"fd00::3"}}),
		slice("b", testSvc, ports, discoveryv1.Endpoint{Addresses: []string{"10.0.0.1"}}),
		slice("c", "other", ports, discoveryv1.Endpoint{Addresses: []string{"10.9.9.9"}}),
	)
	got, err := ReadyEndpoints(context.Background(), kube, ServiceRef{Namespace: testNS, Name: testSvc, Port: 443})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(got)
	if want := []string{"10.0.0.1:9443", "[fd00::3]:9443"}; !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	if _, err := ReadyEndpoints(context.Background(), kube, ServiceRef{Namespace: testNS, Name: testSvc, Port: 444}); err == nil {
		t.Error("a port the Service lacks: want an error")
	}
	empty := fake.NewClientset(svc, slice("a", testSvc, ports, discoveryv1.Endpoint{Addresses: []string{"10.0.0.2"}, Conditions: discoveryv1.EndpointConditions{Ready: &no}}))
	if _, err := ReadyEndpoints(context.Background(), empty, ServiceRef{Namespace: testNS, Name: testSvc, Port: 443}); !errors.Is(err, ErrNoReadyEndpoint) {
		t.Errorf("no ready endpoint: %v", err)
	}
}

// The real handshaker completes a TLS handshake as the API server would:
// verified against the roots for the server name, returning the chain.
func TestTLSHandshaker(t *testing.T) {
	spec := Spec{DNSNames: []string{serverName}, ServingValidity: time.Hour, CAValidity: 2 * time.Hour}
	m, err := NewMaterial(spec, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{*m.Serving}})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				_ = c.(*tls.Conn).Handshake()
				c.Close()
			}()
		}
	}()
	roots := x509.NewCertPool()
	roots.AddCert(m.Bundle[0])
	ctx := context.Background()
	chain, err := tlsHandshaker{}.Handshake(ctx, ln.Addr().String(), serverName, roots)
	if err != nil || !chain[0].Equal(m.Serving.Leaf) {
		t.Fatalf("handshake: %v", err)
	}
	other, _ := NewMaterial(spec, time.Now())
	otherRoots := x509.NewCertPool()
	otherRoots.AddCert(other.Bundle[0])
	if _, err := (tlsHandshaker{}).Handshake(ctx, ln.Addr().String(), serverName, otherRoots); err == nil {
		t.Error("handshake verified against a foreign CA")
	}
	if _, err := (tlsHandshaker{}).Handshake(ctx, ln.Addr().String(), "other.sys.svc", roots); err == nil {
		t.Error("handshake verified for a name the certificate lacks")
	}
	// A listener that never answers: bounded by HandshakeTimeout.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	start := time.Now()
	if _, err := (tlsHandshaker{}).Handshake(ctx, silent.Addr().String(), serverName, roots); err == nil || time.Since(start) > HandshakeTimeout+2*time.Second {
		t.Errorf("silent endpoint: %v after %s", err, time.Since(start))
	}
}
