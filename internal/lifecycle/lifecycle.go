// Package lifecycle is the self-managed certificate source (--tls=
// self-managed): every replica bootstraps and watches the certificate
// Secret and swaps its serving certificate without a restart; the replica
// holding the Lease writes the Secret (renewals, CA rotation, recovery) and,
// through the registrar, the caBundle of kadmit's webhook configurations,
// step by step so the API server never meets an unknown authority.
package lifecycle

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kadmit/kadmit/pkg/webhookcerts"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listerscorev1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/kadmit/kadmit/internal/certs"
	"github.com/kadmit/kadmit/internal/metrics"
	"github.com/kadmit/kadmit/internal/registration"
)

// RotateAnnotation on the certificate Secret asks the leader for a rotation
// now: "serving" re-issues the serving certificate, "ca" starts a CA rotation.
// The leader removes it once done.
const RotateAnnotation = "kadmit.io/rotate"

// Options configure a Manager.
type Options struct {
	Client     kubernetes.Interface
	Namespace  string
	SecretName string
	// Spec is what the serving certificate must look like; its SANs come
	// from certs.Names.ServiceSANs.
	Spec webhookcerts.Spec
	// Probe, when set, returns the certificates served by the ready
	// endpoints of kadmit's Service (registration.EndpointProber.Probe): an
	// old CA leaves the bundle only once all of them come from the new one.
	// Nil in URL mode, where only this replica is checked.
	Probe func(context.Context) ([]*x509.Certificate, error)
	// LeaseName and Identity configure leader election; LeaseDuration,
	// RenewDeadline and RetryPeriod default to 15s, 10s and 2s.
	LeaseName                                 string
	Identity                                  string
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// SettleDelay is how long a caBundle must have been in every
	// configuration before serving certificates move to a new CA, and how
	// long old CAs stay trusted after the last replica moved, covering the
	// API server's and the replicas' informer lag; default 3s.
	SettleDelay time.Duration
	Metrics     *metrics.Certificates
	Logger      *slog.Logger
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// Manager runs the TLS lifecycle of one replica: it is the self-managed
// certs.Source.
type Manager struct {
	o       Options
	log     *slog.Logger
	holder  webhookcerts.Holder
	secrets listerscorev1.SecretLister
	kick    chan struct{}
	leading atomic.Bool
	// registrar writes the configurations; nil without --register.
	registrar *registration.Registrar

	mu       sync.Mutex
	last     *webhookcerts.Material // newest valid material seen, to restore a deleted Secret
	bundleAt map[string]time.Time
	movedAt  time.Time
	synced   atomic.Bool
}

var _ certs.Source = (*Manager)(nil)

// New checks opts and builds a Manager; Start runs it.
func New(opts Options) (*Manager, error) {
	if opts.Client == nil || opts.Namespace == "" || opts.SecretName == "" {
		return nil, errors.New("lifecycle: client, namespace and secret name are required")
	}
	if len(opts.Spec.DNSNames) == 0 && len(opts.Spec.IPs) == 0 {
		return nil, fmt.Errorf("lifecycle: %w", webhookcerts.ErrNoSANs)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.SettleDelay <= 0 {
		opts.SettleDelay = 3 * time.Second
	}
	if opts.LeaseName == "" {
		opts.LeaseName = opts.SecretName + "-leader"
	}
	if opts.LeaseDuration <= 0 {
		opts.LeaseDuration = 15 * time.Second
	}
	if opts.RenewDeadline <= 0 {
		opts.RenewDeadline = 10 * time.Second
	}
	if opts.RetryPeriod <= 0 {
		opts.RetryPeriod = 2 * time.Second
	}
	return &Manager{o: opts, log: opts.Logger.With("component", "tls-lifecycle"), kick: make(chan struct{}, 1), bundleAt: map[string]time.Time{}}, nil
}

// SetRegistrar makes the leader write the webhook configurations through
// reg (--register), with the Secret's bundle as caBundle at each step of a
// rotation; reg's configuration events and hook changes wake the leader.
// Call it before Start.
func (m *Manager) SetRegistrar(reg *registration.Registrar) {
	m.registrar = reg
	// A blanked caBundle, a deleted configuration or new hooks: the leader
	// re-injects at once.
	reg.OnChange(m.trigger)
}

// Start bootstraps the Secret (Create, or read what another replica created),
// starts the informer, loads the serving certificate and starts leader
// election in the background. It returns once a certificate is served or ctx
// ends; the background work stops with ctx.
func (m *Manager) Start(ctx context.Context) error {
	if err := m.startCaches(ctx); err != nil {
		return err
	}
	go m.elect(ctx)
	return nil
}

// startCaches is Start without the election: bootstrap, the Secret
// informer, the first load.
func (m *Manager) startCaches(ctx context.Context) error {
	if err := m.bootstrap(ctx); err != nil {
		return err
	}
	secretInf := informers.NewSharedInformerFactoryWithOptions(m.o.Client, 10*time.Minute,
		informers.WithNamespace(m.o.Namespace),
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
			lo.FieldSelector = fields.OneTermEqualSelector("metadata.name", m.o.SecretName).String()
		}))
	si := secretInf.Core().V1().Secrets()
	m.secrets = si.Lister()
	if _, err := si.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { m.onEvent() },
		UpdateFunc: func(any, any) { m.onEvent() },
		DeleteFunc: func(any) { m.onEvent() },
	}); err != nil {
		return fmt.Errorf("lifecycle: add event handler: %w", err)
	}
	secretInf.Start(ctx.Done())
	for typ, ok := range secretInf.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("lifecycle: %v informer did not sync", typ)
		}
	}
	m.synced.Store(true)
	m.load()
	if m.holder.Current() == nil {
		return fmt.Errorf("lifecycle: Secret %s/%s holds no usable certificate", m.o.Namespace, m.o.SecretName)
	}
	return nil
}

// bootstrap makes sure the Secret exists. Every replica may race here: the
// first Create wins and the others read the winner's material, so two CAs
// never fight.
func (m *Manager) bootstrap(ctx context.Context) error {
	secrets := m.o.Client.CoreV1().Secrets(m.o.Namespace)
	s, err := secrets.Get(ctx, m.o.SecretName, metav1.GetOptions{})
	if err == nil {
		if _, perr := webhookcerts.ParseSecretData(s.Data); perr != nil {
			m.log.Warn("certificate Secret is unusable; waiting for the leader to repair it", "secret", m.o.SecretName, "error", perr)
		}
		return nil
	}
	if !apierrors.IsNotFound(err) {
		return fmt.Errorf("lifecycle: get Secret %s/%s: %w", m.o.Namespace, m.o.SecretName, err)
	}
	mat, err := webhookcerts.NewMaterial(m.o.Spec, m.o.Now())
	if err != nil {
		return fmt.Errorf("lifecycle: %w", err)
	}
	_, err = secrets.Create(ctx, m.newSecret(mat), metav1.CreateOptions{FieldManager: registration.FieldManager})
	switch {
	case err == nil:
		m.log.Info("created certificate Secret", "secret", m.o.SecretName, "ca", mat.Bundle[0].Subject.CommonName)
		m.count("ca")
		m.count("serving")
	case apierrors.IsAlreadyExists(err):
		m.log.Info("certificate Secret created by another replica; using it", "secret", m.o.SecretName)
	default:
		return fmt.Errorf("lifecycle: create Secret %s/%s: %w", m.o.Namespace, m.o.SecretName, err)
	}
	return nil
}

func (m *Manager) newSecret(mat *webhookcerts.Material) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: m.o.SecretName, Namespace: m.o.Namespace,
			Labels: map[string]string{"app.kubernetes.io/managed-by": "kadmit"}},
		Type: corev1.SecretTypeTLS,
		Data: mat.SecretData(),
	}
}

func (m *Manager) onEvent() {
	m.load()
	m.trigger()
}

func (m *Manager) trigger() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// load swaps in the Secret's serving certificate when it changed. A missing
// or corrupt Secret keeps the current certificate: serving on is better than
// failing every admission while the leader repairs it.
func (m *Manager) load() {
	if m.secrets == nil {
		return
	}
	s, err := m.secrets.Secrets(m.o.Namespace).Get(m.o.SecretName)
	if err != nil {
		return
	}
	mat, err := webhookcerts.ParseSecretData(s.Data)
	if err != nil {
		m.log.Error("certificate Secret is unusable; keeping the current certificate", "error", err)
		m.o.Metrics.ReloadError()
		return
	}
	m.mu.Lock()
	m.last = mat
	m.mu.Unlock()
	cur := m.holder.Current()
	if cur != nil && cur.Leaf != nil && cur.Leaf.Equal(mat.Serving.Leaf) {
		return
	}
	m.holder.Set(mat.Serving)
	m.o.Metrics.Loaded(mat.Serving.Leaf, mat.Bundle[0])
	m.log.Info("serving certificate loaded", "serial", mat.Serving.Leaf.SerialNumber.Text(16),
		"issuer", mat.Serving.Leaf.Issuer.CommonName, "notAfter", mat.Serving.Leaf.NotAfter, "renewAt", webhookcerts.RenewAt(mat.Serving.Leaf))
}

// Holder implements certs.Source: the Secret's serving certificate.
func (m *Manager) Holder() *webhookcerts.Holder { return &m.holder }

// CABundle implements certs.Source: the ca.crt of the newest valid Secret
// seen (every CA the API server must trust, newest first), or nil.
func (m *Manager) CABundle() []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.last == nil {
		return nil
	}
	return m.last.BundlePEM()
}

// SANs implements certs.Source: the SANs every serving certificate is
// issued for.
func (m *Manager) SANs() []string {
	out := append([]string(nil), m.o.Spec.DNSNames...)
	for _, ip := range m.o.Spec.IPs {
		out = append(out, ip.String())
	}
	return out
}

// Ready implements certs.Source: the Secret informer synced and the served
// certificate is fresh (certs.Fresh). Whether the API server trusts it is
// the registrar's check.
func (m *Manager) Ready() error {
	if !m.synced.Load() {
		return errors.New("certificate Secret informer not synced")
	}
	return certs.Fresh(&m.holder, m.o.Now())
}

// IsLeader reports whether this replica writes the Secret and caBundle.
func (m *Manager) IsLeader() bool { return m.leading.Load() }

func (m *Manager) count(kind string) { m.o.Metrics.Rotated(kind) }

// containsCert reports whether bundlePEM holds ca.
func containsCert(bundlePEM []byte, ca *x509.Certificate) bool {
	cs, err := webhookcerts.ParseCertificates(bundlePEM)
	if err != nil {
		return false
	}
	for _, c := range cs {
		if c.Equal(ca) {
			return true
		}
	}
	return false
}
