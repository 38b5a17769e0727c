package clustercache

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/cache"
)

// Bounds of a static cluster state (NewStatic): the number of objects and
// their total JSON size. A state beyond them is refused, never truncated.
const (
	MaxStaticObjects = 100_000
	MaxStaticBytes   = 256 << 20
)

// ErrStatic is wrapped by every NewStatic error about the given objects.
var ErrStatic = errors.New("invalid cluster state")

// StaticObject is one object of a static cluster state, with where it came
// from for error messages.
type StaticObject struct {
	Source string // file name
	Index  int    // 0-based document index in Source
	Raw    []byte // the object's JSON
}

func (o StaticObject) String() string { return fmt.Sprintf("%s (document %d)", o.Source, o.Index) }

// NewStatic builds Caches for resources from a fixed set of objects, for
// `kadmit review --state`: each resource gets the same kind of
// cache.SharedIndexInformer Start builds (typed objects for built-in
// resources, *unstructured.Unstructured for custom ones, the namespace
// index, the same transform keeping only the declared fields), over a ListWatch that lists the objects
// of that resource and whose watch never delivers an event. Policies read
// them exactly as they read a live cluster's, event handlers and indexers
// included. Every custom resource counts as served (an empty state means
// no such objects, not an absent CRD). A Namespace gets the label
// kubernetes.io/metadata.name (its name), as the API server gives every
// namespace.
//
// Objects of resources not in resources are ignored. An object without
// apiVersion or kind, one that does not decode as its built-in type, two
// objects with the same namespace and name, more than MaxStaticObjects
// objects or more than MaxStaticBytes bytes is an error wrapping ErrStatic
// and naming the object's source and document. The informers run until ctx
// ends; NewStatic returns once they have synced.
func NewStatic(ctx context.Context, reads []Read, objs []StaticObject) (*Caches, error) {
	if len(objs) > MaxStaticObjects {
		return nil, fmt.Errorf("%w: %d objects, more than %d", ErrStatic, len(objs), MaxStaticObjects)
	}
	total := 0
	for _, o := range objs {
		if total += len(o.Raw); total > MaxStaticBytes {
			return nil, fmt.Errorf("%w: %s: more than %d bytes of objects", ErrStatic, o, MaxStaticBytes)
		}
	}
	// Objects are sorted by resource; one resource may be cached at two
	// scopes (cluster-wide and one namespace), each informer gets its share.
	byRes := group(reads)
	wanted := map[schema.GroupVersionResource]Resource{}
	for _, rd := range reads {
		wanted[rd.GroupVersionResource] = rd.Resource
	}
	byGVR := map[schema.GroupVersionResource][]runtime.Object{}
	kinds := map[schema.GroupVersionResource]schema.GroupVersionKind{}
	keys := map[string]StaticObject{}
	for _, o := range objs {
		var u unstructured.Unstructured
		if err := u.UnmarshalJSON(o.Raw); err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrStatic, o, err)
		}
		gvk := u.GroupVersionKind()
		if gvk.Kind == "" || gvk.Version == "" {
			return nil, fmt.Errorf("%w: %s: apiVersion and kind are required", ErrStatic, o)
		}
		gvr, _ := meta.UnsafeGuessKindToResource(gvk)
		r, ok := wanted[gvr]
		if !ok {
			continue
		}
		key := gvr.String() + " " + u.GetNamespace() + "/" + u.GetName()
		if first, dup := keys[key]; dup {
			return nil, fmt.Errorf("%w: %s: %s %q in namespace %q is also in %s", ErrStatic, o, gvk.Kind, u.GetName(), u.GetNamespace(), first)
		}
		keys[key] = o
		kinds[gvr] = gvk
		var obj runtime.Object = &u
		if !r.Custom {
			typed, err := scheme.Scheme.New(gvk)
			if err != nil {
				return nil, fmt.Errorf("%w: %s: %s is not a built-in kind: %w", ErrStatic, o, gvk, err)
			}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, typed); err != nil {
				return nil, fmt.Errorf("%w: %s: %s %q: %w", ErrStatic, o, gvk.Kind, u.GetName(), err)
			}
			obj = typed
		}
		if ns, ok := obj.(*corev1.Namespace); ok {
			// The API server sets this label on every namespace, to its
			// name, on create and update (k8s.io/kubernetes v1.37.1
			// pkg/registry/core/namespace/strategy.go:108-131 Canonicalize):
			// a namespace of a state has it as it would in a cluster.
			if ns.Labels == nil {
				ns.Labels = map[string]string{}
			}
			ns.Labels[corev1.LabelMetadataName] = ns.Name
		}
		byGVR[gvr] = append(byGVR[gvr], obj)
	}

	c := &Caches{informers: map[Resource]cache.SharedIndexInformer{}}
	var started []cache.SharedIndexInformer
	for _, rd := range reads {
		r := rd.Resource
		if _, done := c.informers[r]; done {
			continue
		}
		example, list, err := exampleObjects(r, kinds[r.GroupVersionResource])
		if err != nil {
			return nil, err
		}
		items := byGVR[r.GroupVersionResource]
		if r.Namespace != "" {
			var scoped []runtime.Object
			for _, it := range items {
				if m, err := meta.Accessor(it); err == nil && m.GetNamespace() == r.Namespace {
					scoped = append(scoped, it)
				}
			}
			items = scoped
		}
		lw := &staticListWatch{ListWatch: &cache.ListWatch{
			ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) {
				out := list.DeepCopyObject()
				copies := make([]runtime.Object, len(items))
				for i, it := range items {
					copies[i] = it.DeepCopyObject()
				}
				if err := meta.SetList(out, copies); err != nil {
					return nil, err
				}
				if lm, err := meta.ListAccessor(out); err == nil {
					lm.SetResourceVersion("1")
				}
				return out, nil
			},
			// The state never changes: the watch delivers nothing until the
			// reflector stops it.
			WatchFuncWithContext: func(context.Context, metav1.ListOptions) (watch.Interface, error) {
				return watch.NewFake(), nil
			},
		}}
		inf := cache.NewSharedIndexInformer(lw, example, 0, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
		if err := inf.SetTransform(pruner(byRes[r]).Transform()); err != nil {
			return nil, fmt.Errorf("cluster state: %s transform: %w", r.String(), err)
		}
		c.informers[r] = inf
		started = append(started, inf)
	}
	for _, inf := range started {
		go inf.RunWithContext(ctx)
	}
	syncs := make([]cache.InformerSynced, len(started))
	for i, inf := range started {
		syncs[i] = inf.HasSynced
	}
	if !cache.WaitForCacheSync(ctx.Done(), syncs...) {
		return nil, fmt.Errorf("cluster state: informers did not sync: %w", context.Cause(ctx))
	}
	return c, nil
}

// staticListWatch tells the reflector not to use WatchList streaming: its
// watch sends no initial events, so the reflector must list.
type staticListWatch struct{ *cache.ListWatch }

// IsWatchListSemanticsUnSupported implements client-go's
// watchlist.unSupportedWatchListSemantics.
func (*staticListWatch) IsWatchListSemanticsUnSupported() bool { return true }

// exampleObjects returns the informer's object type and an empty list of r:
// unstructured for a custom resource; for a built-in one the typed object
// client-go's scheme registers for gvk (the kind of r's objects, or, when
// the state holds none, the scheme's kind whose resource is r).
func exampleObjects(r Resource, gvk schema.GroupVersionKind) (runtime.Object, runtime.Object, error) {
	if r.Custom {
		return &unstructured.Unstructured{}, &unstructured.UnstructuredList{}, nil
	}
	if gvk.Kind == "" {
		gvk = kindOf(r.GroupVersionResource)
	}
	if gvk.Kind == "" {
		return nil, nil, fmt.Errorf("cluster state: %s: no built-in kind serves this resource", r.String())
	}
	obj, err := scheme.Scheme.New(gvk)
	if err != nil {
		return nil, nil, fmt.Errorf("cluster state: %s: %w", r.String(), err)
	}
	list, err := scheme.Scheme.New(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
	if err != nil {
		return nil, nil, fmt.Errorf("cluster state: %s: %w", r.String(), err)
	}
	return obj, list, nil
}

// kindOf finds the built-in kind whose resource is gvr.
func kindOf(gvr schema.GroupVersionResource) schema.GroupVersionKind {
	var found []schema.GroupVersionKind
	for gvk := range scheme.Scheme.AllKnownTypes() {
		if gvk.GroupVersion() != gvr.GroupVersion() || strings.HasSuffix(gvk.Kind, "List") {
			continue
		}
		if plural, _ := meta.UnsafeGuessKindToResource(gvk); plural == gvr {
			found = append(found, gvk)
		}
	}
	slices.SortFunc(found, func(a, b schema.GroupVersionKind) int { return strings.Compare(a.Kind, b.Kind) })
	if len(found) == 0 {
		return schema.GroupVersionKind{}
	}
	return found[0]
}
