package admission

import (
	"bytes"
	"encoding/json"
	"fmt"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// optionsKinds is the options object the API server passes to admission per
// operation (k8s.io/apiserver v0.37.1 pkg/endpoints/handlers create.go,
// update.go, delete.go set these kinds on the decoded options; a patch
// passes UpdateOptions, or CreateOptions when it creates, patch.go). A
// CONNECT carries none (rest.go ConnectResource passes nil options and
// dryRun false).
var optionsKinds = map[admissionv1.Operation]string{
	admissionv1.Create: "CreateOptions",
	admissionv1.Update: "UpdateOptions",
	admissionv1.Delete: "DeleteOptions",
}

// RequestOptions returns the options object (JSON) and dry-run flag a
// request built offline (`kadmit test`, `kadmit review`) carries, as the
// API server builds them:
//
//   - the options' kind and apiVersion are always set (CreateOptions for
//     CREATE, UpdateOptions for UPDATE, DeleteOptions for DELETE,
//     meta.k8s.io/v1), so request.options is never null for these, as on a
//     real API server;
//   - raw, when given, holds that kind's fields, decoded strictly: a field
//     of another kind (gracePeriodSeconds on a CREATE), another kind or
//     apiVersion is an error naming the kind the operation carries;
//   - the API server's own checks on options (metav1 validation
//     ValidateCreateOptions etc., which refuse a request with 400 before
//     admission) are errors here too: dryRun other than ["All"], a
//     fieldManager with unprintable characters, an unknown
//     fieldValidation, ...;
//   - dryRun true sets the options' dryRun to ["All"] (what --dry-run=server
//     sends); options with dryRun ["All"] make the request a dry run, as the
//     API server derives one from the other (dryrun.IsDryRun);
//   - CONNECT refuses both options and dryRun.
func RequestOptions(op admissionv1.Operation, raw json.RawMessage, dryRun bool) ([]byte, bool, error) {
	given := len(bytes.TrimSpace(raw)) > 0 && string(bytes.TrimSpace(raw)) != "null"
	kind, ok := optionsKinds[op]
	if !ok {
		if given || dryRun {
			return nil, false, fmt.Errorf("%s requests carry no options and are never dry runs (the API server passes neither to admission): drop options and dryRun", op)
		}
		return nil, false, nil
	}
	if given {
		var head struct {
			Kind       string `json:"kind"`
			APIVersion string `json:"apiVersion"`
		}
		if err := json.Unmarshal(raw, &head); err != nil {
			return nil, false, fmt.Errorf("options: must be an object of %s fields: %w", kind, err)
		}
		if head.Kind != "" && head.Kind != kind {
			return nil, false, fmt.Errorf("options: kind %s: a %s request carries %s", head.Kind, op, kind)
		}
		if head.APIVersion != "" && head.APIVersion != metav1.SchemeGroupVersion.String() {
			return nil, false, fmt.Errorf("options: apiVersion %s: options are %s", head.APIVersion, metav1.SchemeGroupVersion)
		}
	}
	var (
		obj  any
		errs field.ErrorList
		dry  *[]string
	)
	switch op {
	case admissionv1.Create:
		o := &metav1.CreateOptions{}
		obj, dry = o, &o.DryRun
	case admissionv1.Update:
		o := &metav1.UpdateOptions{}
		obj, dry = o, &o.DryRun
	case admissionv1.Delete:
		o := &metav1.DeleteOptions{}
		obj, dry = o, &o.DryRun
	}
	if given {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(obj); err != nil {
			return nil, false, fmt.Errorf("options: a %s request carries %s (fields %s): %w", op, kind, optionFields(obj), err)
		}
	}
	if dryRun && len(*dry) == 0 {
		*dry = []string{metav1.DryRunAll}
	}
	switch o := obj.(type) {
	case *metav1.CreateOptions:
		o.SetGroupVersionKind(metav1.SchemeGroupVersion.WithKind(kind))
		errs = metav1validation.ValidateCreateOptions(o)
	case *metav1.UpdateOptions:
		o.SetGroupVersionKind(metav1.SchemeGroupVersion.WithKind(kind))
		errs = metav1validation.ValidateUpdateOptions(o)
	case *metav1.DeleteOptions:
		o.SetGroupVersionKind(metav1.SchemeGroupVersion.WithKind(kind))
		errs = metav1validation.ValidateDeleteOptions(o)
	}
	if len(errs) > 0 {
		return nil, false, fmt.Errorf("options: the API server refuses these %s before admission: %w", kind, errs.ToAggregate())
	}
	out, err := json.Marshal(obj)
	if err != nil {
		return nil, false, fmt.Errorf("options: %w", err)
	}
	return out, len(*dry) > 0, nil
}

// optionFields lists the JSON fields of an options type (metav1, v0.37.1),
// for the error when a test gives a field of another kind.
func optionFields(obj any) string {
	if _, ok := obj.(*metav1.DeleteOptions); ok {
		return "dryRun, gracePeriodSeconds, preconditions, orphanDependents, propagationPolicy, ignoreStoreReadErrorWithClusterBreakingPotential"
	}
	return "dryRun, fieldManager, fieldValidation"
}
