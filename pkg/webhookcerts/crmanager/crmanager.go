// Package crmanager adds a webhookcerts.Rotator to a controller-runtime
// manager: the drop-in replacement for cert-controller's rotator.AddRotator.
// It is the only package of the module that imports controller-runtime.
//
// The Rotator needs these permissions (kubebuilder markers below): the owned
// webhook configurations and CRDs (get, list, watch, patch for server-side
// apply; update kept for cert-controller parity), the certificate Secret in
// its namespace (get, list, watch, create, update), and, for the gate that
// drops an old CA, the Service (get) and its EndpointSlices (get, list).
// The namespaced rules use kubebuilder's namespace "system", which
// kustomize renames to the install's namespace.
package crmanager

import (
	"errors"
	"fmt"
	"net/http"

	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/kadmit/kadmit/pkg/webhookcerts"
)

// +kubebuilder:rbac:groups="admissionregistration.k8s.io",resources=mutatingwebhookconfigurations,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups="admissionregistration.k8s.io",resources=validatingwebhookconfigurations,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups="apiextensions.k8s.io",resources=customresourcedefinitions,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups="",namespace=system,resources=secrets,verbs=get;list;watch;create;update
// +kubebuilder:rbac:groups="",namespace=system,resources=services,verbs=get
// +kubebuilder:rbac:groups="discovery.k8s.io",namespace=system,resources=endpointslices,verbs=get;list

// Add builds a Rotator from mgr.GetConfig() and opts (Logger defaults to
// mgr.GetLogger().WithName("webhookcerts")) and attaches it to mgr
// (Attach). Register r.ReadyzCheck with mgr.AddReadyzCheck in place of the
// webhook server's StartedChecker.
//
// It returns an error when mgr is nil, opts are invalid (wrapping
// webhookcerts.ErrInvalidOptions), or Attach fails.
func Add(mgr manager.Manager, opts webhookcerts.Options) (*webhookcerts.Rotator, error) {
	if mgr == nil {
		return nil, errors.New("crmanager: nil manager")
	}
	if opts.Logger.GetSink() == nil {
		opts.Logger = mgr.GetLogger().WithName("webhookcerts")
	}
	r, err := webhookcerts.New(mgr.GetConfig(), opts)
	if err != nil {
		return nil, err
	}
	if err := Attach(mgr, r); err != nil {
		return nil, err
	}
	return r, nil
}

// Attach makes the manager's webhook server serve r's certificate (r.TLSOpt
// appended to mgr.GetWebhookServer().(*webhook.DefaultServer).Options.TLSOpts,
// so the server reads no CertDir) and adds r to mgr, which Starts it on
// every replica (no leader election). Use it for a Rotator built and
// bootstrapped before the manager (r.Bootstrap, e.g. so CRD conversion
// works before the manager's caches sync); call it before mgr.Start.
//
// It returns an error when mgr or r is nil, the webhook server is not a
// *webhook.DefaultServer (or a DrainingServer wrapping one) (then set its TLS options to r.TLSOpt yourself and
// call mgr.Add(r)), or mgr.Add fails.
func Attach(mgr manager.Manager, r *webhookcerts.Rotator) error {
	if mgr == nil || r == nil {
		return errors.New("crmanager: nil manager or rotator")
	}
	ws := mgr.GetWebhookServer()
	if d, ok := ws.(*DrainingServer); ok {
		ws = d.Unwrap()
	}
	srv, ok := ws.(*webhook.DefaultServer)
	if !ok {
		return fmt.Errorf("crmanager: the manager's webhook server is a %T, not a *webhook.DefaultServer: set its TLS options to Rotator.TLSOpt yourself and call mgr.Add", mgr.GetWebhookServer())
	}
	srv.Options.TLSOpts = append(srv.Options.TLSOpts, r.TLSOpt)
	if err := mgr.Add(r); err != nil {
		return fmt.Errorf("crmanager: add the rotator to the manager: %w", err)
	}
	return nil
}

// ReadyzCheck is the readiness check to register in place of
// controller-runtime's webhook StartedChecker (mgr.AddReadyzCheck("readyz",
// crmanager.ReadyzCheck(mgr, r))): ready when r's served chain verifies
// against the live caBundle of every configuration and CRD r owns, for the
// Service's name (Rotator.ReadyzCheck), and the manager's webhook server
// accepts TLS connections on its port (StartedChecker). Either alone is not
// enough: a listening server with a chain the API server does not trust
// fails every call, and a trusted chain on a server not yet listening is
// refused. The webhook server is looked up at each call, as Kueue does, so
// the check can be registered before the server is built.
func ReadyzCheck(mgr manager.Manager, r *webhookcerts.Rotator) healthz.Checker {
	return func(req *http.Request) error {
		if err := r.ReadyzCheck(req); err != nil {
			return err
		}
		ws := mgr.GetWebhookServer()
		if d, ok := ws.(*DrainingServer); ok && d.Draining() {
			return errors.New("webhook server: draining before shutdown")
		}
		if err := ws.StartedChecker()(req); err != nil {
			return fmt.Errorf("webhook server: %w", err)
		}
		return nil
	}
}
