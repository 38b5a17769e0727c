package registration

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kadmit/kadmit/pkg/webhookcerts"

	"golang.org/x/time/rate"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listersadmissionv1 "k8s.io/client-go/listers/admissionregistration/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/certs"
)

// RetryInterval is how often a held back or failed write is retried: no
// event announces a ready endpoint (EndpointSlices are not watched).
const RetryInterval = time.Second

// DefaultProxySettle is RegistrarOptions.ProxySettle's default: 3s, how
// long a first registration in Service mode waits, after its probe first
// finds a ready endpoint that verifies, for kube-proxy on every node to
// route the Service's ClusterIP (where the API server calls) to it. The
// probe dials the pod directly and reads the same EndpointSlice kube-proxy
// watches, so what remains is kube-proxy's lag behind that slice: its
// iptables and nftables modes sync rules at most once per minSyncPeriod,
// 1s by default (KubeProxyIPTablesConfiguration and
// KubeProxyNFTablesConfiguration, defaulted in k8s.io/kubernetes v1.37.1
// pkg/proxy/apis/config/v1alpha1), so a slice change just after a sync
// waits up to 1s, then the sync itself runs (iptables-restore, longer with
// more Services) after the watch delivered the change to each node.
// Measured on a two-node cluster: 1.06s between the endpoint turning ready
// and node1's rules naming it. 3s is three minSyncPeriods: room for a slow
// sync or watch on a loaded node. Not covered: syncPeriod (30s by default),
// the periodic full resync, which only matters when a sync failed, and a
// kube-proxy configured with a longer minSyncPeriod (raise ProxySettle).
// The endpoint-slice controller's batching (--endpointslice-updates-batch-
// period, 0 by default) comes before the slice the probe reads, so it adds
// nothing here.
const DefaultProxySettle = 3 * time.Second

// UnregisterGrace is how long a path stays "called" (Registrar.Calls) after
// the last webhook calling it left the install's configurations, as this
// replica's informer sees them: 30s. The API server's own webhook
// configuration informer lags a write by up to about a second (more on a
// loaded or HA control plane, one informer per API server); until it
// catches up it still calls the path, and kadmit answers there (allowed:
// the policy is off) instead of 404, which the failurePolicy would turn
// into a denial.
const UnregisterGrace = 30 * time.Second

// RegistrarOptions configure a Registrar.
type RegistrarOptions struct {
	Client kubernetes.Interface
	// Registration names the configurations (Options.Name, one per
	// install) and where the API server calls; its CABundle is ignored: each
	// write injects the bundle it is given.
	Registration Options
	Hooks        []admission.Hook
	// ServerName is the name the API server verifies kadmit's certificate
	// for (certs.Names.ServerName).
	ServerName string
	// Holder is this replica's served certificate.
	Holder *webhookcerts.Holder
	// Bundle returns the certificate source's current caBundle and its
	// generation (the certificate Secret's webhookcerts.GenerationAnnotation;
	// 0 for sources without one): what Run injects, and what readiness
	// verifies against before any configuration exists.
	Bundle func() (bundle []byte, generation int64)
	// Listening reports whether this replica's HTTPS listener serves
	// (server.Server.Serving); nothing is written before it does.
	Listening func() error
	// Probe, when set, returns the certificates the ready endpoints of
	// kadmit's Service serve (EndpointProber.Probe). A first registration
	// waits until one verifies against the bundle. Nil in URL mode.
	Probe func(context.Context) ([]*x509.Certificate, error)
	// ProxySettle is how long, with Probe, a first registration waits
	// after the probe first found a ready endpoint that verifies, with
	// every probe in between finding one, for kube-proxy to route the
	// Service to it; zero means DefaultProxySettle. A repair does not
	// wait (see Inject).
	ProxySettle time.Duration
	Logger      *slog.Logger
	// Recorder, when set, receives the Warning Event ReasonCABundleContested
	// on a configuration whose caBundle another field manager keeps
	// rewriting, and ReasonCABundleContestEnded once it stopped (see
	// ContestFreeRepairs); nil: none.
	Recorder record.EventRecorder
	// Observer, when set, receives every write and every fight over
	// caBundle (kadmit's metrics); nil: none.
	Observer ContestObserver
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// Registrar is the one writer of kadmit's MutatingWebhookConfiguration and
// ValidatingWebhookConfiguration: it builds them from the hooks, injects the
// certificate source's caBundle, server-side applies them (field manager
// kadmit: it owns the webhooks it registers, the managed-by label and the
// generation annotation, nothing else, so fields and annotations others
// add, e.g. a GitOps controller's tracking label, stay theirs and are never
// rewritten) and, through an informer on exactly those two objects, repairs
// them when someone changes them (a blanked or stale caBundle, a deleted
// configuration), and deletes one no hook of its type is left in. A
// caBundle another field manager keeps rewriting is repaired at once
// ContestFreeRepairs times, then with an exponential backoff, reported as
// a Warning Event, through Observer and by Contested, instead of fought
// over (contest.go). The same
// informer tells the server which paths the API server may still call
// (Calls) and answers readiness: does the served
// certificate verify against every registered caBundle?
//
// Every TLS mode uses it, and Run drives it. With self-managed
// certificates it is also the webhookcerts.Rotator's Injector: the Rotator
// hands it each Secret's bundle (Inject) and reads the caBundles back
// (Bundles) to gate a CA rotation.
type Registrar struct {
	o   RegistrarOptions
	log *slog.Logger
	// writeMu serializes writes: Run and the Rotator's Inject both write.
	writeMu sync.Mutex

	mutating   listersadmissionv1.MutatingWebhookConfigurationLister
	validating listersadmissionv1.ValidatingWebhookConfigurationLister
	synced     atomic.Bool
	kick       chan struct{}

	mu       sync.Mutex
	hooks    []admission.Hook
	onChange []func()
	heldFor  string // why the last write held back, logged once per reason
	// offered and offeredGen are the newest bundle Inject was given: Run
	// writes it while the source's Bundle lags behind it.
	offered    []byte
	offeredGen int64
	foreign    types.UID // the last configuration deleteOwn left alone, logged once
	// verifiedSince is when the probe first found a ready endpoint that
	// verifies, in the current run of probes that all found one (zero:
	// none); a first registration waits until ProxySettle after it.
	verifiedSince time.Time
	// called maps each path a webhook of the configurations calls, as the
	// informer last saw them, to the zero time, and each path that stopped
	// being called less than UnregisterGrace ago to when it stopped (see
	// Calls). Its size is bounded by the webhooks of two objects the API
	// server stores (at most its 1.5 MiB request limit each) plus those
	// that left within the grace.
	called map[string]time.Time
	// contests are the two configurations' caBundle fights (contest.go),
	// events the token bucket of their Events.
	contests map[admission.Type]*contest
	events   *rate.Limiter
}

// NewRegistrar checks opts: the configurations must build from the hooks
// (an error here is a usage error: no URL or Service, conflicting hooks).
func NewRegistrar(opts RegistrarOptions) (*Registrar, error) {
	if opts.Client == nil || opts.Holder == nil || opts.ServerName == "" {
		return nil, errors.New("registrar: client, holder and server name are required")
	}
	if opts.Registration.Name == "" {
		opts.Registration.Name = DefaultName
	}
	if _, _, err := Build(opts.Hooks, opts.Registration); err != nil {
		return nil, err
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.ProxySettle <= 0 {
		opts.ProxySettle = DefaultProxySettle
	}
	if opts.Bundle == nil {
		opts.Bundle = func() ([]byte, int64) { return nil, 0 }
	}
	hooks := opts.Hooks
	// r.hooks holds them (SetHooks replaces them on a reload): a copy in
	// r.o would keep the start's policies alive after the first reload.
	opts.Hooks = nil
	return &Registrar{o: opts, log: opts.Logger.With("component", "registrar", "configuration", opts.Registration.Name),
		kick: make(chan struct{}, 1), hooks: hooks, called: map[string]time.Time{},
		contests: map[admission.Type]*contest{admission.Mutating: {armed: true}, admission.Validating: {armed: true}},
		events:   rate.NewLimiter(rate.Every(ContestEventInterval), ContestEventBurst)}, nil
}

// Name is the name of both configurations.
func (r *Registrar) Name() string { return r.o.Registration.Name }

// OnChange adds f to the functions called on every event of either
// configuration and on SetHooks; call it before Start.
func (r *Registrar) OnChange(f func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.onChange = append(r.onChange, f)
}

// Start runs the informer on the two configurations (field selector
// metadata.name, so RBAC can grant by name) until ctx ends, and returns once
// it synced.
func (r *Registrar) Start(ctx context.Context) error {
	f := informers.NewSharedInformerFactoryWithOptions(r.o.Client, 10*time.Minute,
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
			lo.FieldSelector = fields.OneTermEqualSelector("metadata.name", r.Name()).String()
		}))
	mi := f.Admissionregistration().V1().MutatingWebhookConfigurations()
	vi := f.Admissionregistration().V1().ValidatingWebhookConfigurations()
	r.mutating, r.validating = mi.Lister(), vi.Lister()
	event := func() {
		r.trackCalled()
		r.changed()
	}
	h := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { event() },
		UpdateFunc: func(any, any) { event() },
		DeleteFunc: func(any) { event() },
	}
	for _, inf := range []cache.SharedIndexInformer{mi.Informer(), vi.Informer()} {
		if _, err := inf.AddEventHandler(h); err != nil {
			return fmt.Errorf("registrar: watch webhook configurations: %w", err)
		}
	}
	f.Start(ctx.Done())
	for typ, ok := range f.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("registrar: %v informer did not sync", typ)
		}
	}
	r.trackCalled()
	r.synced.Store(true)
	return nil
}

// Calls reports whether the API server may call path on kadmit: a webhook
// of the install's configurations, as the informer sees them, calls it, or
// did less than UnregisterGrace ago. The server answers such a path it no
// longer serves with "allowed" (the policy is off) rather than 404, so a
// policy turned off never turns into denials while the API server still
// has the old configuration (server.Options.Unserved). False before Start
// synced.
func (r *Registrar) Calls(path string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	gone, ok := r.called[path]
	return ok && (gone.IsZero() || r.o.Now().Sub(gone) < UnregisterGrace)
}

// trackCalled updates called from the informer's cache: on every event of
// either configuration, and once synced.
func (r *Registrar) trackCalled() {
	now := r.o.Now()
	live := map[string]bool{}
	add := func(cc admissionregistrationv1.WebhookClientConfig) {
		if p, ok := calledPath(cc); ok {
			live[p] = true
		}
	}
	if mwc, err := r.mutating.Get(r.Name()); err == nil {
		for _, w := range mwc.Webhooks {
			add(w.ClientConfig)
		}
	}
	if vwc, err := r.validating.Get(r.Name()); err == nil {
		for _, w := range vwc.Webhooks {
			add(w.ClientConfig)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for p, gone := range r.called {
		switch {
		case live[p]:
		case gone.IsZero():
			r.called[p] = now
		case now.Sub(gone) >= UnregisterGrace:
			delete(r.called, p)
		}
	}
	for p := range live {
		r.called[p] = time.Time{}
	}
}

// calledPath is the HTTP path the API server calls for cc: the URL's path,
// or the Service's path ("/" when unset, as the API server defaults it).
func calledPath(cc admissionregistrationv1.WebhookClientConfig) (string, bool) {
	switch {
	case cc.URL != nil:
		u, err := url.Parse(*cc.URL)
		if err != nil {
			return "", false
		}
		if u.Path == "" {
			return "/", true
		}
		return u.Path, true
	case cc.Service != nil:
		if cc.Service.Path == nil || *cc.Service.Path == "" {
			return "/", true
		}
		return *cc.Service.Path, true
	}
	return "", false
}

func (r *Registrar) changed() {
	r.Kick()
	r.mu.Lock()
	fs := r.onChange
	r.mu.Unlock()
	for _, f := range fs {
		f()
	}
}

// Kick makes Run look again now.
func (r *Registrar) Kick() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// SetHooks replaces the hooks the configurations are built from (a
// configuration reload) and triggers a write.
func (r *Registrar) SetHooks(hooks []admission.Hook) {
	r.mu.Lock()
	r.hooks = hooks
	r.mu.Unlock()
	r.changed()
}

func (r *Registrar) build(bundle []byte) (*admissionregistrationv1.MutatingWebhookConfiguration, *admissionregistrationv1.ValidatingWebhookConfiguration, error) {
	r.mu.Lock()
	hooks := r.hooks
	r.mu.Unlock()
	opts := r.o.Registration
	opts.CABundle = bundle
	return Build(hooks, opts)
}

// Ready returns nil when the served certificate verifies, for ServerName,
// against the caBundle of every webhook of both configurations as the
// informer sees them, or against the source's bundle while none exists;
// else which webhook's bundle refuses it and why. Validity and freshness
// of the certificate itself are the source's check (certs.Fresh).
func (r *Registrar) Ready() error {
	if !r.synced.Load() {
		return errors.New("webhook configuration informers not synced")
	}
	now := r.o.Now()
	bundles, _ := r.cachedBundles()
	if len(bundles) == 0 {
		if b, _ := r.o.Bundle(); len(b) > 0 {
			bundles = map[string][]byte{"the certificate source": b}
		}
	}
	for _, where := range slices.Sorted(maps.Keys(bundles)) {
		if err := certs.VerifyServed(r.o.Holder, where, bundles[where], r.o.ServerName, now); err != nil {
			// Say why the bundle is wrong when it is fought over: the
			// answer the operator needs is the other controller's name.
			if c := r.Contested(); c != nil {
				return fmt.Errorf("%w; %v", err, c)
			}
			return err
		}
	}
	return nil
}

// cachedBundles returns each registered webhook's caBundle from the
// informer cache, keyed by "<Kind>/<webhook>", and the highest
// webhookcerts.GenerationAnnotation of the two configurations; empty before
// Start or when neither configuration exists.
func (r *Registrar) cachedBundles() (map[string][]byte, int64) {
	out, gen := map[string][]byte{}, int64(0)
	if r.mutating == nil {
		return out, 0
	}
	if mwc, err := r.mutating.Get(r.Name()); err == nil {
		gen = max(gen, generationOf(mwc.ObjectMeta))
		for _, w := range mwc.Webhooks {
			out["MutatingWebhookConfiguration/"+w.Name] = w.ClientConfig.CABundle
		}
	}
	if vwc, err := r.validating.Get(r.Name()); err == nil {
		gen = max(gen, generationOf(vwc.ObjectMeta))
		for _, w := range vwc.Webhooks {
			out["ValidatingWebhookConfiguration/"+w.Name] = w.ClientConfig.CABundle
		}
	}
	return out, gen
}

// Bundles implements webhookcerts.Injector: every webhook's caBundle keyed
// "<Kind>/<webhook>" and the highest generation recorded on the two
// configurations, from the informer cache, or with live from the API
// server (GETs: what the API server itself uses, for the steps of a CA
// rotation that must not act on a stale cache). A missing configuration
// contributes nothing.
func (r *Registrar) Bundles(ctx context.Context, live bool) (map[string][]byte, int64, error) {
	if !live {
		out, gen := r.cachedBundles()
		return out, gen, nil
	}
	out, gen := map[string][]byte{}, int64(0)
	ar := r.o.Client.AdmissionregistrationV1()
	mwc, err := ar.MutatingWebhookConfigurations().Get(ctx, r.Name(), metav1.GetOptions{})
	switch {
	case err == nil:
		gen = max(gen, generationOf(mwc.ObjectMeta))
		for _, w := range mwc.Webhooks {
			out["MutatingWebhookConfiguration/"+w.Name] = w.ClientConfig.CABundle
		}
	case !apierrors.IsNotFound(err):
		return nil, 0, fmt.Errorf("get MutatingWebhookConfiguration %s: %w", r.Name(), err)
	}
	vwc, err := ar.ValidatingWebhookConfigurations().Get(ctx, r.Name(), metav1.GetOptions{})
	switch {
	case err == nil:
		gen = max(gen, generationOf(vwc.ObjectMeta))
		for _, w := range vwc.Webhooks {
			out["ValidatingWebhookConfiguration/"+w.Name] = w.ClientConfig.CABundle
		}
	case !apierrors.IsNotFound(err):
		return nil, 0, fmt.Errorf("get ValidatingWebhookConfiguration %s: %w", r.Name(), err)
	}
	return out, gen, nil
}

// generationOf is a configuration's webhookcerts.GenerationAnnotation, 0
// when absent or not a non-negative integer.
func generationOf(m metav1.ObjectMeta) int64 {
	g, err := strconv.ParseInt(m.Annotations[webhookcerts.GenerationAnnotation], 10, 64)
	if err != nil || g < 0 {
		return 0
	}
	return g
}

// Inject implements webhookcerts.Injector: it writes both configurations
// with bundle, the certificate Secret's of generation (see write), and
// remembers it so Run keeps writing it until the source's Bundle catches
// up. A write held back (a first registration waiting for a ready
// endpoint) returns nil: Run retries it within RetryInterval.
func (r *Registrar) Inject(ctx context.Context, bundle []byte, generation int64) error {
	r.mu.Lock()
	if generation > r.offeredGen {
		r.offered, r.offeredGen = bytes.Clone(bundle), generation
	}
	r.mu.Unlock()
	held, err := r.write(ctx, bundle, generation)
	if held {
		r.Kick()
	}
	return err
}

// current is what Run writes: the source's bundle, or the one Inject was
// last given when its generation is higher (the Rotator injects a Secret
// it just wrote before its own informer serves it).
func (r *Registrar) current() ([]byte, int64) {
	b, g := r.o.Bundle()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.offeredGen > g {
		return r.offered, r.offeredGen
	}
	return b, g
}

// write writes both configurations with bundle as every webhook's
// caBundle, unless the cache shows them exactly so already, and deletes
// either one when no hook of its type is left (deleteEmpty), first and
// unconditionally: a webhook left calling a path no longer served would
// deny every request it matches.
//
// A first registration waits until this replica serves, its own
// certificate verifies against bundle, and (with Probe) a ready endpoint of
// the Service serves a certificate that verifies too, and one has at every
// probe for ProxySettle: before that, a fresh install would send the API
// server's calls nowhere (the probe dials the pod, the API server the
// Service's ClusterIP, which kube-proxy routes to the pod only once its
// rules caught up) and block pods. A repair (both configurations exist)
// needs only the first two, and no settle: readiness depends on the very
// caBundle being repaired, so after a blanked one no endpoint is ready and
// waiting for one would make the outage permanent. held reports such a wait; the caller retries within RetryInterval.
//
// A generation above 0 is stamped on both configurations
// (webhookcerts.GenerationAnnotation), and a configuration the cache shows
// with a higher one is not written: a replica whose certificate Secret
// lags (its informer, or a Secret it has not seen) never reverts the
// bundle another replica wrote from a newer Secret, the same rule as the
// Rotator's own injector.
func (r *Registrar) write(ctx context.Context, bundle []byte, generation int64) (held bool, err error) {
	r.writeMu.Lock()
	defer r.writeMu.Unlock()
	mwc, vwc, err := r.build(bundle)
	if err != nil {
		return false, fmt.Errorf("registrar: %w", err)
	}
	// A configuration no hook of its type is left in is deleted, not left
	// registered: its webhooks would call paths this replica no longer
	// serves, and their failurePolicy Fail would deny every matched
	// request. Deleting never sends a call anywhere, so it waits for
	// nothing (not even this replica serving).
	if err := r.deleteEmpty(ctx, mwc == nil, vwc == nil); err != nil {
		return false, err
	}
	if len(bundle) == 0 {
		return true, errors.New("registrar: the certificate source has no caBundle to register")
	}
	if generation > 0 {
		ann := map[string]string{webhookcerts.GenerationAnnotation: strconv.FormatInt(generation, 10)}
		if mwc != nil {
			mwc.Annotations = ann
		}
		if vwc != nil {
			vwc.Annotations = maps.Clone(ann)
		}
	}
	mUp, vUp := r.upToDate(mwc, vwc)
	if mNewer, vNewer := r.newerThan(generation); mNewer || vNewer {
		r.log.Debug("not writing: a configuration carries a bundle from a newer certificate Secret",
			"mutating", mNewer, "validating", vNewer, "generation", generation)
		mUp, vUp = mUp || mNewer, vUp || vNewer
	}
	// Before anything returns: every look records what is wanted and
	// whether the cache shows it, which decides what the next difference is.
	now := r.o.Now()
	var mWait, vWait time.Duration
	if mwc != nil {
		mWait = r.contestWait(admission.Mutating, mwc, mutatingBundles(mwc.Webhooks), mUp, now)
	}
	if vwc != nil {
		vWait = r.contestWait(admission.Validating, vwc, validatingBundles(vwc.Webhooks), vUp, now)
	}
	if mUp && vUp {
		r.hold("")
		return false, nil
	}
	if ok, why := r.servable(ctx, bundle, r.exists(mwc, vwc)); !ok {
		r.hold(why)
		return true, nil
	}
	r.hold("")
	// A configuration whose caBundle is fought over waits for its backoff
	// (held: Run comes back); the other is written meanwhile.
	if mWait > 0 {
		mUp, held = true, true
	}
	if vWait > 0 {
		vUp, held = true, true
	}
	if mUp && vUp {
		return held, nil
	}
	stale := r.staleBundles(bundle)
	// Only what differs: each write counts against the client's rate
	// limit, and a repair should not wait behind a no-op.
	if mUp {
		mwc = nil
	}
	if vUp {
		vwc = nil
	}
	if err := Apply(ctx, r.o.Client, mwc, vwc); err != nil {
		return false, err
	}
	if mwc != nil {
		r.wrote(admission.Mutating)
	}
	if vwc != nil {
		r.wrote(admission.Validating)
	}
	// A later first registration (a configuration deleted) settles anew.
	r.settle(time.Time{})
	r.log.Info("wrote webhook configurations", "staleCABundles", stale, "url", r.o.Registration.URL, "service", r.o.Registration.ServiceName,
		"mutating", mwc != nil, "validating", vwc != nil)
	return held, nil
}

// deleteEmpty deletes the MutatingWebhookConfiguration (mutating) and the
// ValidatingWebhookConfiguration (validating) of the install's name when the
// informer's cache holds them and kadmit's field manager wrote them. The
// delete carries the cached object's UID and resourceVersion as
// preconditions: an object replaced or changed since (by whoever) is never
// deleted on the strength of an old look; the write's informer event brings
// a new look. An object nobody wrote as kadmit is someone else's that
// happens to bear the name, and is left alone (logged).
func (r *Registrar) deleteEmpty(ctx context.Context, mutating, validating bool) error {
	if r.mutating == nil {
		return nil
	}
	if mutating {
		if live, err := r.mutating.Get(r.Name()); err == nil {
			if err := r.deleteOwn(ctx, admission.Mutating, live.ObjectMeta); err != nil {
				return err
			}
		}
	}
	if validating {
		if live, err := r.validating.Get(r.Name()); err == nil {
			if err := r.deleteOwn(ctx, admission.Validating, live.ObjectMeta); err != nil {
				return err
			}
		}
	}
	return nil
}

func (r *Registrar) deleteOwn(ctx context.Context, typ admission.Type, live metav1.ObjectMeta) error {
	deleted, err := DeleteObserved(ctx, r.o.Client, typ, live)
	switch {
	case errors.Is(err, ErrNotWrittenByKadmit):
		r.mu.Lock()
		first := r.foreign != live.UID
		r.foreign = live.UID
		r.mu.Unlock()
		if first {
			r.log.Warn("no hook of this type is enabled, but the configuration of this name was not written by kadmit; not deleting it",
				"type", typ, "uid", live.UID, "fieldManager", FieldManager)
		}
		return nil
	case err != nil:
		return err
	case deleted:
		r.log.Info("deleted webhook configuration: no hook of its type is enabled", "type", typ, "uid", live.UID, "resourceVersion", live.ResourceVersion)
	}
	return nil
}

// ErrNotWrittenByKadmit is DeleteObserved's refusal of an object kadmit's
// field manager never wrote.
var ErrNotWrittenByKadmit = errors.New("not written by kadmit's field manager")

// DeleteObserved deletes the MutatingWebhookConfiguration (typ Mutating) or
// ValidatingWebhookConfiguration (typ Validating) observed, exactly as it
// was observed: the delete carries observed's UID and resourceVersion as
// preconditions, so an object replaced or changed since (by whoever) is
// never deleted on the strength of an old look; the API server answers 409
// Conflict, returned wrapped. An object kadmit's field manager (FieldManager)
// never wrote is someone else's that bears the name: ErrNotWrittenByKadmit,
// nothing deleted. deleted is false, with a nil error, when the object is
// already gone.
func DeleteObserved(ctx context.Context, cs kubernetes.Interface, typ admission.Type, observed metav1.ObjectMeta) (deleted bool, err error) {
	kind, del := "ValidatingWebhookConfiguration", cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete
	if typ == admission.Mutating {
		kind, del = "MutatingWebhookConfiguration", cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete
	}
	if !writtenByKadmit(observed) {
		return false, fmt.Errorf("delete %s %s: %w", kind, observed.Name, ErrNotWrittenByKadmit)
	}
	uid, rv := observed.UID, observed.ResourceVersion
	err = del(ctx, observed.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
	switch {
	case err == nil:
		return true, nil
	case apierrors.IsNotFound(err):
		return false, nil
	case apierrors.IsConflict(err):
		return false, fmt.Errorf("delete %s %s: it changed since it was read (resourceVersion %s): %w", kind, observed.Name, rv, err)
	}
	return false, fmt.Errorf("delete %s %s: %w", kind, observed.Name, err)
}

// writtenByKadmit reports whether kadmit's field manager owns fields of
// the object: kadmit wrote it (server-side apply records the manager).
func writtenByKadmit(m metav1.ObjectMeta) bool {
	for _, f := range m.ManagedFields {
		if f.Manager == FieldManager {
			return true
		}
	}
	return false
}

// hold logs why writes are held back, once per reason ("" clears it).
func (r *Registrar) hold(why string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if why != "" && why != r.heldFor {
		r.log.Info("not registering webhooks yet", "reason", why)
	}
	r.heldFor = why
}

// Run keeps both configurations written with the source's current bundle
// until ctx ends: at once, on every event of either configuration, on
// SetHooks, when the bundle changes (checked every RetryInterval), and every
// RetryInterval while a write is held back or failed. A caBundle fought
// over is repaired once its backoff has passed (contest.go), and a fight
// ends ContestQuiet after its last revert (checked every RetryInterval).
func (r *Registrar) Run(ctx context.Context) {
	tick := time.NewTicker(RetryInterval)
	defer tick.Stop()
	// settled fires when a hold for ProxySettle ends before the next tick,
	// so a settle shorter than RetryInterval is not rounded up to it.
	settled := time.NewTimer(0)
	defer settled.Stop()
	pending, applied, lastErr := true, []byte(nil), ""
	for {
		settled.Stop()
		r.expireContests(r.o.Now())
		bundle, generation := r.current()
		if pending || !bytes.Equal(bundle, applied) {
			held, err := r.write(ctx, bundle, generation)
			switch {
			case err != nil && ctx.Err() == nil:
				if err.Error() != lastErr {
					r.log.Warn("writing webhook configurations failed; retrying", "error", err)
				}
				lastErr, pending = err.Error(), true
			case held:
				pending = true
				wait := r.settleLeft()
				if cw := r.contestLeft(); cw > 0 && (wait == 0 || cw < wait) {
					wait = cw
				}
				if wait > 0 && wait < RetryInterval {
					settled.Reset(wait)
				}
			default:
				pending, applied, lastErr = false, bundle, ""
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-r.kick:
			pending = true
		case <-tick.C:
		case <-settled.C:
		}
	}
}

// upToDate reports, per configuration, whether the cache holds it with
// exactly the webhooks wanted (a nil one is up to date); writing it would
// change nothing.
func (r *Registrar) upToDate(mwc *admissionregistrationv1.MutatingWebhookConfiguration, vwc *admissionregistrationv1.ValidatingWebhookConfiguration) (mutating, validating bool) {
	if r.mutating == nil {
		return mwc == nil, vwc == nil
	}
	mutating, validating = true, true
	if mwc != nil {
		live, err := r.mutating.Get(mwc.Name)
		mutating = err == nil && apiequality.Semantic.DeepEqual(live.Webhooks, mwc.Webhooks)
	}
	if vwc != nil {
		live, err := r.validating.Get(vwc.Name)
		validating = err == nil && apiequality.Semantic.DeepEqual(live.Webhooks, vwc.Webhooks)
	}
	return mutating, validating
}

// newerThan reports, per configuration, whether the cache holds it with a
// generation above generation (never when generation is 0: a source
// without generations).
func (r *Registrar) newerThan(generation int64) (mutating, validating bool) {
	if generation <= 0 || r.mutating == nil {
		return false, false
	}
	if live, err := r.mutating.Get(r.Name()); err == nil {
		mutating = generationOf(live.ObjectMeta) > generation
	}
	if live, err := r.validating.Get(r.Name()); err == nil {
		validating = generationOf(live.ObjectMeta) > generation
	}
	return mutating, validating
}

// exists reports whether every configuration to write is in the cache.
func (r *Registrar) exists(mwc *admissionregistrationv1.MutatingWebhookConfiguration, vwc *admissionregistrationv1.ValidatingWebhookConfiguration) bool {
	if r.mutating == nil {
		return false
	}
	if mwc != nil {
		if _, err := r.mutating.Get(mwc.Name); err != nil {
			return false
		}
	}
	if vwc != nil {
		if _, err := r.validating.Get(vwc.Name); err != nil {
			return false
		}
	}
	return true
}

// servable reports whether writing bundle now is safe (see Inject) and, if
// not, why. Any look that does not find a ready endpoint verifying restarts
// the first registration's settle.
func (r *Registrar) servable(ctx context.Context, bundle []byte, registered bool) (ok bool, why string) {
	verified := false
	defer func() {
		if !verified {
			r.settle(time.Time{})
		}
	}()
	if r.o.Listening != nil {
		if err := r.o.Listening(); err != nil {
			return false, "this replica is not serving: " + err.Error()
		}
	}
	cur := r.o.Holder.Current()
	if cur == nil || cur.Leaf == nil {
		return false, "no serving certificate loaded"
	}
	now := r.o.Now()
	if err := webhookcerts.Verify(cur.Leaf, bundle, r.o.ServerName, now); err != nil {
		return false, "own certificate does not verify against the bundle: " + err.Error()
	}
	if r.o.Probe == nil || registered {
		return true, ""
	}
	leaves, err := r.o.Probe(ctx)
	if err != nil {
		return false, err.Error()
	}
	for _, l := range leaves {
		if webhookcerts.Verify(l, bundle, r.o.ServerName, now) == nil {
			// Seen after the probe returned: the later time, so a slow
			// probe never shortens the settle.
			verified = true
			if r.settle(r.o.Now()) > 0 {
				return false, fmt.Sprintf("a ready endpoint verifies; waiting %v for kube-proxy on every node to route the Service to it", r.o.ProxySettle)
			}
			return true, ""
		}
	}
	return false, "no ready endpoint of the Service serves a certificate the bundle verifies"
}

// settle records a probe's finding for the first registration's
// ProxySettle: seen is when it found a ready endpoint that verifies, the
// zero time when it found none (or did not probe), which restarts the
// settle. It returns how much of ProxySettle is left since the first
// finding of the current run (0 when none is left, or none was found).
func (r *Registrar) settle(seen time.Time) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	if seen.IsZero() {
		r.verifiedSince = time.Time{}
		return 0
	}
	if r.verifiedSince.IsZero() {
		r.verifiedSince = seen
	}
	return max(r.o.ProxySettle-seen.Sub(r.verifiedSince), 0)
}

// settleLeft is how much of ProxySettle a first registration still waits
// for now (0 when it waits for none).
func (r *Registrar) settleLeft() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.verifiedSince.IsZero() {
		return 0
	}
	return max(r.o.ProxySettle-r.o.Now().Sub(r.verifiedSince), 0)
}

// staleBundles names the webhooks whose cached caBundle differs from want,
// or "all" when no configuration exists yet; for the log.
func (r *Registrar) staleBundles(want []byte) []string {
	live, _ := r.cachedBundles()
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
