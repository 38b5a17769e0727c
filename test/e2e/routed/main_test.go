// Package routed runs kadmit the way a cluster does: several `kadmit serve
// --tls=self-managed --register` replicas behind a Service, each on its own
// address, called by a real kube-apiserver that resolves the Service through
// its EndpointSlices (--enable-aggregator-routing) and verifies the serving
// certificate for kadmit.kadmit-system.svc. The test plays the kubelet (it
// starts, kills and stops the replicas) and the endpoints controller (it
// keeps the Service's EndpointSlice in step with each replica's /readyz).
//
// Everything runs inside a private network namespace (unshare --net): the
// replicas get addresses from 198.18.0.0/15 on its lo, which EndpointSlices
// accept and which never leave the machine. Without root, unshare or ip, or
// without the control plane binaries, the tests skip with the reason, unless
// KADMIT_E2E_REQUIRED=1 turns that into a failure. KADMIT_E2E_KEEP=1 keeps the
// temporary directory (replica logs, controlplane.log, kubeconfig).
package routed

import (
	"context"
	"fmt"
	"io"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kadmit/kadmit/test/e2e/e2eenv"
)

// The cluster's fixed names and addresses.
const (
	systemNS     = "kadmit-system"
	serviceName  = "kadmit"
	servicePort  = 443
	targetPort   = 9443
	portName     = "https"
	secretName   = "kadmit-tls"
	serverName   = serviceName + "." + systemNS + ".svc"
	loadNS       = "kadmit-load"    // where the load creates (dry-run) pods
	ignoredNS    = "kadmit-ignored" // labelled kadmit.io/ignore=true
	noListenerIP = "198.18.0.2"     // the routing sanity check's endpoint
)

// Bounds the tests hold the replicas to. They were set when a Lease (4 s)
// elected the one replica that wrote the Secret and the caBundles; every
// replica writes now, coordinated through the Secret's resourceVersion, so
// what took a take-over takes none, and the bounds stay as they were.
const (
	// registrationHold: how long no configuration may appear while no
	// endpoint of the Service is ready (several write attempts).
	registrationHold = 10 * time.Second
	// afterKillBound: how soon after a replica's SIGKILL the survivors
	// act on a forced rotation (the Lease's take-over bound: 4 s + 5 s).
	afterKillBound = 9 * time.Second
)

// env is the world every test shares, built once by TestMain: the base
// environment (its client's QPS raised for the load) and the replicas.
type env struct {
	*e2eenv.Env
	cluster *cluster
}

// replicaStopGrace bounds a replica's SIGTERM.
const replicaStopGrace = 15 * time.Second

var (
	shared = &env{}
	suite  = &e2eenv.Suite{
		Name:          "routed",
		Subject:       "Service-routed e2e tests",
		Netns:         e2eenv.NetnsRequired,
		LoopbackAddrs: []string{noListenerIP},
		// client-go's default 5 QPS would throttle the 20 pod creations per
		// second of the load, and the endpoints controller besides.
		QPS:   200,
		Burst: 400,
		Setup: shared.setup,
		Stop: func() {
			if shared.cluster != nil {
				shared.cluster.shutdown()
			}
		},
		PostMortem: func(w io.Writer) {
			if shared.cluster != nil {
				shared.cluster.dumpLogs(w, 30)
			}
		},
	}
)

func TestMain(m *testing.M) { os.Exit(suite.Main(m)) }

// setup creates the namespaces and the Service and starts the endpoints
// controller; the tests start the replicas.
func (e *env) setup(ctx context.Context, base *e2eenv.Env) error {
	e.Env = base
	for _, ns := range []*corev1.Namespace{
		{ObjectMeta: metav1.ObjectMeta{Name: systemNS}},
		{ObjectMeta: metav1.ObjectMeta{Name: loadNS}},
		{ObjectMeta: metav1.ObjectMeta{Name: ignoredNS, Labels: map[string]string{"kadmit.io/ignore": "true"}}},
	} {
		if _, err := e.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create namespace %s: %w", ns.Name, err)
		}
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: serviceName, Namespace: systemNS},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "kadmit"},
			Ports: []corev1.ServicePort{{Name: portName, Port: servicePort, TargetPort: intstr.FromInt32(targetPort),
				Protocol: corev1.ProtocolTCP}},
		},
	}
	if _, err := e.Client.CoreV1().Services(systemNS).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create Service: %w", err)
	}
	e.cluster = newCluster(e)
	e.cluster.startEndpointsController()
	return nil
}

// world returns the shared environment, skipping or failing t when there is
// none.
func world(t *testing.T) *env {
	t.Helper()
	suite.Env(t)
	return shared
}
