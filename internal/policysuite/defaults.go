package policysuite

import (
	"github.com/kadmit/kadmit/internal/apidefaults"
	"github.com/kadmit/kadmit/internal/celpolicy"
)

// applyDefaults replaces req's objects with what the API server hands the
// policies: decoded with the API's defaults and through the default-on
// mutating admission plugins (package apidefaults), for a suite with
// defaults: true or `kadmit test --defaults`.
func applyDefaults(req *celpolicy.Request) error {
	obj, old, err := apidefaults.Apply(apidefaults.Request{
		Kind: req.Kind, Resource: req.Resource, SubResource: req.SubResource,
		Operation: string(req.Operation), Object: req.Object, OldObject: req.OldObject,
	})
	if err != nil {
		return err
	}
	req.Object, req.OldObject = obj, old
	return nil
}

// engineOptions defaults, for a suite with defaults, what each mutating
// policy produces, as the API server defaults a policy's patched object.
func engineOptions(s *Suite) celpolicy.Options {
	if s.Defaults {
		return celpolicy.Options{Defaulter: apidefaults.Defaulter}
	}
	return celpolicy.Options{}
}
