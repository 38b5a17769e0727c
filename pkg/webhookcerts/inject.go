package webhookcerts

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	admissionv1ac "k8s.io/client-go/applyconfigurations/admissionregistration/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// GenerationAnnotation is stamped on the certificate Secret (an integer,
// incremented by every write) and, by every caBundle apply, on the owned
// configurations and CRDs (the generation of the Secret whose bundle was
// applied). A replica whose Secret generation is lower than an object's does
// not apply to it: a replica whose informer lags never reverts a newer
// bundle.
const GenerationAnnotation = "webhookcerts.kadmit.io/generation"

// crdGVR is the resource of CRDConversion objects.
var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// hookBundle is one webhook's name and its clientConfig.caBundle (a CRD has
// one, named after the CRD).
type hookBundle struct {
	name     string
	caBundle []byte
}

// owned is what the Rotator reads of an owned object.
type owned struct {
	info   WebhookInfo
	exists bool
	// generation is the object's GenerationAnnotation; 0 when absent.
	generation int64
	// hooks are the webhooks whose caBundle is owned; empty for a CRD
	// without spec.conversion.webhook (nothing to inject) or a configuration
	// without webhooks.
	hooks []hookBundle
}

func (o *owned) String() string { return o.info.Type.String() + " " + strconv.Quote(o.info.Name) }

// current reports whether every owned webhook's caBundle is exactly bundle.
func (o *owned) current(bundle []byte) bool {
	for _, h := range o.hooks {
		if !bytes.Equal(h.caBundle, bundle) {
			return false
		}
	}
	return true
}

func parseGeneration(annotations map[string]string) int64 {
	g, err := strconv.ParseInt(annotations[GenerationAnnotation], 10, 64)
	if err != nil || g < 0 {
		return 0
	}
	return g
}

// ownedFrom converts a cached or fetched object (a typed configuration or an
// unstructured CRD) into owned. A nil obj is a missing object.
func ownedFrom(info WebhookInfo, obj any) (*owned, error) {
	o := &owned{info: info}
	switch t := obj.(type) {
	case nil:
		return o, nil
	case *admissionv1.ValidatingWebhookConfiguration:
		o.exists, o.generation = true, parseGeneration(t.Annotations)
		for _, w := range t.Webhooks {
			o.hooks = append(o.hooks, hookBundle{name: w.Name, caBundle: w.ClientConfig.CABundle})
		}
	case *admissionv1.MutatingWebhookConfiguration:
		o.exists, o.generation = true, parseGeneration(t.Annotations)
		for _, w := range t.Webhooks {
			o.hooks = append(o.hooks, hookBundle{name: w.Name, caBundle: w.ClientConfig.CABundle})
		}
	case *unstructured.Unstructured:
		o.exists, o.generation = true, parseGeneration(t.GetAnnotations())
		if _, found, _ := unstructured.NestedMap(t.Object, "spec", "conversion", "webhook"); !found {
			return o, nil
		}
		b64, _, err := unstructured.NestedString(t.Object, "spec", "conversion", "webhook", "clientConfig", "caBundle")
		if err != nil {
			return nil, fmt.Errorf("%s: spec.conversion.webhook.clientConfig.caBundle: %w", o, err)
		}
		ca, err := base64.StdEncoding.DecodeString(b64)
		if err != nil {
			return nil, fmt.Errorf("%s: spec.conversion.webhook.clientConfig.caBundle is not base64: %w", o, err)
		}
		o.hooks = []hookBundle{{name: info.Name, caBundle: ca}}
	default:
		return nil, fmt.Errorf("%s: unexpected object type %T", o, obj)
	}
	return o, nil
}

// ssaInjector is the built-in Injector: it server-side applies the
// caBundle of Options.Webhooks (FieldManager) and watches them, one
// informer per object.
type ssaInjector struct {
	webhooks     []WebhookInfo
	fieldManager string
	log          logr.Logger
	kube         kubernetes.Interface
	dyn          dynamic.Interface
	// synced: the informers have synced; reads use them from then on.
	synced atomic.Bool

	mu        sync.Mutex
	informers map[WebhookInfo]cache.SharedIndexInformer
	missing   map[WebhookInfo]bool
	onChange  []func()
}

var _ Injector = (*ssaInjector)(nil)

func newSSAInjector(o Options, kube kubernetes.Interface, dyn dynamic.Interface) *ssaInjector {
	return &ssaInjector{webhooks: o.Webhooks, fieldManager: o.FieldManager, log: o.Logger, kube: kube, dyn: dyn,
		informers: map[WebhookInfo]cache.SharedIndexInformer{}, missing: map[WebhookInfo]bool{}}
}

// OnChange implements Injector.
func (s *ssaInjector) OnChange(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onChange = append(s.onChange, f)
}

func (s *ssaInjector) changed() {
	s.mu.Lock()
	fs := s.onChange
	s.mu.Unlock()
	for _, f := range fs {
		f()
	}
}

// start runs one informer per owned object until ctx ends, each event
// calling the OnChange functions, and returns their HasSynced; the caller
// waits for them and then calls markSynced.
func (s *ssaInjector) start(ctx context.Context) ([]cache.InformerSynced, error) {
	var syncs []cache.InformerSynced
	for _, info := range s.webhooks {
		inf, err := s.newOwnedInformer(info, 0)
		if err != nil {
			return nil, err
		}
		name := info.Name
		onOwned := func(obj any) {
			if m, ok := obj.(interface{ GetName() string }); !ok || m.GetName() == name {
				s.changed()
			}
		}
		if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    onOwned,
			UpdateFunc: func(_, obj any) { onOwned(obj) },
			DeleteFunc: onOwned,
		}); err != nil {
			return nil, fmt.Errorf("%s %q informer: %w", info.Type, info.Name, err)
		}
		s.mu.Lock()
		s.informers[info] = inf
		s.mu.Unlock()
		go inf.RunWithContext(ctx)
		syncs = append(syncs, inf.HasSynced)
	}
	return syncs, nil
}

func (s *ssaInjector) markSynced() { s.synced.Store(true) }

// getLive reads an owned object from the API server (a GET, never a cache).
func (s *ssaInjector) getLive(ctx context.Context, info WebhookInfo) (*owned, error) {
	var obj any
	var err error
	switch info.Type {
	case Validating:
		obj, err = s.kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, info.Name, metav1.GetOptions{})
	case Mutating:
		obj, err = s.kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, info.Name, metav1.GetOptions{})
	case CRDConversion:
		obj, err = s.dyn.Resource(crdGVR).Get(ctx, info.Name, metav1.GetOptions{})
	}
	if apierrors.IsNotFound(err) {
		return &owned{info: info}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get %s %q: %w", info.Type, info.Name, err)
	}
	return ownedFrom(info, obj)
}

// getCached reads an owned object from its informer; before the informers
// have synced (Bootstrap) it reads it from the API server.
func (s *ssaInjector) getCached(ctx context.Context, info WebhookInfo) (*owned, error) {
	s.mu.Lock()
	inf := s.informers[info]
	s.mu.Unlock()
	if inf == nil || !s.synced.Load() {
		return s.getLive(ctx, info)
	}
	obj, ok, err := inf.GetStore().GetByKey(info.Name)
	if err != nil {
		return nil, fmt.Errorf("read %s %q from cache: %w", info.Type, info.Name, err)
	}
	if !ok {
		obj = nil
	}
	return ownedFrom(info, obj)
}

func (s *ssaInjector) get(ctx context.Context, info WebhookInfo, live bool) (*owned, error) {
	if live {
		return s.getLive(ctx, info)
	}
	return s.getCached(ctx, info)
}

// Bundles implements Injector: keys are `<Kind> "<object>" webhook
// "<webhook>"` (a CRD's webhook is named after the CRD).
func (s *ssaInjector) Bundles(ctx context.Context, live bool) (map[string][]byte, int64, error) {
	out, top := map[string][]byte{}, int64(0)
	for _, info := range s.webhooks {
		o, err := s.get(ctx, info, live)
		if err != nil {
			return nil, 0, err
		}
		top = max(top, o.generation)
		for _, h := range o.hooks {
			out[o.String()+" webhook "+strconv.Quote(h.name)] = h.caBundle
		}
	}
	return out, top, nil
}

// Inject implements Injector: it makes the caBundle of every webhook of
// every owned object that exists equal bundle. It reads the objects from
// the informers (from the API server before they sync), applies only to an
// object whose bundle differs and whose GenerationAnnotation is not above
// generation, and skips a missing object (logged once) or a CRD without a
// conversion webhook. Every object is tried; the errors are joined.
func (s *ssaInjector) Inject(ctx context.Context, bundle []byte, generation int64) error {
	var errs []error
	for _, info := range s.webhooks {
		o, err := s.getCached(ctx, info)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !o.exists {
			s.logMissing(info, true)
			continue
		}
		s.logMissing(info, false)
		if len(o.hooks) == 0 || o.current(bundle) {
			continue
		}
		if o.generation > generation {
			s.log.V(1).Info("not injecting: the object carries a newer bundle than this replica's Secret", "object", o.String(), "objectGeneration", o.generation, "secretGeneration", generation)
			continue
		}
		if err := s.apply(ctx, o, bundle, generation); err != nil {
			errs = append(errs, err)
			continue
		}
		s.log.Info("injected caBundle", "object", o.String(), "webhooks", len(o.hooks), "generation", generation)
	}
	return errors.Join(errs...)
}

// apply writes bundle into every webhook of o by server-side apply
// (FieldManager, Force): the applied object names only the webhooks'
// name and clientConfig.caBundle (a CRD's
// spec.conversion.webhook.clientConfig.caBundle) and the
// GenerationAnnotation, so those are the only fields the field manager
// owns.
func (s *ssaInjector) apply(ctx context.Context, o *owned, bundle []byte, gen int64) error {
	opts := metav1.ApplyOptions{FieldManager: s.fieldManager, Force: true}
	ann := map[string]string{GenerationAnnotation: strconv.FormatInt(gen, 10)}
	var err error
	switch o.info.Type {
	case Validating:
		ac := admissionv1ac.ValidatingWebhookConfiguration(o.info.Name).WithAnnotations(ann)
		for _, h := range o.hooks {
			ac.WithWebhooks(admissionv1ac.ValidatingWebhook().WithName(h.name).
				WithClientConfig(admissionv1ac.WebhookClientConfig().WithCABundle(bundle...)))
		}
		_, err = s.kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Apply(ctx, ac, opts)
	case Mutating:
		ac := admissionv1ac.MutatingWebhookConfiguration(o.info.Name).WithAnnotations(ann)
		for _, h := range o.hooks {
			ac.WithWebhooks(admissionv1ac.MutatingWebhook().WithName(h.name).
				WithClientConfig(admissionv1ac.WebhookClientConfig().WithCABundle(bundle...)))
		}
		_, err = s.kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Apply(ctx, ac, opts)
	case CRDConversion:
		_, err = s.dyn.Resource(crdGVR).Apply(ctx, o.info.Name, crdApply(o.info.Name, bundle, ann), opts)
	}
	if err != nil {
		return fmt.Errorf("apply caBundle to %s: %w", o, err)
	}
	return nil
}

// crdApply is the apply configuration of a CRD's conversion caBundle.
func crdApply(name string, bundle []byte, ann map[string]string) *unstructured.Unstructured {
	annotations := map[string]any{}
	for k, v := range ann {
		annotations[k] = v
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1",
		"kind":       "CustomResourceDefinition",
		"metadata":   map[string]any{"name": name, "annotations": annotations},
		"spec": map[string]any{"conversion": map[string]any{"webhook": map[string]any{
			"clientConfig": map[string]any{"caBundle": base64.StdEncoding.EncodeToString(bundle)},
		}}},
	}}
}

// logMissing logs once that an owned object does not exist, and forgets
// that once it does.
func (s *ssaInjector) logMissing(info WebhookInfo, missing bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !missing {
		delete(s.missing, info)
		return
	}
	if s.missing[info] {
		return
	}
	s.missing[info] = true
	s.log.Info("owned object does not exist; skipping it until it does", "kind", info.Type.String(), "name", info.Name)
}

// newOwnedInformer builds one informer for one owned object (field selector
// metadata.name). Configurations are stored without managedFields and
// annotations other than GenerationAnnotation; CRDs keep only metadata
// (likewise trimmed) and spec.conversion.
func (s *ssaInjector) newOwnedInformer(info WebhookInfo, resync time.Duration) (cache.SharedIndexInformer, error) {
	byName := func(lo *metav1.ListOptions) {
		lo.FieldSelector = fields.OneTermEqualSelector("metadata.name", info.Name).String()
	}
	var inf cache.SharedIndexInformer
	switch info.Type {
	case Validating:
		f := informers.NewSharedInformerFactoryWithOptions(s.kube, resync, informers.WithTweakListOptions(byName))
		inf = f.Admissionregistration().V1().ValidatingWebhookConfigurations().Informer()
	case Mutating:
		f := informers.NewSharedInformerFactoryWithOptions(s.kube, resync, informers.WithTweakListOptions(byName))
		inf = f.Admissionregistration().V1().MutatingWebhookConfigurations().Informer()
	case CRDConversion:
		inf = dynamicinformer.NewFilteredDynamicInformer(s.dyn, crdGVR, "", resync, cache.Indexers{}, byName).Informer()
	default:
		return nil, fmt.Errorf("unknown webhook type %d", int(info.Type))
	}
	if err := inf.SetTransform(trimOwned); err != nil {
		return nil, fmt.Errorf("%s %q informer: %w", info.Type, info.Name, err)
	}
	return inf, nil
}

// trimOwned is the informers' transform: see newOwnedInformer.
func trimOwned(obj any) (any, error) {
	switch t := obj.(type) {
	case *admissionv1.ValidatingWebhookConfiguration:
		trimMeta(&t.ObjectMeta)
	case *admissionv1.MutatingWebhookConfiguration:
		trimMeta(&t.ObjectMeta)
	case *unstructured.Unstructured:
		out := &unstructured.Unstructured{Object: map[string]any{}}
		out.SetAPIVersion(t.GetAPIVersion())
		out.SetKind(t.GetKind())
		out.SetName(t.GetName())
		out.SetUID(t.GetUID())
		out.SetResourceVersion(t.GetResourceVersion())
		out.SetGeneration(t.GetGeneration())
		out.SetDeletionTimestamp(t.GetDeletionTimestamp())
		if g, ok := t.GetAnnotations()[GenerationAnnotation]; ok {
			out.SetAnnotations(map[string]string{GenerationAnnotation: g})
		}
		if conv, found, _ := unstructured.NestedFieldNoCopy(t.Object, "spec", "conversion"); found {
			out.Object["spec"] = map[string]any{"conversion": conv}
		}
		return out, nil
	}
	return obj, nil
}

func trimMeta(m *metav1.ObjectMeta) {
	m.ManagedFields = nil
	if g, ok := m.Annotations[GenerationAnnotation]; ok {
		m.Annotations = map[string]string{GenerationAnnotation: g}
	} else {
		m.Annotations = nil
	}
}
