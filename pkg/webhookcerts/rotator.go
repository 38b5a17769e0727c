package webhookcerts

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// Timing of the reconcile loop.
const (
	// ResyncPeriod is the longest the Rotator goes without re-reading the
	// Secret and the owned objects; it also wakes at the serving
	// certificate's and the CA's RenewAt.
	ResyncPeriod = 10 * time.Minute
	// minBackoff and maxBackoff bound the wait before a gate not met or a
	// failed pass is tried again (doubling), unless an event comes first.
	minBackoff = time.Second
	maxBackoff = 30 * time.Second
	// bootstrapAttempts bounds Bootstrap's passes (with the backoff
	// between them: about 3 minutes in all).
	bootstrapAttempts = 10
	// syncTimeout bounds the informers' first sync in Start.
	syncTimeout = 2 * time.Minute
)

// Rotator runs a webhook server's certificate lifecycle in every replica,
// without leader election: the Secret's resourceVersion orders the
// replicas' writes. It serves the Secret's certificate from memory
// (GetCertificate, TLSOpt) and optionally CertDir, rotates it with overlap
// (a serving certificate at 2/3 of its life; a CA at 2/3 of its life in
// three gated steps: new CA added to the bundle, serving certificate
// re-issued once every owned caBundle trusts the new CA, old CA dropped once
// every ready endpoint serves from the new one), keeps the caBundle of the
// owned objects (Options.Webhooks, or those of Options.Injector) equal to
// the Secret's ca.crt, and answers readiness (ReadyzCheck). Build it with New or NewForClients; it is a
// controller-runtime manager.Runnable (Start, NeedLeaderElection).
type Rotator struct {
	o          Options // completed
	spec       Spec
	serverName string
	log        logr.Logger
	now        func() time.Time
	kube       kubernetes.Interface
	hs         handshaker
	// inj writes and reads the caBundles: Options.Injector, or ssa.
	inj Injector
	// ssa is the built-in Injector, nil when Options.Injector is set; its
	// informers start with the Rotator's.
	ssa *ssaInjector

	holder *Holder
	kick   chan struct{}

	// runMu serializes Bootstrap and the reconcile passes.
	runMu        sync.Mutex
	bootstrapped atomic.Bool
	started      atomic.Bool
	// synced: the informers have synced; reads use them from then on.
	synced atomic.Bool

	readyOnce sync.Once
	isReady   atomic.Bool

	mu          sync.Mutex
	mat         *Material // the material served
	matGen      int64     // its Secret's GenerationAnnotation
	dirOK       bool      // CertDir holds mat (or is read-only, or unset)
	secretStore cache.Store
	logged      map[string]bool
	backoff     time.Duration
	lastWaiting string
}

// New builds a Rotator whose clients use cfg (copied; user agent
// "webhookcerts"). It returns an error wrapping ErrInvalidOptions when opts
// are invalid, or the client construction error.
func New(cfg *rest.Config, opts Options) (*Rotator, error) {
	if cfg == nil {
		return nil, errors.New("webhookcerts: nil rest.Config")
	}
	cfg = rest.AddUserAgent(rest.CopyConfig(cfg), "webhookcerts")
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("webhookcerts: kubernetes client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("webhookcerts: dynamic client: %w", err)
	}
	return NewForClients(kube, dyn, opts)
}

// NewForClients builds a Rotator on the given clients. dyn may be nil when
// no Webhooks entry is a CRDConversion. It registers the Rotator with the
// Injector's OnChange. It returns an error wrapping ErrInvalidOptions when
// opts are invalid.
func NewForClients(kube kubernetes.Interface, dyn dynamic.Interface, opts Options) (*Rotator, error) {
	o, err := opts.complete()
	if err != nil {
		return nil, err
	}
	if kube == nil {
		return nil, errors.New("webhookcerts: nil kubernetes client")
	}
	if dyn == nil && slices.ContainsFunc(o.Webhooks, func(w WebhookInfo) bool { return w.Type == CRDConversion }) {
		return nil, errors.New("webhookcerts: a dynamic client is required for CRDConversion webhooks")
	}
	r := &Rotator{
		o:          o,
		spec:       o.spec(),
		serverName: o.serverName(),
		log:        o.Logger,
		now:        o.Clock,
		kube:       kube,
		hs:         tlsHandshaker{},
		inj:        o.Injector,
		holder:     o.Holder,
		kick:       make(chan struct{}, 1),
		logged:     map[string]bool{},
	}
	if r.inj == nil {
		r.ssa = newSSAInjector(o, kube, dyn)
		r.inj = r.ssa
	}
	if r.holder == nil {
		r.holder = &Holder{}
	}
	r.inj.OnChange(r.trigger)
	return r, nil
}

// NeedLeaderElection implements controller-runtime's
// LeaderElectionRunnable: false, every replica runs (and serves) the
// Rotator.
func (r *Rotator) NeedLeaderElection() bool { return false }

// GetCertificate is a tls.Config.GetCertificate serving the current
// certificate (the chain and key of the Secret's tls.crt / tls.key); it
// fails with ErrNoCertificate before Bootstrap has loaded one.
func (r *Rotator) GetCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	return r.holder.GetCertificate(hello)
}

// TLSOpt sets c.GetCertificate to r.GetCertificate; append it to
// controller-runtime's webhook.Options.TLSOpts.
func (r *Rotator) TLSOpt(c *tls.Config) { c.GetCertificate = r.GetCertificate }

// CABundle returns a copy of the served Secret's ca.crt (PEM, every
// trusted CA, newest first), or nil before Bootstrap.
func (r *Rotator) CABundle() []byte {
	if m := r.served(); m != nil {
		return bytes.Clone(m.BundlePEM())
	}
	return nil
}

// ServedBundle returns a copy of the served Secret's ca.crt and that
// Secret's GenerationAnnotation, or nil and 0 before Bootstrap: what an
// Injector that writes on its own (repairs) should write.
func (r *Rotator) ServedBundle() (bundle []byte, generation int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.mat == nil {
		return nil, 0
	}
	return bytes.Clone(r.mat.BundlePEM()), r.matGen
}

// Holder is where the served certificate is kept (Options.Holder, or the
// Rotator's own).
func (r *Rotator) Holder() *Holder { return r.holder }

// SANs are the serving certificate's DNS names and IP addresses, as
// strings, in the order they are issued.
func (r *Rotator) SANs() []string {
	out := slices.Clone(r.spec.DNSNames)
	for _, ip := range r.spec.IPs {
		out = append(out, ip.String())
	}
	return out
}

// CertificateCheck is ReadyzCheck without the caBundles: nil when Start's
// informers have synced and a certificate valid now is served, else
// ErrNotStarted or why not. For a server whose Injector already checks
// the caBundles in its own readiness.
func (r *Rotator) CertificateCheck() error {
	if !r.synced.Load() {
		return ErrNotStarted
	}
	if err := r.holder.Check(r.now()); err != nil {
		return fmt.Errorf("webhookcerts: %w", err)
	}
	return nil
}

// served is the material served, or nil.
func (r *Rotator) served() *Material {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.mat
}

// Bootstrap makes the webhook server usable, synchronously: the Secret is
// created (or filled, or its CA adopted) if need be, its certificate is
// served and written to CertDir, and the caBundle of every owned object
// that exists is injected and, as the API server returns it, verifies the
// served certificate; then IsReady is closed. Ungated steps that are due
// (an expired or mismatched serving certificate, a forced rotation) are
// performed; gated CA-rotation steps are left to Start. Transient failures
// are retried with backoff (1 s doubling to 30 s), at most 10 passes; it
// returns the last error, or ctx's. A second call returns nil at once.
func (r *Rotator) Bootstrap(ctx context.Context) error {
	r.runMu.Lock()
	defer r.runMu.Unlock()
	if r.bootstrapped.Load() {
		return nil
	}
	wait := minBackoff
	var err error
	for attempt := 1; ; attempt++ {
		if err = r.bootstrapPass(ctx); err == nil {
			r.bootstrapped.Store(true)
			r.log.Info("bootstrapped", "secret", r.o.SecretKey.String(), "serverName", r.serverName)
			return nil
		}
		if attempt == bootstrapAttempts {
			break
		}
		r.log.Info("bootstrap pass failed; retrying", "attempt", attempt, "in", wait.String(), "reason", err.Error())
		select {
		case <-ctx.Done():
			return fmt.Errorf("webhookcerts: bootstrap: %w (last error: %w)", ctx.Err(), err)
		case <-time.After(wait):
		}
		wait = min(2*wait, maxBackoff)
	}
	return fmt.Errorf("webhookcerts: bootstrap failed after %d passes: %w", bootstrapAttempts, err)
}

func (r *Rotator) bootstrapPass(ctx context.Context) error {
	s, mat, waiting, err := r.syncSecret(ctx, false)
	if err != nil {
		return err
	}
	if waiting != nil {
		r.log.V(1).Info("a CA rotation is under way", "step", waiting.Error())
	}
	if s, err = r.raiseGeneration(ctx, s, true); err != nil {
		return err
	}
	r.load(mat, secretGeneration(s))
	if err := r.certDirError(); err != nil {
		return err
	}
	if err := r.inj.Inject(ctx, mat.BundlePEM(), secretGeneration(s)); err != nil {
		return fmt.Errorf("inject caBundle: %w", err)
	}
	return r.markReady(ctx)
}

// Start runs the Rotator until ctx ends (controller-runtime's
// manager.Runnable): Bootstrap if not done yet, then the Secret informer and
// one informer per owned object, and a reconcile pass on every event of
// theirs, at every RenewAt, every ResyncPeriod, and while a gate is not met
// or a pass failed, after a backoff of 1 s doubling to 30 s. It returns nil
// when ctx ends, or an error when Bootstrap or the informers' first sync
// (within 2 minutes) fail. It may be called once.
func (r *Rotator) Start(ctx context.Context) error {
	if !r.started.CompareAndSwap(false, true) {
		return errors.New("webhookcerts: Start called twice")
	}
	if err := r.Bootstrap(ctx); err != nil {
		return err
	}
	if err := r.startInformers(ctx); err != nil {
		return err
	}
	r.log.Info("started", "secret", r.o.SecretKey.String(), "webhooks", len(r.o.Webhooks))
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-r.kick:
		case <-timer.C:
		}
		next := r.reconcile(ctx)
		if ctx.Err() != nil {
			return nil
		}
		timer.Reset(next)
	}
}

// startInformers starts the Secret informer and one informer per owned
// object and waits (at most syncTimeout) for them to sync.
func (r *Rotator) startInformers(ctx context.Context) error {
	secretInf, err := r.startSecretInformer(ctx)
	if err != nil {
		return err
	}
	syncs := []cache.InformerSynced{secretInf.HasSynced}
	if r.ssa != nil {
		owned, err := r.ssa.start(ctx)
		if err != nil {
			return fmt.Errorf("webhookcerts: %w", err)
		}
		syncs = append(syncs, owned...)
	}
	sctx, cancel := context.WithTimeout(ctx, syncTimeout)
	defer cancel()
	if !cache.WaitForCacheSync(sctx.Done(), syncs...) {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("webhookcerts: informers of the Secret and the owned objects did not sync within %s (RBAC list/watch?)", syncTimeout)
	}
	if r.ssa != nil {
		r.ssa.markSynced()
	}
	r.synced.Store(true)
	return nil
}

// trigger asks the reconcile loop for a pass.
func (r *Rotator) trigger() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// reconcile is one pass of Start's loop and says when to run the next one
// if no event comes first.
func (r *Rotator) reconcile(ctx context.Context) time.Duration {
	r.runMu.Lock()
	defer r.runMu.Unlock()
	waiting, err := r.reconcileOnce(ctx)
	switch {
	case ctx.Err() != nil:
		return maxBackoff
	case err != nil:
		d := r.nextBackoff()
		r.log.Error(err, "reconcile failed; retrying", "in", d.String())
		return d
	case waiting != nil:
		// A gate that waits on something new (the rotation moved on)
		// starts the backoff over, and is logged; the same gate again is
		// logged at V(1).
		r.mu.Lock()
		changed := r.lastWaiting != waiting.Error()
		if changed {
			r.lastWaiting, r.backoff = waiting.Error(), 0
		}
		r.mu.Unlock()
		d := r.nextBackoff()
		log := r.log.V(1)
		if changed {
			log = r.log
		}
		log.Info("rotation step waiting", "reason", waiting.Error(), "recheckIn", d.String())
		return d
	}
	r.mu.Lock()
	r.backoff, r.lastWaiting = 0, ""
	m := r.mat
	r.mu.Unlock()
	next := ResyncPeriod
	if m != nil {
		now := r.now()
		next = min(next, RenewAt(m.Serving.Leaf).Sub(now), RenewAt(m.Bundle[0]).Sub(now))
	}
	return max(next, minBackoff)
}

func (r *Rotator) nextBackoff() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.backoff = min(max(2*r.backoff, minBackoff), maxBackoff)
	return r.backoff
}

// reconcileOnce takes the Secret through every step that is due and whose
// gate is met, then injects its bundle. It returns the gate that holds a
// step back, if any.
func (r *Rotator) reconcileOnce(ctx context.Context) (waiting, err error) {
	s, mat, waiting, err := r.syncSecret(ctx, true)
	if err != nil {
		return nil, err
	}
	if s, err = r.raiseGeneration(ctx, s, false); err != nil {
		return waiting, err
	}
	if !r.synced.Load() {
		// Without informers (tests driving passes directly), serve what
		// was read.
		r.load(mat, secretGeneration(s))
	}
	if err := r.inj.Inject(ctx, mat.BundlePEM(), secretGeneration(s)); err != nil {
		return waiting, fmt.Errorf("inject caBundle: %w", err)
	}
	if !r.isReady.Load() {
		if err := r.markReady(ctx); err != nil {
			r.log.V(1).Info("not ready yet", "reason", err.Error())
		}
	}
	if err := r.certDirError(); err != nil {
		// Try the write again (the informer only loads on change).
		if m := r.served(); m != nil {
			r.mu.Lock()
			gen := r.matGen
			r.mu.Unlock()
			r.load(m, gen)
		}
		return waiting, r.certDirError()
	}
	return waiting, nil
}

// load serves m (swapping the certificate atomically when its chain
// changed) and writes CertDir when it changed.
func (r *Rotator) load(m *Material, gen int64) {
	cur := r.holder.Current()
	if cur == nil || !sameChain(cur, m.Serving) {
		r.holder.Set(m.Serving)
		if r.o.Observer != nil {
			r.o.Observer.OnLoad(m.Serving.Leaf, m.Bundle[0])
		}
		leaf := m.Serving.Leaf
		r.log.Info("serving certificate loaded", "serial", leaf.SerialNumber.Text(16), "issuer", leaf.Issuer.CommonName,
			"notAfter", leaf.NotAfter, "renewAt", RenewAt(leaf), "chain", len(m.Serving.Certificate), "generation", gen)
	}
	dirOK := true
	if r.o.CertDir != "" {
		d := m.SecretData()
		wrote, err := writeCertDir(r.o.CertDir, r.o.CertName, r.o.KeyName, d[SecretCertKey], d[SecretKeyKey])
		switch {
		case errors.Is(err, errReadOnlyDir):
			r.logOnce("certdir-ro", "CertDir is read-only (a mounted Secret?); leaving it to the kubelet and serving through GetCertificate", "dir", r.o.CertDir)
		case err != nil:
			dirOK = false
			r.log.Error(err, "writing CertDir failed", "dir", r.o.CertDir)
			if r.o.Observer != nil {
				r.o.Observer.OnError(fmt.Errorf("write CertDir %s: %w", r.o.CertDir, err))
			}
		case wrote:
			r.log.Info("CertDir written", "dir", r.o.CertDir)
		}
	}
	r.mu.Lock()
	r.mat, r.matGen, r.dirOK = m, gen, dirOK
	r.mu.Unlock()
}

func (r *Rotator) certDirError() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.dirOK {
		return fmt.Errorf("webhookcerts: CertDir %s not written", r.o.CertDir)
	}
	return nil
}

// markReady closes IsReady, once, when a certificate is served, CertDir
// is written and every owned caBundle the API server returns verifies it.
func (r *Rotator) markReady(ctx context.Context) error {
	if err := r.certDirError(); err != nil {
		return err
	}
	if err := r.verifyOwned(ctx, true); err != nil {
		return err
	}
	r.readyOnce.Do(func() {
		r.isReady.Store(true)
		if r.o.IsReady != nil {
			close(r.o.IsReady)
		}
		r.log.Info("certificates ready: served, and trusted by every owned caBundle")
	})
	return nil
}

// gateReissue is the gate of DueReissueFromNewCA: every owned webhook's
// caBundle, as the API server returns it (the Injector's live read), holds
// the new CA and verifies next's served chain.
func (r *Rotator) gateReissue(ctx context.Context, next *Material) error {
	newCA := next.Bundle[0]
	now := r.now()
	bundles, _, err := r.inj.Bundles(ctx, true)
	if err != nil {
		return err
	}
	for _, name := range slices.Sorted(maps.Keys(bundles)) {
		b := bundles[name]
		if !bundleHolds(b, newCA) {
			return fmt.Errorf("%s: the caBundle does not hold the new CA %q yet", name, newCA.Subject.CommonName)
		}
		if err := VerifyChain(next.Serving, b, r.serverName, now); err != nil {
			return fmt.Errorf("%s: the new serving chain does not verify against the caBundle: %w", name, err)
		}
	}
	return nil
}

// gateDropOld is the gate of DueDropOldCAs: this replica serves a
// certificate issued by the newest CA, and (with a Service) every ready
// endpoint of the Service completes a TLS handshake for serverName whose
// chain verifies against every distinct live caBundle of the owned
// objects (the Secret's bundle when none exists) and whose leaf the newest
// CA issued.
func (r *Rotator) gateDropOld(ctx context.Context, cur *Material) error {
	newCA := cur.Bundle[0]
	if c := r.holder.Current(); c == nil || c.Leaf.CheckSignatureFrom(newCA) != nil {
		return fmt.Errorf("this replica does not serve a certificate from the newest CA %q yet", newCA.Subject.CommonName)
	}
	if r.o.Service == nil {
		return nil
	}
	live, _, err := r.inj.Bundles(ctx, true)
	if err != nil {
		return err
	}
	var bundles [][]byte
	for _, name := range slices.Sorted(maps.Keys(live)) {
		if b := live[name]; !slices.ContainsFunc(bundles, func(o []byte) bool { return bytes.Equal(o, b) }) {
			bundles = append(bundles, b)
		}
	}
	if len(bundles) == 0 {
		bundles = [][]byte{cur.BundlePEM()}
	}
	addrs, err := ReadyEndpoints(ctx, r.kube, *r.o.Service)
	if err != nil {
		return err
	}
	for _, b := range bundles {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(b) {
			return errors.New("a live caBundle holds no PEM certificate")
		}
		for _, addr := range addrs {
			chain, err := r.hs.Handshake(ctx, addr, r.serverName, pool)
			if err != nil {
				return fmt.Errorf("endpoint %s: %w", addr, err)
			}
			if chain[0].CheckSignatureFrom(newCA) != nil {
				return fmt.Errorf("endpoint %s serves a certificate issued by %q, not the newest CA %q", addr, chain[0].Issuer.CommonName, newCA.Subject.CommonName)
			}
		}
	}
	return nil
}

// bundleHolds reports whether the PEM bundle holds ca.
func bundleHolds(bundle []byte, ca *x509.Certificate) bool {
	cs, err := ParseCertificates(bundle)
	return err == nil && slices.ContainsFunc(cs, ca.Equal)
}

// sameChain reports whether a and b serve the same certificates.
func sameChain(a, b *tls.Certificate) bool {
	return slices.EqualFunc(a.Certificate, b.Certificate, bytes.Equal)
}

// logOnce logs msg the first time key is seen.
func (r *Rotator) logOnce(key, msg string, kv ...any) {
	r.mu.Lock()
	seen := r.logged[key]
	r.logged[key] = true
	r.mu.Unlock()
	if !seen {
		r.log.Info(msg, kv...)
	}
}
