package webhookcerts

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
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
// owned objects (Options.Webhooks) equal to the Secret's ca.crt, and answers
// readiness (ReadyzCheck). Build it with New or NewForClients; it is a
// controller-runtime manager.Runnable (Start, NeedLeaderElection).
type Rotator struct {
	o          Options // completed
	spec       Spec
	serverName string
	log        logr.Logger
	now        func() time.Time
	kube       kubernetes.Interface
	dyn        dynamic.Interface
	hs         handshaker

	holder Holder
	kick   chan struct{}

	// runMu serializes Bootstrap and the reconcile passes.
	runMu        sync.Mutex
	bootstrapped atomic.Bool
	started      atomic.Bool
	// synced: the informers have synced; reads use them from then on.
	synced atomic.Bool

	readyOnce sync.Once
	isReady   atomic.Bool

	mu             sync.Mutex
	mat            *Material // the material served
	matGen         int64     // its Secret's GenerationAnnotation
	dirOK          bool      // CertDir holds mat (or is read-only, or unset)
	secretStore    cache.Store
	ownedInformers map[WebhookInfo]cache.SharedIndexInformer
	missing        map[WebhookInfo]bool
	logged         map[string]bool
	backoff        time.Duration
	lastWaiting    string
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
// no Webhooks entry is a CRDConversion. It returns an error wrapping
// ErrInvalidOptions when opts are invalid.
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
	return &Rotator{
		o:              o,
		spec:           o.spec(),
		serverName:     o.serverName(),
		log:            o.Logger,
		now:            o.Clock,
		kube:           kube,
		dyn:            dyn,
		hs:             tlsHandshaker{},
		kick:           make(chan struct{}, 1),
		ownedInformers: map[WebhookInfo]cache.SharedIndexInformer{},
		missing:        map[WebhookInfo]bool{},
		logged:         map[string]bool{},
	}, nil
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
	if err := r.inject(ctx, mat.BundlePEM(), secretGeneration(s), true); err != nil {
		return err
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
	for _, info := range r.o.Webhooks {
		inf, err := r.newOwnedInformer(info, 0)
		if err != nil {
			return fmt.Errorf("webhookcerts: %w", err)
		}
		name := info.Name
		onOwned := func(obj any) {
			if m, ok := obj.(interface{ GetName() string }); !ok || m.GetName() == name {
				r.trigger()
			}
		}
		if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    onOwned,
			UpdateFunc: func(_, obj any) { onOwned(obj) },
			DeleteFunc: onOwned,
		}); err != nil {
			return fmt.Errorf("webhookcerts: %s %q informer: %w", info.Type, info.Name, err)
		}
		r.mu.Lock()
		r.ownedInformers[info] = inf
		r.mu.Unlock()
		go inf.RunWithContext(ctx)
		syncs = append(syncs, inf.HasSynced)
	}
	sctx, cancel := context.WithTimeout(ctx, syncTimeout)
	defer cancel()
	if !cache.WaitForCacheSync(sctx.Done(), syncs...) {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("webhookcerts: informers of the Secret and the owned objects did not sync within %s (RBAC list/watch?)", syncTimeout)
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
	if err := r.inject(ctx, mat.BundlePEM(), secretGeneration(s), false); err != nil {
		return waiting, err
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

// gateReissue is the gate of DueReissueFromNewCA: every webhook of every
// owned object that exists, as the API server returns it (GETs), has a
// caBundle that holds the new CA and verifies next's served chain.
func (r *Rotator) gateReissue(ctx context.Context, next *Material) error {
	newCA := next.Bundle[0]
	now := r.now()
	for _, info := range r.o.Webhooks {
		o, err := r.getLive(ctx, info)
		if err != nil {
			return err
		}
		for _, h := range o.hooks {
			if !bundleHolds(h.caBundle, newCA) {
				return fmt.Errorf("%s webhook %q: the caBundle does not hold the new CA %q yet", o, h.name, newCA.Subject.CommonName)
			}
			if err := VerifyChain(next.Serving, h.caBundle, r.serverName, now); err != nil {
				return fmt.Errorf("%s webhook %q: the new serving chain does not verify against the caBundle: %w", o, h.name, err)
			}
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
	var bundles [][]byte
	for _, info := range r.o.Webhooks {
		o, err := r.getLive(ctx, info)
		if err != nil {
			return err
		}
		for _, h := range o.hooks {
			if !slices.ContainsFunc(bundles, func(b []byte) bool { return bytes.Equal(b, h.caBundle) }) {
				bundles = append(bundles, h.caBundle)
			}
		}
	}
	if len(bundles) == 0 {
		bundles = [][]byte{cur.BundlePEM()}
	}
	addrs, err := readyEndpoints(ctx, r.kube, *r.o.Service)
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
