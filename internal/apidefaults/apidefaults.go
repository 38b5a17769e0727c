// Package apidefaults applies to an object what the API server applies
// between decoding a request and calling the admission webhooks and
// policies: the API's decoding defaults (a container's limits copied to its
// requests, imagePullPolicy, restartPolicy, a Deployment's strategy, ...)
// and the mutating admission plugins that are on by default and run before
// MutatingAdmissionPolicy / MutatingAdmissionWebhook and need no cluster
// state (ServiceAccount, TaintNodesByCondition, Priority,
// DefaultTolerationSeconds, StorageObjectInUseProtection); Mutated and Defaulter default what a
// webhook or policy produced, as the API server does. Offline
// evaluation (`kadmit review --defaults`, `kadmit test --defaults`, a suite's
// `defaults: true`) runs it so that policies see the object as the API
// server would hand it to them. What it does not do is listed in
// docs/policies-cel.md, "What offline evaluation does and does not do
// before the policies".
//
// The decoding defaults are the Kubernetes code itself, k8s.io/kubernetes
// v1.37.1 pkg/apis/{core,apps,batch}/v1 RegisterDefaults (every kind of
// those group versions, with the feature gates at their v1.37 defaults),
// followed by the same packages' conversion to the internal version and
// back, as the API server converts before admission.
// The admission plugins need an API server around them (informers, a
// client, internal types), so plugins.go re-creates the part of each that
// needs no cluster state, citing the upstream lines.
package apidefaults

import (
	"errors"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8sapps "k8s.io/kubernetes/pkg/apis/apps"
	k8sappsv1 "k8s.io/kubernetes/pkg/apis/apps/v1"
	k8sbatch "k8s.io/kubernetes/pkg/apis/batch"
	k8sbatchv1 "k8s.io/kubernetes/pkg/apis/batch/v1"
	k8score "k8s.io/kubernetes/pkg/apis/core"
	k8scorev1 "k8s.io/kubernetes/pkg/apis/core/v1"
	"sigs.k8s.io/json"

	encjson "encoding/json"
)

// Operations, as in admission requests.
const (
	Create  = "CREATE"
	Update  = "UPDATE"
	Delete  = "DELETE"
	Connect = "CONNECT"
)

// Plugin names, as kube-apiserver's --enable-admission-plugins spells them.
const (
	ServiceAccount               = "ServiceAccount"
	TaintNodesByCondition        = "TaintNodesByCondition"
	Priority                     = "Priority"
	DefaultTolerationSeconds     = "DefaultTolerationSeconds"
	StorageObjectInUseProtection = "StorageObjectInUseProtection"
)

// Plugins are the admission plugins Apply runs, in the API server's order
// (k8s.io/kubernetes v1.37.1 pkg/kubeapiserver/options/plugins.go:79,81,86,
// 87,92 AllOrderedPlugins; all are on by default, plugins.go:165-191).
var Plugins = []string{ServiceAccount, TaintNodesByCondition, Priority, DefaultTolerationSeconds, StorageObjectInUseProtection}

// ErrInput is wrapped by errors about the object: JSON that does not decode
// into its kind's type.
var ErrInput = errors.New("invalid object")

// scheme knows the typed objects of core/v1, apps/v1 and batch/v1, their
// internal forms, and the upstream defaulting and conversion functions
// between them (each v1 package's AddToScheme registers its types,
// defaults and conversions).
var scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		k8scorev1.AddToScheme, k8sappsv1.AddToScheme, k8sbatchv1.AddToScheme,
		k8score.AddToScheme, k8sapps.AddToScheme, k8sbatch.AddToScheme,
	} {
		if err := add(s); err != nil {
			panic(err) // only a programming error gets here
		}
	}
	return s
}()

// Request is one admission request's objects, before admission.
type Request struct {
	Kind schema.GroupVersionKind
	// Resource and SubResource decide whether the plugins run: they act on
	// pods, nodes, persistentvolumes and persistentvolumeclaims (core
	// group) without a subresource.
	Resource    schema.GroupVersionResource
	SubResource string
	// Operation is CREATE, UPDATE, DELETE or CONNECT.
	Operation string
	// Object and OldObject are JSON; either may be nil (DELETE has no
	// object, CREATE no old object).
	Object, OldObject []byte
	// Plugins, when not nil, replaces the package's Plugins: the API
	// server under test may run fewer (test/e2e's runs without
	// ServiceAccount, which needs a service account controller).
	Plugins []string
}

// Apply returns the request's object and old object as the API server
// hands them to admission webhooks and policies:
//   - the object is decoded with its kind's defaults, then the mutating
//     plugins run on it for the request's operation;
//   - the old object is what the server has stored: decoded with defaults
//     and, for a pod, as the plugins left it when it was created.
//
// An object of a group version other than core/v1, apps/v1 and batch/v1 is
// returned unchanged. The typed round trip drops fields the v1.37 schema
// does not know and writes quantities canonically ("1000m" is "1"), as the
// API server does. Errors wrap ErrInput.
func Apply(r Request) (object, oldObject []byte, err error) {
	plugins := Plugins
	if r.Plugins != nil {
		plugins = r.Plugins
	}
	var oldTyped runtime.Object
	if r.OldObject != nil {
		oldTyped, err = decode(r.Kind, r.OldObject)
		if err != nil {
			return nil, nil, fmt.Errorf("oldObject: %w", err)
		}
		if oldTyped != nil {
			// The stored object was created through the resource itself,
			// whatever subresource this request is for.
			created := r
			created.SubResource = ""
			admit(plugins, Create, created, oldTyped, nil)
			if oldObject, err = encjson.Marshal(oldTyped); err != nil {
				return nil, nil, fmt.Errorf("oldObject: %w", err)
			}
		} else {
			oldObject = r.OldObject
		}
	}
	if r.Object != nil {
		typed, err := decode(r.Kind, r.Object)
		if err != nil {
			return nil, nil, fmt.Errorf("object: %w", err)
		}
		if typed == nil {
			return r.Object, oldObject, nil
		}
		admit(plugins, r.Operation, r, typed, oldTyped)
		if object, err = encjson.Marshal(typed); err != nil {
			return nil, nil, fmt.Errorf("object: %w", err)
		}
	}
	return object, oldObject, nil
}

// decode returns obj as its typed kind with the decoding defaults applied,
// or nil when the scheme does not know the kind. Field names match case
// sensitively and unknown fields are dropped, as the API server's decoder
// does (k8s.io/apimachinery v0.37.1 pkg/runtime/serializer/json uses
// sigs.k8s.io/json's case-sensitive decoding).
func decode(gvk schema.GroupVersionKind, obj []byte) (runtime.Object, error) {
	if !scheme.Recognizes(gvk) {
		return nil, nil
	}
	typed, err := scheme.New(gvk)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrInput, gvk, err)
	}
	if err := json.UnmarshalCaseSensitivePreserveInts(obj, typed); err != nil {
		return nil, fmt.Errorf("%w: as %s: %w", ErrInput, gvk.Kind, err)
	}
	scheme.Default(typed)
	// The API server converts the object to its internal form, runs
	// admission on that, and converts it back to the version a webhook or
	// policy asked for; the round trip is not always the identity (a
	// StatefulSet's volumeClaimTemplates gain apiVersion and kind,
	// pkg/apis/apps/v1/conversion.go:149-165).
	internal, err := scheme.New(gvk.GroupKind().WithVersion(runtime.APIVersionInternal))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrInput, gvk, err)
	}
	if err := scheme.Convert(typed, internal, nil); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrInput, gvk, err)
	}
	back, err := scheme.New(gvk)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrInput, gvk, err)
	}
	if err := scheme.Convert(internal, back, nil); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrInput, gvk, err)
	}
	// Conversion leaves apiVersion and kind empty, as the server's
	// encoder would set them.
	back.GetObjectKind().SetGroupVersionKind(gvk)
	return back, nil
}

// admit runs the plugins on an object of resource pods, nodes,
// persistentvolumes or persistentvolumeclaims without subresource, the only
// requests they act on.
func admit(plugins []string, op string, r Request, obj, old runtime.Object) {
	if r.SubResource != "" || r.Resource.Group != "" {
		return
	}
	if node, ok := obj.(*corev1.Node); ok && r.Resource.Resource == "nodes" {
		if op == Create && slices.Contains(plugins, TaintNodesByCondition) {
			admitTaintNodesByCondition(node)
		}
		return
	}
	if r.Resource.Resource == "persistentvolumes" || r.Resource.Resource == "persistentvolumeclaims" {
		if op == Create && slices.Contains(plugins, StorageObjectInUseProtection) {
			admitStorageObjectInUseProtection(obj)
		}
		return
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok || r.Resource.Resource != "pods" {
		return
	}
	oldPod, _ := old.(*corev1.Pod)
	for _, p := range plugins {
		switch p {
		case ServiceAccount:
			if op == Create {
				admitServiceAccount(pod)
			}
		case Priority:
			admitPriority(op, pod, oldPod)
		case DefaultTolerationSeconds:
			if op == Create || op == Update {
				admitDefaultTolerationSeconds(pod)
			}
		}
	}
}

// Mutated returns obj, an object a mutating webhook produced, as the API
// server takes it back: decoded with its kind's defaults and through the
// internal version (k8s.io/apiserver v0.37.1
// pkg/admission/plugin/webhook/mutating/dispatcher.go:389 defaults the
// patched object). No admission plugin runs. An object of a group version
// Apply does not know is returned unchanged; errors wrap ErrInput.
func Mutated(gvk schema.GroupVersionKind, obj []byte) ([]byte, error) {
	typed, err := decode(gvk, obj)
	if err != nil || typed == nil {
		return obj, err
	}
	return encjson.Marshal(typed)
}

// Defaulter defaults, in place, an object a MutatingAdmissionPolicy
// produced, as the API server does after each policy's patch (k8s.io/
// apiserver v0.37.1 pkg/admission/plugin/policy/mutating/dispatcher.go:
// 263-274: converted to its typed form, then defaulted). celpolicy's
// engine hands it unstructured objects; one of a kind Apply does not know,
// or that does not convert to its type, is left as it is (the API server
// would refuse the latter when it decodes the result).
var Defaulter runtime.ObjectDefaulter = defaulter{}

type defaulter struct{}

func (defaulter) Default(obj runtime.Object) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		scheme.Default(obj)
		return
	}
	gvk := u.GroupVersionKind()
	if !scheme.Recognizes(gvk) {
		return
	}
	typed, err := scheme.New(gvk)
	if err != nil {
		return
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, typed); err != nil {
		return
	}
	scheme.Default(typed)
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(typed)
	if err != nil {
		return
	}
	u.Object = m
	u.SetGroupVersionKind(gvk)
}
