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
