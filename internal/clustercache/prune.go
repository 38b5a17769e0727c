package clustercache

import (
	"fmt"
	"reflect"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"
)

// Path is a field path in an object's JSON form, one segment per map key:
// Path{"metadata", "labels", "kueue.x-k8s.io/queue-name"}. A segment that
// meets a list applies the rest of the path to each element of the list,
// which keeps its length (so container i stays container i):
// Path{"spec", "containers", "resources"} keeps every container's
// resources and nothing else of the containers.
type Path []string

// P is Path(segments), for short declarations.
func P(segments ...string) Path { return Path(segments) }

func (p Path) String() string { return strings.Join(p, ".") }

// Read is a resource a policy reads and the fields of its objects it reads.
// The cache keeps, of each object, the union of the fields every enabled
// policy declares for that resource (see Pruner), so its memory grows with
// the number of objects, not with their size.
type Read struct {
	Resource
	// Fields are the paths the policy reads. Nil keeps the whole object
	// (less managedFields): for readers that hand the object on as a
	// whole, such as declared policies' namespaceObject.
	Fields []Path
}

// Keep is a Read of r's fields paths; with none, of the fields every
// object keeps (its name: a policy that only asks whether an object exists).
func (r Resource) Keep(paths ...Path) Read {
	return Read{Resource: r, Fields: append([]Path{}, paths...)}
}

// Whole is a Read of r's whole objects (less managedFields).
func (r Resource) Whole() Read { return Read{Resource: r} }

// alwaysKept are the fields every pruned object keeps: its identity, what
// the informer's store and the reflector read (namespace/name keys,
// resourceVersion), and apiVersion/kind of unstructured objects.
var alwaysKept = []Path{
	{"apiVersion"}, {"kind"},
	{"metadata", "name"}, {"metadata", "namespace"}, {"metadata", "uid"}, {"metadata", "resourceVersion"},
}

// Pruner keeps the declared fields of objects and drops the rest. The zero
// value (and a nil *Pruner) keeps whole objects less managedFields.
type Pruner struct {
	root  *node // nil: whole objects
	paths []Path
}

// node is one segment of the union of the declared paths; a leaf keeps the
// whole value under it.
type node struct {
	children map[string]*node
}

// NewPruner returns the pruner keeping the union of paths and the fields
// every object keeps (name, namespace, uid, resourceVersion, apiVersion,
// kind). When whole is true it keeps whole objects less managedFields.
func NewPruner(whole bool, paths ...Path) *Pruner {
	if whole {
		return &Pruner{}
	}
	p := &Pruner{root: &node{children: map[string]*node{}}}
	for _, path := range slices.Concat(alwaysKept, paths) {
		if len(path) == 0 {
			// The empty path is the whole object.
			return &Pruner{}
		}
		n := p.root
		for i, seg := range path {
			if n.children == nil && n != p.root {
				// A shorter path already keeps this whole subtree.
				break
			}
			c, ok := n.children[seg]
			if !ok {
				c = &node{}
				if i < len(path)-1 {
					c.children = map[string]*node{}
				}
				n.children[seg] = c
			} else if i == len(path)-1 {
				// This path ends here: keep the whole subtree.
				c.children = nil
			}
			n = c
		}
	}
	p.paths = append([]Path{}, paths...)
	return p
}

// pruner merges the reads of one resource: whole objects when any of them
// reads whole objects, else the union of their fields.
func pruner(reads []Read) *Pruner {
	var paths []Path
	for _, r := range reads {
		if r.Fields == nil {
			return NewPruner(true)
		}
		paths = append(paths, r.Fields...)
	}
	return NewPruner(false, paths...)
}

// Whole reports whether p keeps whole objects (less managedFields).
func (p *Pruner) Whole() bool { return p == nil || p.root == nil }

// String lists the kept paths, sorted, or "*" for whole objects: a stable
// identity for Key.
func (p *Pruner) String() string {
	if p.Whole() {
		return "*"
	}
	s := make([]string, len(p.paths))
	for i, path := range p.paths {
		s[i] = path.String()
	}
	slices.Sort(s)
	return strings.Join(slices.Compact(s), ",")
}

// Transform is p as an informer transform (cache.TransformFunc): it returns
// a new object of obj's type holding only the kept fields, or obj itself
// with managedFields dropped when p keeps whole objects. Typed objects
// (*corev1.Pod) go through their unstructured form and back, so one set of
// paths serves typed and custom resources alike; when the paths keep only
// metadata, only the ObjectMeta does (pruneMetaOnly). The work and the
// transient memory are proportional to obj's size; the result's size is
// bounded by what the paths select. Tombstones and objects that are not
// Kubernetes objects pass unchanged. It is idempotent, as client-go asks of
// a transform.
func (p *Pruner) Transform() cache.TransformFunc {
	return func(obj any) (any, error) {
		if _, tomb := obj.(cache.DeletedFinalStateUnknown); tomb {
			return obj, nil
		}
		if p.Whole() {
			if m, err := meta.Accessor(obj); err == nil {
				m.SetManagedFields(nil)
			}
			return obj, nil
		}
		return p.Prune(obj)
	}
}

// Prune returns a copy of obj with only the kept fields. obj is an
// *unstructured.Unstructured or a typed runtime.Object; anything else is
// returned unchanged.
//
// Errors: a typed object that does not convert to or from its
// unstructured form (not expected of API types), naming its type.
func (p *Pruner) Prune(obj any) (any, error) {
	if p.Whole() {
		return obj, nil
	}
	switch o := obj.(type) {
	case *unstructured.Unstructured:
		return &unstructured.Unstructured{Object: pruneMap(o.Object, p.root)}, nil
	case runtime.Object:
		if out, ok, err := p.pruneMetaOnly(o); ok {
			return out, err
		}
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(o)
		if err != nil {
			return nil, fmt.Errorf("prune %T: %w", o, err)
		}
		out := reflect.New(reflect.TypeOf(o).Elem()).Interface().(runtime.Object)
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(pruneMap(m, p.root), out); err != nil {
			return nil, fmt.Errorf("prune %T: %w", o, err)
		}
		return out, nil
	}
	return obj, nil
}

// pruneMetaOnly prunes a typed object when p keeps nothing beyond
// apiVersion, kind and metadata (labels and owner references of pods, say):
// only its ObjectMeta goes through the unstructured form, not its spec and
// status, which are most of its bytes. The result is the one Prune's full
// conversion gives. ok is false when p keeps more, or o has no ObjectMeta
// and TypeMeta fields.
func (p *Pruner) pruneMetaOnly(o runtime.Object) (out runtime.Object, ok bool, err error) {
	for k := range p.root.children {
		if k != "apiVersion" && k != "kind" && k != "metadata" {
			return nil, false, nil
		}
	}
	src := reflect.ValueOf(o).Elem()
	if src.Kind() != reflect.Struct {
		return nil, false, nil
	}
	omv, tm := src.FieldByName("ObjectMeta"), src.FieldByName("TypeMeta")
	if !omv.IsValid() || omv.Type() != reflect.TypeFor[metav1.ObjectMeta]() ||
		!tm.IsValid() || tm.Type() != reflect.TypeFor[metav1.TypeMeta]() {
		return nil, false, nil
	}
	om := omv.Addr().Interface().(*metav1.ObjectMeta)
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(om)
	if err != nil {
		return nil, true, fmt.Errorf("prune %T: %w", o, err)
	}
	var kept metav1.ObjectMeta
	if pm, keep := pruneValue(m, p.root.children["metadata"]); keep {
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(pm.(map[string]any), &kept); err != nil {
			return nil, true, fmt.Errorf("prune %T: %w", o, err)
		}
	}
	out = reflect.New(src.Type()).Interface().(runtime.Object)
	dst := reflect.ValueOf(out).Elem()
	dst.FieldByName("TypeMeta").Set(tm)
	dst.FieldByName("ObjectMeta").Set(reflect.ValueOf(kept))
	return out, true, nil
}

// pruneMap returns the kept fields of m under n, sharing kept leaves with
// m (they are not modified).
func pruneMap(m map[string]any, n *node) map[string]any {
	out := make(map[string]any, min(len(m), len(n.children)))
	for k, c := range n.children {
		v, ok := m[k]
		if !ok {
			continue
		}
		if pv, keep := pruneValue(v, c); keep {
			out[k] = pv
		}
	}
	return out
}

// pruneValue prunes v under n. A leaf keeps v whole; a map keeps its
// declared keys; a list applies n to each element and keeps its length; a
// scalar where the paths go deeper is not what any policy reads and is
// dropped (keep false).
func pruneValue(v any, n *node) (any, bool) {
	if n.children == nil {
		return v, true
	}
	switch t := v.(type) {
	case map[string]any:
		return pruneMap(t, n), true
	case []any:
		out := make([]any, len(t))
		for i, e := range t {
			// An element that is not what the paths expect is dropped
			// in place (nil), keeping the indices of the others.
			if pe, keep := pruneValue(e, n); keep {
				out[i] = pe
			}
		}
		return out, true
	}
	return nil, false
}
