package lifecycle

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"github.com/kadmit/kadmit/pkg/webhookcerts"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

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
	mat, perr := webhookcerts.ParseSecretData(s.Data)
	if perr != nil {
		m.log.Warn("certificate Secret is unusable; restoring it", "error", perr)
		return m.restore(ctx, s)
	}

	var next *webhookcerts.Material
	due := mat.Check(m.o.Spec, now)
	forced := s.Annotations[RotateAnnotation]
	switch {
	case due == webhookcerts.DueReissueFromNewCA:
		// The API server must trust the new CA before anything serves from it.
		if ok, wait := m.bundleSettled(ctx, mat); !ok {
			_, err := m.inject(ctx, mat)
			return wait, err
		}
		next, err = mat.WithServing(m.o.Spec, now)
		m.count("serving")
	case due == webhookcerts.DueDropOldCAs:
		if ok, wait, err := m.allServeFrom(ctx, mat.Bundle[0]); err != nil || !ok {
			_, ierr := m.inject(ctx, mat)
			return wait, errors.Join(err, ierr)
		}
		next = mat.WithoutOldCAs()
	case due == webhookcerts.DueCA || forced == "ca":
		next, err = mat.WithNewCA(m.o.Spec, now)
		m.count("ca")
	case due == webhookcerts.DueServing || forced == "serving":
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
		if forced != "" && (due == webhookcerts.DueNothing || due == webhookcerts.DueCA || due == webhookcerts.DueServing) {
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
	wait := time.Until(webhookcerts.RenewAt(mat.Serving.Leaf))
	if caWait := time.Until(webhookcerts.RenewAt(mat.Bundle[0])); caWait < wait {
		wait = caWait
	}
	return min(max(wait, time.Second), 30*time.Second), nil
}

func stepName(due webhookcerts.Due, forced string) string {
	if due == webhookcerts.DueNothing {
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
		if mat, err = webhookcerts.NewMaterial(m.o.Spec, m.o.Now()); err != nil {
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

// inject has the registrar write the webhook configurations with the
// Secret's bundle as caBundle (see registration.Registrar.Inject for when it
// holds back). Without --register there is nothing to write.
func (m *Manager) inject(ctx context.Context, mat *webhookcerts.Material) (held bool, err error) {
	if m.registrar == nil {
		return false, nil
	}
	return m.registrar.Inject(ctx, mat.BundlePEM())
}

// bundleSettled reports whether every kadmit webhook configuration, as the API
// server returns it, has trusted the signing CA for at least SettleDelay.
func (m *Manager) bundleSettled(ctx context.Context, mat *webhookcerts.Material) (bool, time.Duration) {
	if m.registrar == nil {
		return true, 0
	}
	bundles, err := m.registrar.ServerBundles(ctx)
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

// allServeFrom reports whether every replica the API server can reach serves
// a certificate signed by ca, for SettleDelay already. Without a Service (dev
// mode) only this replica is checked, then SettleDelay covers the others'
// informer lag.
func (m *Manager) allServeFrom(ctx context.Context, ca *x509.Certificate) (bool, time.Duration, error) {
	leaves := []*x509.Certificate{}
	if cur := m.holder.Current(); cur != nil {
		leaves = append(leaves, cur.Leaf)
	}
	if m.o.Probe != nil {
		probed, err := m.o.Probe(ctx)
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
