package lifecycle

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"sort"
	"strconv"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/kadmit/kadmit/internal/certs"
	"github.com/kadmit/kadmit/internal/registration"
)

// elect competes for the Lease until ctx ends; while leading, it reconciles.
func (m *Manager) elect(ctx context.Context) {
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: m.o.Namespace, Name: m.o.LeaseName},
		Client:     m.o.Client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: m.o.Identity},
	}
	for ctx.Err() == nil {
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock:            lock,
			LeaseDuration:   m.o.LeaseDuration,
			RenewDeadline:   m.o.RenewDeadline,
			RetryPeriod:     m.o.RetryPeriod,
			ReleaseOnCancel: true,
			Name:            m.o.LeaseName,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(lctx context.Context) {
					m.leading.Store(true)
					m.log.Info("became leader: writing certificates and caBundle", "lease", m.o.LeaseName, "identity", m.o.Identity)
					m.lead(lctx)
				},
				OnStoppedLeading: func() {
					// client-go calls this when Run returns, led or not.
					if m.leading.Swap(false) {
						m.log.Info("stopped leading", "lease", m.o.LeaseName)
					}
				},
			},
		})
		if err != nil {
			m.log.Error("leader election misconfigured", "error", err)
			return
		}
		le.Run(ctx)
		// Run returns when leadership is lost; compete again unless stopping.
		select {
		case <-ctx.Done():
		case <-time.After(m.o.RetryPeriod):
		}
	}
}

// lead reconciles on every Secret or configuration event, and at least every
// few seconds while a rotation is under way.
func (m *Manager) lead(ctx context.Context) {
	m.trigger()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.kick:
		case <-timer.C:
		}
		next, err := m.reconcile(ctx)
		if err != nil && ctx.Err() == nil {
			m.log.Warn("reconcile failed; retrying", "error", err)
			next = time.Second
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(next)
	}
}

// reconcile takes the Secret and the webhook configurations one step towards
// the desired state and says when to look again.
func (m *Manager) reconcile(ctx context.Context) (time.Duration, error) {
	now := m.o.Now()
	secrets := m.o.Client.CoreV1().Secrets(m.o.Namespace)
	s, err := secrets.Get(ctx, m.o.SecretName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return m.restore(ctx, nil)
	}
	if err != nil {
		return 0, fmt.Errorf("get Secret: %w", err)
	}
	mat, perr := certs.ParseSecretData(s.Data)
	if perr != nil {
		m.log.Warn("certificate Secret is unusable; restoring it", "error", perr)
		return m.restore(ctx, s)
	}

	var next *certs.Material
	due := mat.Check(m.o.Spec, now)
	forced := s.Annotations[RotateAnnotation]
	switch {
	case due == certs.DueReissueFromNewCA:
		// The API server must trust the new CA before anything serves from it.
		if ok, wait := m.bundleSettled(ctx, mat); !ok {
			_, err := m.inject(ctx, mat)
			return wait, err
		}
		next, err = mat.WithServing(m.o.Spec, now)
		m.count("serving")
	case due == certs.DueDropOldCAs:
		if ok, wait, err := m.allServeFrom(ctx, mat.Bundle[0]); err != nil || !ok {
			_, ierr := m.inject(ctx, mat)
			return wait, errors.Join(err, ierr)
		}
		next = mat.WithoutOldCAs()
	case due == certs.DueCA || forced == "ca":
		next, err = mat.WithNewCA(m.o.Spec, now)
		m.count("ca")
	case due == certs.DueServing || forced == "serving":
		next, err = mat.WithServing(m.o.Spec, now)
		m.count("serving")
	}
	if err != nil {
		return 0, err
	}
	if next != nil {
		m.log.Info("updating certificate Secret", "step", stepName(due, forced), "bundleCAs", len(next.Bundle))
		upd := s.DeepCopy()
		upd.Data = next.SecretData()
		if forced != "" && (due == certs.DueNothing || due == certs.DueCA || due == certs.DueServing) {
			delete(upd.Annotations, RotateAnnotation)
		}
		if _, err := secrets.Update(ctx, upd, metav1.UpdateOptions{FieldManager: registration.FieldManager}); err != nil {
			return 0, fmt.Errorf("update Secret: %w", err)
		}
		// The informer event brings us back with the new content.
		return time.Second, nil
	}
	held, err := m.inject(ctx, mat)
	if err != nil {
		return 0, err
	}
	if held {
		// No informer event announces a ready endpoint (EndpointSlices are
		// not watched): look again soon rather than at the next renewal.
		return time.Second, nil
	}
	wait := time.Until(certs.RenewAt(mat.Serving.Leaf))
	if caWait := time.Until(certs.RenewAt(mat.Bundle[0])); caWait < wait {
		wait = caWait
	}
	return min(max(wait, time.Second), 30*time.Second), nil
}

func stepName(due certs.Due, forced string) string {
	if due == certs.DueNothing {
		return "forced " + forced
	}
	return string(due)
}

// restore rewrites a deleted or corrupt Secret from the last material every
// replica still serves, so nothing changes for the API server; only when none
// is known does it issue a new CA.
func (m *Manager) restore(ctx context.Context, existing *corev1.Secret) (time.Duration, error) {
	m.mu.Lock()
	mat := m.last
	m.mu.Unlock()
	if mat == nil {
		var err error
		if mat, err = certs.NewMaterial(m.o.Spec, m.o.Now()); err != nil {
			return 0, err
		}
		m.count("ca")
		m.count("serving")
	}
	secrets := m.o.Client.CoreV1().Secrets(m.o.Namespace)
	if existing == nil {
		if _, err := secrets.Create(ctx, m.newSecret(mat), metav1.CreateOptions{FieldManager: registration.FieldManager}); err != nil && !apierrors.IsAlreadyExists(err) {
			return 0, fmt.Errorf("recreate Secret: %w", err)
		}
		m.log.Info("recreated deleted certificate Secret from the material in use")
		return time.Second, nil
	}
	upd := existing.DeepCopy()
	upd.Type = corev1.SecretTypeTLS
	upd.Data = mat.SecretData()
	if _, err := secrets.Update(ctx, upd, metav1.UpdateOptions{FieldManager: registration.FieldManager}); err != nil {
		return 0, fmt.Errorf("repair Secret: %w", err)
	}
	m.log.Info("repaired corrupt certificate Secret from the material in use")
	return time.Second, nil
}

// inject writes the webhook configurations with the Secret's bundle as
// caBundle. Configurations that can reject requests are written only once a
// replica the API server would call is ready and verifies against that
// bundle: before that, a fresh install would block its own pods. held
// reports that it waits for that moment, so the caller looks again soon.
func (m *Manager) inject(ctx context.Context, mat *certs.Material) (held bool, err error) {
	if !m.o.Register {
		return false, nil
	}
	opts := m.o.Registration
	opts.CABundle = mat.BundlePEM()
	mwc, vwc, err := registration.Build(m.hooks(), opts)
	if err != nil {
		return false, err
	}
	if ok, why := m.servable(ctx, mat, m.registered(mwc, vwc)); !ok {
		// Retried every second: log only when the reason changes.
		if why != m.heldFor {
			m.log.Info("not registering webhooks yet", "reason", why)
			m.heldFor = why
		}
		return true, nil
	}
	m.heldFor = ""
	if stale := m.staleBundles(opts.CABundle); len(stale) > 0 {
		m.log.Info("injecting caBundle", "webhooks", stale, "cas", len(mat.Bundle))
	}
	return false, registration.Apply(ctx, m.o.Client, mwc, vwc)
}

// staleBundles names the webhooks whose cached caBundle differs from want,
// or "all" when no configuration exists yet; for the log only, since applying
// an unchanged configuration is a no-op for the API server.
func (m *Manager) staleBundles(want []byte) []string {
	live := m.trust.Bundles()
	if len(live) == 0 {
		return []string{"all"}
	}
	var out []string
	for name, b := range live {
		if !bytes.Equal(b, want) {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// registered reports whether every configuration to write already exists
// (informer cache).
func (m *Manager) registered(mwc *admissionregistrationv1.MutatingWebhookConfiguration, vwc *admissionregistrationv1.ValidatingWebhookConfiguration) bool {
	var mn, vn string
	if mwc != nil {
		mn = mwc.Name
	}
	if vwc != nil {
		vn = vwc.Name
	}
	return m.trust.exists(mn, vn)
}

// servable reports whether the API server, once the configurations exist,
// would reach a ready replica whose certificate verifies against the bundle.
//
// When the configurations already exist (repair), the API server calls kadmit
// already, and a ready endpoint is not required: readiness itself depends on
// the caBundle in those configurations, so after a blanked or foreign
// caBundle every replica reports not ready and waiting for a ready endpoint
// would make the outage permanent. This replica's own certificate must still
// verify against the bundle.
func (m *Manager) servable(ctx context.Context, mat *certs.Material, registered bool) (bool, string) {
	if m.o.ListenerReady != nil {
		if err := m.o.ListenerReady(); err != nil {
			return false, "this replica is not serving: " + err.Error()
		}
	}
	cur := m.o.Holder.Current()
	if cur == nil {
		return false, "no serving certificate loaded"
	}
	if err := certs.Verify(cur.Leaf, mat.BundlePEM(), m.o.ServerName, m.o.Now()); err != nil {
		return false, "own certificate does not verify against the bundle: " + err.Error()
	}
	if m.o.Registration.ServiceName == "" || registered {
		return true, ""
	}
	leaves, err := m.probeEndpoints(ctx)
	if err != nil {
		return false, err.Error()
	}
	for _, l := range leaves {
		if certs.Verify(l, mat.BundlePEM(), m.o.ServerName, m.o.Now()) == nil {
			return true, ""
		}
	}
	return false, "no ready endpoint of the Service serves a certificate the bundle verifies"
}

// bundleSettled reports whether every kadmit webhook configuration, as the API
// server returns it, has trusted the signing CA for at least SettleDelay.
func (m *Manager) bundleSettled(ctx context.Context, mat *certs.Material) (bool, time.Duration) {
	if !m.o.Register {
		return true, 0
	}
	bundles, err := m.serverBundles(ctx)
	if err != nil || len(bundles) == 0 {
		return false, time.Second
	}
	key := string(mat.Bundle[0].Raw)
	for _, b := range bundles {
		if !containsCert(b, mat.Bundle[0]) {
			delete(m.bundleAt, key)
			return false, time.Second
		}
	}
	first, ok := m.bundleAt[key]
	if !ok {
		m.bundleAt[key] = m.o.Now()
		return false, m.o.SettleDelay
	}
	if wait := m.o.SettleDelay - m.o.Now().Sub(first); wait > 0 {
		return false, wait
	}
	return true, 0
}

// serverBundles GETs the configurations from the API server (not the cache).
func (m *Manager) serverBundles(ctx context.Context) ([][]byte, error) {
	var out [][]byte
	ar := m.o.Client.AdmissionregistrationV1()
	mwc, err := ar.MutatingWebhookConfigurations().Get(ctx, m.o.Registration.Name, metav1.GetOptions{})
	if err == nil {
		for _, w := range mwc.Webhooks {
			out = append(out, w.ClientConfig.CABundle)
		}
	} else if !apierrors.IsNotFound(err) {
		return nil, err
	}
	vwc, err := ar.ValidatingWebhookConfigurations().Get(ctx, m.o.Registration.Name, metav1.GetOptions{})
	if err == nil {
		for _, w := range vwc.Webhooks {
			out = append(out, w.ClientConfig.CABundle)
		}
	} else if !apierrors.IsNotFound(err) {
		return nil, err
	}
	return out, nil
}

// allServeFrom reports whether every replica the API server can reach serves
// a certificate signed by ca, for SettleDelay already. Without a Service (dev
// mode) only this replica is checked, then SettleDelay covers the others'
// informer lag.
func (m *Manager) allServeFrom(ctx context.Context, ca *x509.Certificate) (bool, time.Duration, error) {
	leaves := []*x509.Certificate{}
	if cur := m.o.Holder.Current(); cur != nil {
		leaves = append(leaves, cur.Leaf)
	}
	if m.o.Registration.ServiceName != "" {
		probed, err := m.probeEndpoints(ctx)
		if err != nil {
			return false, time.Second, err
		}
		leaves = append(leaves, probed...)
	}
	for _, l := range leaves {
		if l.CheckSignatureFrom(ca) != nil {
			m.movedAt = time.Time{}
			return false, time.Second, nil
		}
	}
	if m.movedAt.IsZero() {
		m.movedAt = m.o.Now()
		return false, m.o.SettleDelay, nil
	}
	if wait := m.o.SettleDelay - m.o.Now().Sub(m.movedAt); wait > 0 {
		return false, wait, nil
	}
	m.movedAt = time.Time{}
	return true, 0, nil
}

// probeEndpoints handshakes with every ready endpoint of kadmit's Service, as
// the API server would (ServerName, no client certificate), and returns the
// certificates they serve. It fails when an endpoint does not answer.
func (m *Manager) probeEndpoints(ctx context.Context) ([]*x509.Certificate, error) {
	ns := m.o.Registration.ServiceNamespace
	svc, err := m.o.Client.CoreV1().Services(ns).Get(ctx, m.o.Registration.ServiceName, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get Service %s/%s: %w", ns, m.o.Registration.ServiceName, err)
	}
	port := m.o.Registration.ServicePort
	if port == 0 {
		port = 443
	}
	var portName string
	for _, p := range svc.Spec.Ports {
		if p.Port == port {
			portName = p.Name
		}
	}
	slices, err := m.o.Client.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svc.Name})
	if err != nil {
		return nil, fmt.Errorf("list EndpointSlices of %s/%s: %w", ns, svc.Name, err)
	}
	var out []*x509.Certificate
	for _, sl := range slices.Items {
		var target int32
		for _, p := range sl.Ports {
			if p.Port != nil && (p.Name == nil && portName == "" || p.Name != nil && *p.Name == portName) {
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
			for _, addr := range ep.Addresses {
				leaf, err := handshake(ctx, net.JoinHostPort(addr, strconv.Itoa(int(target))), m.o.ServerName)
				if err != nil {
					return nil, fmt.Errorf("probe endpoint %s: %w", addr, err)
				}
				out = append(out, leaf)
			}
		}
	}
	return out, nil
}

// handshake returns the leaf certificate served at addr for serverName.
// Verification is the caller's: it checks against specific CAs.
func handshake(ctx context.Context, addr, serverName string) (*x509.Certificate, error) {
	d := tls.Dialer{Config: &tls.Config{ServerName: serverName, InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}} //nolint:gosec // verified by the caller against the CA in question
	dctx, cancel := context.WithTimeout(ctx, 3*time.Second)
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
