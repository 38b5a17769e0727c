package doctor

import (
	"context"
	"crypto/x509"
	"fmt"
	"os"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// snapWithEndpoint is one Fail webhook whose Service has one ready
// endpoint of a Deployment's pod.
func snapWithEndpoint() (*Snapshot, *Backend) {
	pod := rsPod("kueue-controller-manager", "7d9f6c4b8", kueueLabels(), "10.0.0.7")
	d := deployment("kueue-controller-manager", kueueLabels())
	b := &Backend{Namespace: lwsNS, Name: "kueue-webhook-service", NamespaceExists: true, NamespaceLabelsKnown: true,
		Service: svc("kueue-webhook-service", kueueLabels()), Slices: []discoveryv1.EndpointSlice{*slice("kueue-webhook-service", pod)},
		Pods: []*corev1.Pod{pod}, Deployments: map[string]*appsv1.Deployment{d.Name: d}}
	b.Resolve()
	return &Snapshot{Webhooks: FromMutating(mutatingConfig("kueue-mutating-webhook-configuration", "mjob.kb.io", "kueue-webhook-service")),
		Namespaces: map[string]map[string]string{lwsNS: nil}, NamespacesKnown: true, Backends: map[string]*Backend{lwsNS + "/kueue-webhook-service": b}}, b
}

// The Handshake seam replaces doctor's dial: a pending endpoint gets no
// finding at all (not even "unreachable"); InCluster turns a timeout into
// KD409 instead of KD410; ReadyEndpoints counts what checkService reads.
func TestHandshakeSeam(t *testing.T) {
	snap, b := snapWithEndpoint()
	if n, ok := ReadyEndpoints(snap.Webhooks[0], b); !ok || n != 1 {
		t.Fatalf("ReadyEndpoints = %d, %v", n, ok)
	}
	for _, tc := range []struct {
		name      string
		err       error
		inCluster bool
		want      string // the endpoint's finding ID, "" none
		noKD410   bool
	}{
		{"pending", ErrHandshakePending, true, "", true},
		{"timeout from a laptop", fmt.Errorf("dial: %w", os.ErrDeadlineExceeded), false, "", false},
		{"timeout in cluster", fmt.Errorf("dial: %w", os.ErrDeadlineExceeded), true, IDHandshakeFailed, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var asked []string
			hs := func(_ context.Context, w *Webhook, addr, sn string) ([]*x509.Certificate, error) {
				asked = append(asked, w.Name+" "+addr+" "+sn)
				return nil, tc.err
			}
			rep, err := Diagnose(context.Background(), nil, snap, Options{Handshake: hs, InCluster: tc.inCluster})
			if err != nil {
				t.Fatal(err)
			}
			w := rep.Webhooks[0]
			if len(asked) != 1 || asked[0] != "mjob.kb.io 10.0.0.7:9443 kueue-webhook-service.lws-system.svc" {
				t.Fatalf("seam asked %q", asked)
			}
			var got string
			for _, f := range w.Findings {
				if f.Endpoint != "" {
					got = f.ID
				}
			}
			if got != tc.want || (tc.noKD410 && w.Has(IDEndpointUnreachable)) || (!tc.noKD410 && !w.Has(IDEndpointUnreachable)) {
				t.Fatalf("endpoint finding %q (want %q), findings %v", got, tc.want, w.Findings)
			}
		})
	}
}
