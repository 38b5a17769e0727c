package review

import (
	"fmt"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/apidefaults"
)

// applyDefaults replaces req's objects with what the API server hands the
// webhooks: decoded with the API's defaults and through the default-on
// mutating admission plugins (package apidefaults), for `kadmit review
// --defaults`. Errors wrap ErrInput.
func applyDefaults(doc Document, req *admission.Request) error {
	r := apidefaults.Request{
		Kind:        schema.GroupVersionKind{Group: req.Kind.Group, Version: req.Kind.Version, Kind: req.Kind.Kind},
		Resource:    schema.GroupVersionResource{Group: req.Resource.Group, Version: req.Resource.Version, Resource: req.Resource.Resource},
		SubResource: req.SubResource,
		Operation:   string(req.Operation),
		Object:      req.Object.Raw,
		OldObject:   req.OldObject.Raw,
	}
	obj, old, err := apidefaults.Apply(r)
	if err != nil {
		return fmt.Errorf("%w: %s: defaults: %w", ErrInput, doc, err)
	}
	req.Object.Raw, req.OldObject.Raw = obj, old
	return nil
}

// defaultMutated defaults the object a mutating webhook returned, as the
// API server does before the next webhook (package apidefaults, Mutated).
// kadmit serve's policies are webhooks to the API server, so their result
// is defaulted once per webhook, not per policy. Errors wrap ErrInput.
func defaultMutated(doc Document, req *admission.Request) error {
	gvk := schema.GroupVersionKind{Group: req.Kind.Group, Version: req.Kind.Version, Kind: req.Kind.Kind}
	obj, err := apidefaults.Mutated(gvk, req.Object.Raw)
	if err != nil {
		return fmt.Errorf("%w: %s: defaulting the mutated object: %w", ErrInput, doc, err)
	}
	req.Object.Raw = obj
	return nil
}
