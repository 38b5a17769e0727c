package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listersadmissionv1 "k8s.io/client-go/listers/admissionregistration/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/kadmit/kadmit/internal/certs"
)

// Trust follows kadmit's webhook configurations through an informer and
// answers readiness the way the API server would judge it: does the
// certificate being served verify, for the name the API server dials,
// against the caBundle of every kadmit webhook? It serves every certificate
// source: the self-managed Secret and files from cert-manager alike.
type Trust struct {
	// ConfigName names both webhook configurations; default "kadmit".
	ConfigName string
	// ServerName is what the API server verifies: <svc>.<ns>.svc or the
	// --webhook-url host.
	ServerName string
	Holder     *certs.Holder
	// Fallback, when set, returns the bundle to verify against while no
	// configuration exists yet (the Secret's ca.crt, a --ca-bundle-file);
	// an empty bundle means "nothing to check yet".
	Fallback func() (where string, bundle []byte)
	// Now is the clock; default time.Now.
	Now func() time.Time

	mutating   listersadmissionv1.MutatingWebhookConfigurationLister
	validating listersadmissionv1.ValidatingWebhookConfigurationLister
	synced     atomic.Bool
}

// Start runs the configuration informers until ctx ends and returns once
// they synced. onChange, when set, is called on every configuration event.
func (t *Trust) Start(ctx context.Context, client kubernetes.Interface, onChange func()) error {
	if t.ConfigName == "" {
		t.ConfigName = "kadmit"
	}
	f := informers.NewSharedInformerFactoryWithOptions(client, 10*time.Minute,
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
			lo.FieldSelector = fields.OneTermEqualSelector("metadata.name", t.ConfigName).String()
		}))
	mi := f.Admissionregistration().V1().MutatingWebhookConfigurations()
	vi := f.Admissionregistration().V1().ValidatingWebhookConfigurations()
	t.mutating, t.validating = mi.Lister(), vi.Lister()
	if onChange != nil {
		h := cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { onChange() },
			UpdateFunc: func(any, any) { onChange() },
			DeleteFunc: func(any) { onChange() },
		}
		for _, inf := range []cache.SharedIndexInformer{mi.Informer(), vi.Informer()} {
			if _, err := inf.AddEventHandler(h); err != nil {
				return fmt.Errorf("watch webhook configurations: %w", err)
			}
		}
	} else {
		mi.Informer()
		vi.Informer()
	}
	f.Start(ctx.Done())
	for typ, ok := range f.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("%v informer did not sync", typ)
		}
	}
	t.synced.Store(true)
	return nil
}

// Ready returns nil when the served certificate is valid now, not within the
// last tenth of its lifetime, and verifies for ServerName against the
// caBundle of every kadmit webhook (or the Fallback before any exists);
// otherwise an error saying which check failed.
func (t *Trust) Ready() error {
	if !t.synced.Load() {
		return errors.New("webhook configuration informers not synced")
	}
	cur := t.Holder.Current()
	if cur == nil || cur.Leaf == nil {
		return certs.ErrNoCertificate
	}
	now := time.Now()
	if t.Now != nil {
		now = t.Now()
	}
	leaf := cur.Leaf
	if err := t.Holder.Check(now); err != nil {
		return err
	}
	if margin := leaf.NotAfter.Sub(leaf.NotBefore) / 10; now.After(leaf.NotAfter.Add(-margin)) {
		return fmt.Errorf("serving certificate expires at %s, within the last tenth of its lifetime", leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	bundles := t.Bundles()
	if len(bundles) == 0 && t.Fallback != nil {
		if where, b := t.Fallback(); len(b) > 0 {
			bundles = map[string][]byte{where: b}
		}
	}
	for where, b := range bundles {
		if err := certs.Verify(leaf, b, t.ServerName, now); err != nil {
			return fmt.Errorf("served certificate does not verify against the caBundle of %s for %s: %w", where, t.ServerName, err)
		}
	}
	return nil
}

// Bundles returns each kadmit webhook's caBundle, keyed by
// "<Kind>/<webhook>", from the informer caches.
func (t *Trust) Bundles() map[string][]byte {
	out := map[string][]byte{}
	if t.mutating == nil {
		return out
	}
	if mwc, err := t.mutating.Get(t.ConfigName); err == nil {
		for _, w := range mwc.Webhooks {
			out["MutatingWebhookConfiguration/"+w.Name] = w.ClientConfig.CABundle
		}
	}
	if vwc, err := t.validating.Get(t.ConfigName); err == nil {
		for _, w := range vwc.Webhooks {
			out["ValidatingWebhookConfiguration/"+w.Name] = w.ClientConfig.CABundle
		}
	}
	return out
}

// exists reports whether the named configurations are in the cache.
func (t *Trust) exists(mutating, validating string) bool {
	if mutating != "" {
		if _, err := t.mutating.Get(mutating); err != nil {
			return false
		}
	}
	if validating != "" {
		if _, err := t.validating.Get(validating); err != nil {
			return false
		}
	}
	return true
}
