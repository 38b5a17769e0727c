package nodeovercommit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"

	"gopkg.in/inf.v0"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/jsonedit"
	"github.com/kadmit/kadmit/internal/quantity"
)

// ParseOverride parses the value of the kadmit.io/overcommit-ratio annotation:
// a JSON object of resource name to decimal string, e.g.
// {"cpu":"1.5","memory":"1.2"}, each ratio in [1, maxRatio]. Errors read as
// the rest of a sentence starting with the annotation name, e.g. `ratio for
// "cpu" must be a decimal in [1, 4], got "0.5"`; ratio errors match
// ErrInvalidRatio. Resources are checked in name order so the error is
// stable.
func (p *Policy) ParseOverride(value string) (map[corev1.ResourceName]*inf.Dec, error) {
	var raw map[corev1.ResourceName]string
	if err := jsonedit.Unmarshal([]byte(value), &raw); err != nil || raw == nil {
		if err == nil {
			err = errors.New("got null")
		}
		return nil, fmt.Errorf(`must be a JSON object of resource name to decimal string like {"cpu":"1.5"}: %w`, err)
	}
	names := slices.Sorted(maps.Keys(raw))
	out := make(map[corev1.ResourceName]*inf.Dec, len(raw))
	for _, name := range names {
		if name == "" {
			return nil, errors.New("resource name must not be empty")
		}
		r, err := parseBoundedRatio(raw[name], p.cfg.MaxRatio, p.maxRatio)
		if err != nil {
			return nil, fmt.Errorf("ratio for %q %w", name, err)
		}
		out[name] = r
	}
	return out, nil
}

// Validate rejects (400) a node whose kadmit.io/overcommit-ratio annotation
// ParseOverride refuses, with a message like `annotation
// kadmit.io/overcommit-ratio: ratio for "cpu" must be a decimal in [1, 4],
// got "0.5"`, so the mistake surfaces to whoever wrote it rather than being
// silently ignored by the mutator. Nodes without the annotation are allowed.
// On UPDATE an invalid value that the old object already had is only warned
// about: rejecting it would block unrelated node updates (taints from the
// node controller, kubelet heartbeats) until someone fixes the annotation.
// Resources named by the annotation but not configured draw a warning.
//
// Quantities are range-checked with quantity.Parse before anything computes
// with them: an out-of-range or malformed quantity in status.allocatable,
// status.capacity or the kadmit.io/raw-allocatable annotation is a 400 naming
// the field, e.g. `node-overcommit: status.allocatable.cpu: quantity
// 1e9999999 is out of range (|value| must be below 9223372036854775807m)`;
// on UPDATE, when the old object carries the same problem, only a warning.
func (p *Policy) Validate(_ context.Context, req *admission.Request) admission.Verdict {
	var node nodeAnnotations
	if err := node.read(req.ObjectDoc()); err != nil {
		return admission.Invalid("%s: cannot parse the node: %v", Name, err)
	}
	var qwarn []string
	if qerr := node.quantityError(); qerr != nil {
		var old nodeAnnotations
		if req.Operation == admissionv1.Update && len(req.OldObject.Raw) > 0 &&
			old.read(jsonedit.NewDoc(req.OldObject.Raw)) == nil {
			if oerr := old.quantityError(); oerr != nil && oerr.Error() == qerr.Error() {
				qwarn = append(qwarn, fmt.Sprintf("%s (unchanged by this update)", qerr))
			}
		}
		if qwarn == nil {
			return admission.Invalid("%s: %v", Name, qerr)
		}
	}
	value, ok := node.Metadata.Annotations[AnnotationRatio]
	if !ok {
		return admission.Allow(qwarn...)
	}
	override, err := p.ParseOverride(value)
	if err != nil {
		if old, had := oldRatioAnnotation(req); had && old == value && req.Operation == admissionv1.Update {
			return admission.Allow(append(qwarn, fmt.Sprintf("annotation %s is ignored: %v", AnnotationRatio, err))...)
		}
		return admission.Invalid("annotation %s: %v", AnnotationRatio, err)
	}
	warnings := qwarn
	for _, name := range slices.Sorted(maps.Keys(override)) {
		if _, ok := p.ratios[name]; !ok {
			warnings = append(warnings, fmt.Sprintf("annotation %s: %q is not an overcommitted resource; ignored", AnnotationRatio, name))
		}
	}
	return admission.Allow(warnings...)
}

// oldRatioAnnotation returns the override annotation of the request's old
// object; ok is false when there is none or the old object cannot be read.
func oldRatioAnnotation(req *admission.Request) (value string, ok bool) {
	var old nodeAnnotations
	if len(req.OldObject.Raw) == 0 || old.read(jsonedit.NewDoc(req.OldObject.Raw)) != nil {
		return "", false
	}
	value, ok = old.Metadata.Annotations[AnnotationRatio]
	return value, ok
}

// nodeAnnotations is the part of a node Validate reads (see read); the
// status maps stay raw until quantityError parses them.
type nodeAnnotations struct {
	Metadata struct {
		Annotations map[string]string
	}
	Status struct {
		Capacity, Allocatable json.RawMessage
	}
}

// read fills n from the node doc through jsonedit, as the mutator's plan
// reads a node (member names matched as the API server matches them), so
// that Validate, on the new and the old object alike, and Mutate read a
// node the same way. The status lists stay raw; errors are the Doc's
// (naming the path).
func (n *nodeAnnotations) read(doc *jsonedit.Doc) error {
	if _, err := doc.Decode(&n.Metadata.Annotations, "metadata", "annotations"); err != nil {
		return err
	}
	for _, f := range []struct {
		dst   *json.RawMessage
		field string
	}{{&n.Status.Capacity, "capacity"}, {&n.Status.Allocatable, "allocatable"}} {
		raw, err := doc.Get("status", f.field)
		if err != nil {
			return err
		}
		*f.dst = raw
	}
	return nil
}

// quantityError returns the first quantity of status.capacity,
// status.allocatable (in that order, resources in name order) or the
// raw-values annotation that quantity.Parse refuses, naming its field; nil
// when all are in range. Other problems of the raw-values annotation are the
// mutator's warning, not a denial.
func (n *nodeAnnotations) quantityError() error {
	for _, f := range []struct {
		name string
		raw  json.RawMessage
	}{{"status.capacity", n.Status.Capacity}, {"status.allocatable", n.Status.Allocatable}} {
		if len(f.raw) == 0 {
			continue
		}
		if _, err := decodeList(f.raw); err != nil {
			return quantity.Prefix(f.name, err)
		}
	}
	if v, ok := n.Metadata.Annotations[AnnotationRaw]; ok {
		if _, err := parseRawValues(v); err != nil && errors.Is(err, quantity.ErrOutOfRange) {
			return err // "decode kadmit.io/raw-allocatable: allocatable.cpu: quantity ..."
		}
	}
	return nil
}
