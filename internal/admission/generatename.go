package admission

import (
	"fmt"

	"k8s.io/apiserver/pkg/storage/names"

	"github.com/kadmit/kadmit/internal/jsonedit"
)

// GenerateName gives the object of a CREATE the name the API server gives
// it between mutating and validating admission, for the offline paths that
// run both (`kadmit review`, `kadmit test`). object is the JSON object as
// mutating admission left it. When its metadata.generateName is set and
// metadata.name is empty, GenerateName returns the object with
// metadata.name set to gen.GenerateName(generateName), only that member
// spliced in (the rest is kept byte for byte); otherwise object unchanged.
// name is the returned object's metadata.name ("" when it has none): the
// name validating admission is asked about when the request named none. A
// nil gen is names.SimpleNameGenerator, the API server's: generateName cut
// to 58 bytes plus 5 random lowercase alphanumerics. An error (metadata not
// an object, generateName or name not a string) names the field.
//
// The API server's order, k8s.io/apiserver v0.37.1:
//   - pkg/endpoints/handlers/create.go:151-153, 182: the request's name is
//     the object's as decoded, "" for a generateName object; 202-209:
//     mutating admission runs on it, then requestFunc calls the registry's
//     Create with rest.AdmissionToValidateObjectFunc (183-190);
//   - pkg/registry/generic/registry/store.go:552-555: Store.create sets
//     metadata.name to CreateStrategy.GenerateName(generateName) when
//     generateName is set and name is empty (the strategies of built-in
//     and custom resources embed names.SimpleNameGenerator,
//     pkg/storage/names/generate.go:49-54), before rest.BeforeCreate (569;
//     pkg/registry/rest/create.go:114-117 refuses an object still without
//     a name) and createValidation (store.go:574-578);
//   - pkg/registry/rest/create.go:223-230: that validation is validating
//     admission, its request's name, when the request had none, taken from
//     the object "in case the generated name is populated".
//
// So validating webhooks and ValidatingAdmissionPolicies see the generated
// name in request.name and object.metadata.name; mutating ones see none.
// Store.create also fills metadata.uid and creationTimestamp there
// (store.go:552, rest.FillObjectMetaSystemFields); offline paths leave
// those out. A generated name that exists already makes the API server
// retry with a new one (store.go:535-543); offline nothing conflicts.
func GenerateName(object []byte, gen names.NameGenerator) ([]byte, string, error) {
	doc := jsonedit.NewDoc(object)
	var generate, name string
	if _, err := doc.Decode(&generate, "metadata", "generateName"); err != nil {
		return nil, "", fmt.Errorf("metadata.generateName: %w", err)
	}
	if _, err := doc.Decode(&name, "metadata", "name"); err != nil {
		return nil, "", fmt.Errorf("metadata.name: %w", err)
	}
	if generate == "" || name != "" {
		return object, name, nil
	}
	if gen == nil {
		gen = names.SimpleNameGenerator
	}
	name = gen.GenerateName(generate)
	if err := doc.Set(name, "metadata", "name"); err != nil {
		return nil, "", fmt.Errorf("metadata.name: %w", err)
	}
	out, err := jsonedit.Apply(object, doc.Ops())
	if err != nil {
		return nil, "", fmt.Errorf("metadata.name: %w", err)
	}
	return out, name, nil
}
